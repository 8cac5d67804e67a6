package connection

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// Every (connection, namespace) pair has a token Secret of its own: a VaultConnection whose name
// holds a dot never reads another's, and long names stay distinct and valid.
func TestTokenStoreNamesCannotCollide(t *testing.T) {
	long := strings.Repeat("a", 240)
	pairs := []struct{ conn, ns string }{
		{"vault", "team-a"},
		{"vault.team-a", ""},
		{"vault", ""},
		{"vault.team", "a"},
		{"vault", "team.a"},
		{"vault-team-a", ""},
		{long, ""},
		{long, "team-a"},
		{long, "team-b"},
		{long + ".team-a", ""},
		{long[:200], strings.Repeat("b", 63)},
		{long[:200] + "." + strings.Repeat("b", 30), ""},
		{strings.Repeat("c", 253), ""},
		{strings.Repeat("c", 253), strings.Repeat("d", 63)},
		{strings.Repeat("c", 252), "d"},
	}
	seen := map[string]string{}
	for _, p := range pairs {
		name := TokenSecretName(p.conn, p.ns)
		pair := p.conn + " / " + p.ns
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("%s: %q is no Secret name: %v", pair, name, errs)
		}
		if other, ok := seen[name]; ok {
			t.Errorf("%s and %s share the token Secret %q", other, pair, name)
		}
		seen[name] = pair
	}
}

const tokenNS = "keyroll-system"

func storeConnection(name, uid string) *v1beta1.VaultConnection {
	return &v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}}
}

func fakeSecrets(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

// tokenSecret is a Secret in the operator's namespace, owned by owner (nil: by none).
func tokenSecret(name string, owner *v1beta1.VaultConnection, annotations, data map[string]string) *corev1.Secret {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tokenNS, Name: name, Annotations: annotations},
		Data: map[string][]byte{}}
	if owner != nil {
		sec.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1beta1.GroupVersion.String(),
			Kind: "VaultConnection", Name: owner.Name, UID: owner.UID}}
	}
	for k, v := range data {
		sec.Data[k] = []byte(v)
	}
	return sec
}

// secretData is the data of a Secret of the operator's namespace; nil when there is none.
func secretData(t *testing.T, c client.Client, name string) map[string]string {
	t.Helper()
	sec := &corev1.Secret{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: tokenNS, Name: name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range sec.Data {
		out[k] = string(v)
	}
	return out
}

// A Secret at the store's name that is not the store's own is refused: Load errs (naming the
// Secret, never a token) and Save writes nothing into it.
func TestTokenStoreRefusesASecretOfAnotherConnection(t *testing.T) {
	vc, other := storeConnection("vault", "uid-vault"), storeConnection("vault.team-a", "uid-other")
	name := TokenSecretName("vault", "team-a")
	ours := map[string]string{v1beta1.LabelVaultConnection: "vault", v1beta1.AnnotationVaultNamespaceIdentity: "team-a"}
	cases := map[string]*corev1.Secret{
		"another connection owns it": tokenSecret(name, other, ours, nil),
		"no owner":                   tokenSecret(name, nil, ours, nil),
		"another namespace's": tokenSecret(name, vc, map[string]string{v1beta1.LabelVaultConnection: "vault",
			v1beta1.AnnotationVaultNamespaceIdentity: "team-b"}, nil),
		"the connection's own": tokenSecret(name, vc, map[string]string{v1beta1.LabelVaultConnection: "vault",
			v1beta1.AnnotationVaultNamespaceIdentity: ""}, nil),
		"no namespace annotation":      tokenSecret(name, vc, map[string]string{v1beta1.LabelVaultConnection: "vault"}, nil),
		"another connection annotated": tokenSecret(name, vc, map[string]string{v1beta1.LabelVaultConnection: "vault.team-a", v1beta1.AnnotationVaultNamespaceIdentity: "team-a"}, nil),
	}
	for tc, sec := range cases {
		t.Run(tc, func(t *testing.T) {
			sec.Data = map[string][]byte{"acc-foreign": []byte("s.foreign-token")}
			c := fakeSecrets(t, sec)
			s := newTokenStore(c, c, tokenNS, vc, "team-a")
			got, err := s.Load(context.Background())
			if err == nil || got != nil {
				t.Fatalf("Load = %v, %v; want a refusal", got, err)
			}
			if !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "s.foreign-token") {
				t.Errorf("refusal %q: want the Secret's name and no token", err)
			}
			err = s.Save(context.Background(), map[string]string{"acc-new": "s.new-token"}, []string{"acc-foreign"})
			if err == nil || strings.Contains(err.Error(), "s.new-token") || strings.Contains(err.Error(), "s.foreign-token") {
				t.Errorf("Save = %v; want a refusal without a token", err)
			}
			if d := secretData(t, c, name); len(d) != 1 || d["acc-foreign"] != "s.foreign-token" {
				t.Errorf("the Secret was written into: %v", d)
			}
		})
	}
}

