package connection

import (
	"context"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/vault"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

// configs records the configuration of every client handed out, by cache key.
type configs map[string]vault.Config

func (c configs) Get(name string, cfg vault.Config) (Client, error) {
	c[name] = cfg
	return vaulttest.New(nil), nil
}

func (c configs) Forget(name string) { delete(c, name) }

// With identity Namespace each namespace gets a client of its own: its role (with {namespace}
// replaced), its service account, its token Secret, and the connection's one rate limiter; the
// connection's own client never logs in. With identity Operator every namespace shares the
// connection's client. Forget drops them all.
func TestNamespaceIdentityGivesEachNamespaceItsOwnLogin(t *testing.T) {
	ctx := context.Background()
	got := configs{}
	tokens := k8sfake.NewClientset()
	tokens.PrependReactor("create", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{Token: "a-jwt"}}, nil
	})
	// The API server does not accept the token: it is for Vault's audience.
	tokens.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authenticationv1.TokenReview{}, nil
	})
	c := &Connector{Tokens: tokens, ServiceAccount: types.NamespacedName{Namespace: "keyroll-system", Name: "keyroll-manager"},
		Clients: got}
	vc := &v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault"}, Spec: v1beta1.VaultConnectionSpec{
		Address: "https://vault.example:8200", Identity: v1beta1.IdentityNamespace,
		RateLimit: &v1beta1.VaultRateLimit{QPS: 5, Burst: 10},
		Auth:      v1beta1.VaultAuth{Kubernetes: &v1beta1.KubernetesAuth{Mount: "kubernetes", Role: "{namespace}", ServiceAccountName: "keyroll-vault"}},
	}}
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := c.NamespaceClient(ctx, vc, ns); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client(ctx, vc); err != nil {
		t.Fatal(err)
	}
	a, b, own := got["vault/team-a"], got["vault/team-b"], got["vault"]
	if a.Auth.Kubernetes == nil || a.Auth.Kubernetes.Role != "team-a" || b.Auth.Kubernetes.Role != "team-b" {
		t.Fatalf("namespace clients' roles: %+v, %+v", a.Auth.Kubernetes, b.Auth.Kubernetes)
	}
	if a.Limiter == nil || a.Limiter != b.Limiter || a.Limiter.Burst() != 10 {
		t.Errorf("the namespaces do not share the connection's rate limiter (burst 10)")
	}
	if _, err := own.Auth.Kubernetes.JWT(ctx); err == nil || !strings.Contains(err.Error(), "never logs in") {
		t.Errorf("the connection's own client would log in: %v", err)
	}
	for _, cfg := range []vault.Config{own, a, b} {
		if _, err := vault.New(cfg); err != nil {
			t.Errorf("a client of the connection cannot be made: %v", err)
		}
	}
	if _, err := a.Auth.Kubernetes.JWT(ctx); err != nil {
		t.Errorf("team-a's token source: %v", err)
	}
	if tr := requestedTokens(c); len(tr) != 1 || tr[0] != "team-a/keyroll-vault" {
		t.Errorf("tokens requested for %v, want team-a's keyroll-vault alone", tr)
	}
	if n := TokenSecretName("vault", "team-a"); !strings.HasPrefix(n, "keyroll-tokens-vault.team-a-") {
		t.Errorf("team-a's token Secret %q", n)
	}

	c.Forget("vault")
	if len(got) != 0 {
		t.Errorf("clients left after Forget: %v", got)
	}
	vc.Spec.Identity = v1beta1.IdentityOperator
	vc.Spec.Auth.Kubernetes.Role = "keyroll"
	if _, err := c.NamespaceClient(ctx, vc, "team-a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := got["vault"]; !ok || len(got) != 1 {
		t.Errorf("identity Operator: clients %v, want the connection's alone", got)
	}
}

// requestedTokens lists the service accounts (namespace/name) tokens were requested for.
func requestedTokens(c *Connector) []string {
	var out []string
	for _, a := range c.Tokens.(*k8sfake.Clientset).Actions() {
		if a.GetSubresource() == "token" {
			if create, ok := a.(k8stesting.CreateActionImpl); ok {
				out = append(out, a.GetNamespace()+"/"+create.Name)
			}
		}
	}
	return out
}
