package rediscluster

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

// Defect (issue 17): with connectionRef changed on a live cluster, renewals and revocations went
// to the new Vault, which knows none of the old leases: "lease not found" counted as gone, and the
// old Vault's leases left the ledger unrevoked. Now a credential from the new connection replaces
// the current one and is rolled out, and the old lease is revoked through the connection it came
// from.
func TestConnectionChangeIssuesFromTheNewAndRevokesThroughTheOld(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	old := rc.Status.Credential
	if len(h.vault.Leases()) != 1 {
		t.Fatalf("leases in the first Vault %v", h.vault.Leases())
	}
	other := vaulttest.New(h.clock)
	other.LeaseDuration = 10 * time.Minute
	h.vaults.by["vault-b"] = other
	vc := &v1alpha1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault-b"}, Spec: v1alpha1.VaultConnectionSpec{
		Address: "https://vault-b.example:8200", AllowedNamespaces: []string{"*"},
		Auth: v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Mount: "kubernetes", Role: "keyroll", Audiences: []string{"vault"}}},
	}}
	if err := h.k8s.Create(context.Background(), vc); err != nil {
		t.Fatal(err)
	}
	h.eventReasons()

	rc.Spec.Credentials.VaultLease.ConnectionRef.Name = "vault-b"
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)

	cur := rc.Status.Credential
	if cur.Version == old.Version || len(other.Leases()) != 1 || cur.LeaseID != other.Leases()[0] {
		t.Fatalf("credential %s (lease %s), leases in the new Vault %v: want a new credential from it", cur.Version, cur.LeaseID, other.Leases())
	}
	if got := h.vault.Leases(); len(got) != 0 || h.vault.Calls(vaulttest.OpRevoke) != 1 {
		t.Errorf("the old Vault has leases %v after %d revocations: want the old lease revoked there", got, h.vault.Calls(vaulttest.OpRevoke))
	}
	if other.Calls(vaulttest.OpRevoke) != 0 || other.Calls(vaulttest.OpRenew) != 0 {
		t.Errorf("the new Vault was asked to revoke %d or renew %d leases it never issued", other.Calls(vaulttest.OpRevoke), other.Calls(vaulttest.OpRenew))
	}
	if len(rc.Status.Leases) != 1 || rc.Status.Leases[0].Connection != "vault-b" {
		t.Errorf("ledger %+v, want the new lease only, through vault-b", rc.Status.Leases)
	}
	if reasons := h.eventReasons(); slices.Contains(reasons, v1alpha1.EventLeaseRevokedOutside) || !slices.Contains(reasons, v1alpha1.EventLeaseRevoked) {
		t.Errorf("events %v: want the old lease revoked, not taken for revoked outside keyroll", reasons)
	}
	if cur.Path != "database/creds/orders" {
		t.Errorf("credential path %q", cur.Path)
	}
}

// A change of vaultLease.path replaces the credential with one from the new path, rolled out,
// and the old lease is revoked.
func TestPathChangeIssuesFromTheNewPath(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	old := rc.Status.Credential
	rc.Spec.Credentials.VaultLease.Path = "database/creds/orders-v2"
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	cur := rc.Status.Credential
	if cur.Version == old.Version || cur.Path != "database/creds/orders-v2" {
		t.Fatalf("credential %s from %q: want a new one from the new path", cur.Version, cur.Path)
	}
	if got := h.vault.Leases(); len(got) != 1 || got[0] != cur.LeaseID {
		t.Errorf("leases in Vault %v, want the new one only", got)
	}
	if h.staged(t).Username != cur.Username {
		t.Error("the new credential is not the staged one")
	}
}