// The store creates its Secret owned by the connection and annotated with the connection and the
// namespace (never a token), adds and drops tokens in it, and a connection whose name reads like
// this pair's keeps its tokens apart.
func TestTokenStoreKeepsTokensInItsOwnSecret(t *testing.T) {
	ctx := context.Background()
	vc := storeConnection("vault", "uid-vault")
	c := fakeSecrets(t)
	s := newTokenStore(c, c, tokenNS, vc, "team-a")
	if err := s.Save(ctx, nil, []string{"acc-0"}); err != nil || secretData(t, c, s.key.Name) != nil {
		t.Fatalf("dropping from no Secret: %v, Secret %v", err, secretData(t, c, s.key.Name))
	}
	if err := s.Save(ctx, map[string]string{"acc-1": "s.token-1"}, nil); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, s.key, sec); err != nil {
		t.Fatal(err)
	}
	if !ownedBy(sec, vc.UID) || sec.Annotations[v1beta1.LabelVaultConnection] != "vault" ||
		sec.Annotations[v1beta1.AnnotationVaultNamespaceIdentity] != "team-a" || sec.Labels[v1beta1.LabelManagedBy] != v1beta1.ManagedByValue {
		t.Errorf("Secret's owner %v, labels %v, annotations %v", sec.OwnerReferences, sec.Labels, sec.Annotations)
	}
	if err := s.Save(ctx, map[string]string{"acc-2": "s.token-2"}, []string{"acc-1"}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load(ctx); err != nil || len(got) != 1 || got["acc-2"] != "s.token-2" {
		t.Errorf("Load = %v, %v; want acc-2 alone", got, err)
	}
	dotted := newTokenStore(c, c, tokenNS, storeConnection("vault.team-a", "uid-other"), "")
	if got, err := dotted.Load(ctx); err != nil || len(got) != 0 {
		t.Errorf("connection vault.team-a loads %v, %v; want nothing of vault's team-a", got, err)
	}
}

// Save's patch carries the uid of the Secret it checked: should the Secret be replaced in between,
// the API server refuses the patch (a uid cannot change) rather than writing into the new one.
func TestTokenStorePatchesOnlyTheSecretItChecked(t *testing.T) {
	vc := storeConnection("vault", "uid-vault")
	sec := tokenSecret(TokenSecretName("vault", ""), vc, map[string]string{v1beta1.LabelVaultConnection: "vault",
		v1beta1.AnnotationVaultNamespaceIdentity: ""}, nil)
	sec.UID = "uid-secret"
	var patches []string
	c := fake.NewClientBuilder().WithScheme(fakeSecrets(t).Scheme()).WithObjects(sec).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			body, _ := p.Data(obj)
			patches = append(patches, string(body))
			return c.Patch(ctx, obj, p, opts...)
		}}).Build()
	if err := newTokenStore(c, c, tokenNS, vc, "").Save(context.Background(), map[string]string{"acc-1": "s.token-1"}, nil); err != nil {
		t.Fatal(err)
	}
	if len(patches) != 1 || !strings.Contains(patches[0], `"uid":"uid-secret"`) {
		t.Errorf("patches %q, want one naming uid-secret", patches)
	}
}
