package connection

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/vault"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

func guardedConnection(namespaces, paths []string) *v1beta1.VaultConnection {
	return &v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault"},
		Spec: v1beta1.VaultConnectionSpec{AllowedNamespaces: namespaces, AllowedPaths: paths}}
}

func TestAllowedPathsMatchOnlyTheNamespacesOwn(t *testing.T) {
	vc := guardedConnection([]string{"*"}, []string{"database/creds/{namespace}", "database/creds/{namespace}.*", "shared/creds/common"})
	cases := []struct {
		ns, path string
		want     bool
	}{
		{"a", "database/creds/a", true},
		{"a", "database/creds/a.orders", true},
		{"a", "database/creds/a.orders/more", true},
		{"a", "shared/creds/common", true},
		{"a", "database/creds/b", false},
		{"a", "database/creds/a-b", false},          // namespace a-b's role, not a's
		{"a-b", "database/creds/a", false},          // and the other way round
		{"a", "database/creds/ab.orders", false},    // namespace ab's
		{"a", "database/creds/a.x/../../b", false},  // no way out by ..
		{"a", "database/creds/a.x//y", false},       // nor by an empty segment
		{"a", "database/creds/a/", false},           // a trailing slash is an empty segment
		{"", "database/creds/", false},              // no namespace, nothing
		{"a", "shared/creds/common/extra", false},   // an exact entry is exact
		{"a", "DATABASE/creds/a", false},            // Vault paths are case-sensitive; so is the match
		{"default", "database/creds/default", true}, // a plain name
	}
	for _, c := range cases {
		if got := vc.AllowsPath(c.ns, c.path); got != c.want {
			t.Errorf("AllowsPath(%q, %q) = %v, want %v", c.ns, c.path, got, c.want)
		}
	}
	leases := []struct {
		ns, id string
		want   bool
	}{
		{"a", "database/creds/a/x7Hq", true},
		{"a", "database/creds/a.orders/x7Hq", true},
		{"a", "database/creds/b/x7Hq", false},
		{"a", "database/creds/a", false}, // the path itself is no lease
		{"a", "database/creds/a/", false},
		{"a", "database/creds/a/../b/x7Hq", false},
		{"a", "x7Hq", false},
	}
	for _, c := range leases {
		if got := vc.AllowsLease(c.ns, c.id); got != c.want {
			t.Errorf("AllowsLease(%q, %q) = %v, want %v", c.ns, c.id, got, c.want)
		}
	}
	if none := guardedConnection([]string{"*"}, nil); none.AllowsPath("a", "database/creds/a") {
		t.Error("a connection without allowedPaths allows a path")
	}
}

// The guard refuses, without a Vault call, what the namespace may not do, and passes the rest on.
func TestGuardRefusesWithoutCallingVault(t *testing.T) {
	ctx := context.Background()
	fake := vaulttest.New(nil)
	own, err := fake.Issue(ctx, "database/creds/a")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := fake.Issue(ctx, "database/creds/b")
	if err != nil {
		t.Fatal(err)
	}
	calls := func() int {
		return fake.Calls("issue") + fake.Calls("renew") + fake.Calls("lookup") + fake.Calls("revoke") + fake.Calls("list-leases")
	}
	before := calls()
	refused := func(what string, err error) {
		t.Helper()
		if !vault.IsRefused(err) {
			t.Errorf("%s: want a refusal, got %v", what, err)
		}
	}

	a := ForNamespace(fake, guardedConnection([]string{"a"}, []string{"database/creds/{namespace}"}), "a")
	_, err = a.Issue(ctx, "database/creds/b")
	refused("issue from another namespace's path", err)
	_, err = a.Renew(ctx, foreign.ID, 0)
	refused("renew of another namespace's lease", err)
	_, err = a.Lookup(ctx, foreign.ID)
	refused("lookup of another namespace's lease", err)
	refused("revoke of another namespace's lease", a.Revoke(ctx, foreign.ID))
	_, err = a.ListLeases(ctx, "database/creds/b")
	refused("sweep of another namespace's path", err)

	// A namespace the connection no longer allows: no issue, renewal or lookup; its own leases
	// may still be revoked.
	gone := ForNamespace(fake, guardedConnection([]string{"other"}, []string{"database/creds/{namespace}"}), "a")
	_, err = gone.Issue(ctx, "database/creds/a")
	refused("issue in a namespace no longer allowed", err)
	_, err = gone.Renew(ctx, own.ID, 0)
	refused("renew in a namespace no longer allowed", err)
	_, err = gone.Lookup(ctx, own.ID)
	refused("lookup in a namespace no longer allowed", err)
	if n := calls(); n != before {
		t.Fatalf("refused requests reached Vault: %d calls", n-before)
	}
	if err := gone.Revoke(ctx, own.ID); err != nil {
		t.Fatalf("revoking the namespace's own lease: %v", err)
	}
	if _, err := a.Issue(ctx, "database/creds/a"); err != nil {
		t.Fatalf("issue from the namespace's own path: %v", err)
	}
	if fake.Calls("revoke") != 1 || fake.Calls("issue") != 3 {
		t.Fatalf("allowed requests: %d revocations, %d issues", fake.Calls("revoke"), fake.Calls("issue"))
	}
}
