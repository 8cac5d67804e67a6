package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/stoppoint"
	"github.com/keyroll/keyroll/test/framework"
)

// secondInstall is the label that the second install's manager selects (--watch-selector): it
// sees its own RedisCluster and VaultConnection only, and the package's operators never see them.
const secondInstall = "test.keyroll.dev/install"

// TestSweepRevokesOnlyWhatThisInstallIssued: on one Vault role, a lease obtained by hand, a lease
// of a second keyroll install (its own namespace, VaultConnection and manager), and a lease this
// install issued and lost (SIGKILL after the issue, before the ledger write). The sweep, with
// action Revoke, revokes the lost lease alone, which matches the intent this install recorded
// before the issue; it reports the other two as not its own, and they stay live.
func TestSweepRevokesOnlyWhatThisInstallIssued(t *testing.T) {
	ctx := context.Background()
	r := newRow(t, 15, "a lease on keyroll's role that another install or a person obtained, beside a lost one",
		"the sweep (Revoke) revokes the lost lease, which matches this install's intent, and leaves the others live, reported")
	base := "f-intents"
	path := fw.Path(base)
	ns, other := fw.Namespace(t, base), fw.Namespace(t, base+"-two")

	byHand := fw.Ground.Vault.Root.Logical()
	s, err := byHand.ReadWithContext(ctx, path)
	if err != nil || s == nil || s.LeaseID == "" {
		t.Fatalf("reading %s by hand: %v", path, err)
	}
	handLease := s.LeaseID
	t.Cleanup(func() { _ = fw.Ground.Vault.Root.Sys().Revoke(handLease) })

	// The second install: its manager in its own namespace (leader election, tokens, intents
	// there), logging in with a Vault token of the operator's policy, on the same role.
	tok, err := fw.Ground.Vault.Root.Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{fw.OperatorRole}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	fw.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "vault-token"},
		Data: map[string][]byte{"token": []byte(tok.Auth.ClientToken)}})
	labels := map[string]string{secondInstall: "two"}
	vc2 := &v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: fw.Name(base + "-two"), Labels: labels},
		Spec: v1beta1.VaultConnectionSpec{Address: fw.Ground.Vault.Addr, AllowedNamespaces: []string{other}, AllowedPaths: []string{path},
			Auth:         v1beta1.VaultAuth{Token: &v1beta1.TokenAuth{SecretRef: v1beta1.SecretKeyReference{Namespace: other, Name: "vault-token", Key: "token"}}},
			OrphanLeases: &v1beta1.OrphanLeases{Action: v1beta1.OrphanLeasesOff}}}
	rc2 := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "orders", Labels: labels},
		Spec: v1beta1.RedisClusterSpec{Replicas: 1, Version: framework.RedisVersion, Credentials: v1beta1.CredentialsSpec{
			Source: v1beta1.SourceVaultLease, VaultLease: &v1beta1.VaultLeaseSource{ConnectionRef: v1beta1.ConnectionReference{Name: vc2.Name}, Path: path}}}}
	for _, o := range []*v1beta1.VaultConnection{vc2} {
		if err := fw.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fw.Client.Delete(context.Background(), o) })
	}
	if err := fw.Client.Create(ctx, rc2); err != nil {
		t.Fatal(err)
	}
	p2, err := fw.StartProcess(operatorBin, framework.ProcessOptions{
		Args: []string{"--watch-selector=" + secondInstall + "=two", "--leader-election-namespace=" + other, "--service-account-namespace=" + other},
		Line: func(l string) { logs.add("install-two", l) },
	})
	if err != nil {
		t.Fatal(err)
	}
	second := &operator{name: "install-two", Process: p2}
	t.Cleanup(second.Kill)
	installTwoLease := waitSettled(t, rc2, "", settleTimeout).Status.Credential.Lease.LeaseID

	// This install: killed after Vault issued the first lease, before the ledger write.
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	w := watchLeases(t, path)
	rc, lost, swept := loseAndSweep(t, ns, vc.Name, path, w, handLease, installTwoLease)
	// Two more sweeps: the others are old enough to count, and stay.
	after := time.Now()
	framework.Eventually(t, time.Minute, func() string {
		st := fw.GetConnection(t, vc.Name).Status.OrphanLeases
		if st == nil || st.LastSweepAt == nil || st.LastSweepAt.Time.Before(after.Add(11*time.Second)) {
			return fmt.Sprintf("no sweep 11 s after the lost lease went: %+v", st)
		}
		return ""
	})
	for what, id := range map[string]string{"the lease obtained by hand": handLease, "the second install's lease": installTwoLease} {
		if ok, _ := fw.LeaseExists(id); !ok {
			t.Errorf("%s (%s) was revoked", what, id)
		}
	}
	st := fw.GetConnection(t, vc.Name).Status.OrphanLeases
	if st.Foreign != 2 || !slices.Contains(st.Orphans, handLease) || !slices.Contains(st.Orphans, installTwoLease) || st.Revoked != 1 {
		t.Errorf("the sweep's status %+v: want the two leases reported as not this install's, and one revoked", st)
	}
	notes := strings.Join(framework.Notes(fw.Events(t, "", "", vc.Name)), "\n")
	if n := framework.CountLines(notes, v1beta1.EventOrphanLeaseRevoked, lost); n != 1 {
		t.Errorf("%d %s events name the lost lease, want 1", n, v1beta1.EventOrphanLeaseRevoked)
	}
	for _, id := range []string{handLease, installTwoLease} {
		if n := framework.CountLines(notes, v1beta1.EventOrphanLeaseRevoked, id); n != 0 {
			t.Errorf("an event says %s was revoked", id)
		}
	}
	checkLeasesUnder(t, rc, path, handLease, installTwoLease)

	// The second install deletes its cluster (revoking its lease); the lease obtained by hand
	// goes by hand.
	fw.DeleteAndWait(t, rc2, settleTimeout)
	if err := fw.Ground.Vault.Root.Sys().RevokeWithContext(ctx, handLease); err != nil {
		t.Fatal(err)
	}
	r.measured = fmt.Sprintf("the lost lease revoked by the sweep %s after the kill (grace 10 s, interval 10 s); the lease obtained by hand and the second install's lease live after two more sweeps, reported as not this install's (status foreign %d)",
		swept, st.Foreign)
}

// checkLeasesUnder: Vault holds, under path, the cluster's ledger lease and the others named, and
// nothing else.
func checkLeasesUnder(t *testing.T, rc *v1beta1.RedisCluster, path string, others ...string) {
	t.Helper()
	want := append(ledger(fw.Get(t, rc)), others...)
	slices.Sort(want)
	if live := fw.VaultLeases(t, path); !slices.Equal(live, want) {
		t.Errorf("Vault holds %v under %s, want %v", live, path, want)
	}
}

// TestSweepWithNamespaceIdentity is the sweep of a VaultConnection with identity Namespace: the
// namespace's own login (its Vault role and policy, which may list its leases) lists the leases
// under its paths and revokes the one this install lost, and leaves alone one obtained by hand.
func TestSweepWithNamespaceIdentity(t *testing.T) {
	ctx := context.Background()
	r := newRow(t, 16, "SIGKILL after issue, with a login per namespace (identity Namespace)",
		"the sweep, through the namespace's own login, revokes the lost lease and leaves one obtained by hand live")
	base := "f-nsid"
	ns := fw.Namespace(t, base)
	path := fw.Path(base + ".orders")
	fw.NamespaceIdentity(t, ns)
	s, err := fw.Ground.Vault.Root.Logical().ReadWithContext(ctx, path)
	if err != nil || s == nil || s.LeaseID == "" {
		t.Fatalf("reading %s by hand: %v", path, err)
	}
	handLease := s.LeaseID
	vc := fw.VaultConnection(t, base, framework.Allow(ns), framework.Paths("database/creds/{namespace}.*"),
		framework.NamespaceIdentityOption, sweep(v1beta1.OrphanLeasesRevoke))
	w := watchLeases(t, path)
	rc, _, swept := loseAndSweep(t, ns, vc.Name, path, w, handLease)
	if ok, _ := fw.LeaseExists(handLease); !ok {
		t.Error("the lease obtained by hand was revoked")
	}
	// The status is written after the revocation: wait for it.
	framework.Eventually(t, 30*time.Second, func() string {
		if st := fw.GetConnection(t, vc.Name).Status.OrphanLeases; st == nil || st.Revoked != 1 || st.Foreign != 1 || st.Error != "" {
			return fmt.Sprintf("the sweep's status %+v: want one revoked, the lease obtained by hand reported, no error", st)
		}
		return ""
	})
	checkLeasesUnder(t, rc, path, handLease)
	if err := fw.Ground.Vault.Root.Sys().RevokeWithContext(ctx, handLease); err != nil {
		t.Fatal(err)
	}
	r.measured = fmt.Sprintf("the lost lease revoked %s after the kill through the namespace's own login; the lease obtained by hand left live", swept)
}

// loseAndSweep starts an operator for namespace ns that is killed (SIGKILL) after Vault issued
// the first lease of a new RedisCluster on path and before its ledger write, then another, and
// waits until the connection's sweep has revoked the lost lease (the one the watch saw that is
// not among others). It returns the cluster, the lost lease and how long after the kill it went.
func loseAndSweep(t *testing.T, ns, connection, path string, w *leaseWatch, others ...string) (*v1beta1.RedisCluster, string, time.Duration) {
	t.Helper()
	op := startOperator(t, ns+"-1", stoppoint.AfterIssue, ns)
	rc := fw.RedisCluster(t, ns, "orders", connection, path)
	op.waitStop(t, stoppoint.AfterIssue, settleTimeout)
	killed := time.Now()
	var lost []string
	for _, id := range w.issued() {
		if !slices.Contains(others, id) {
			lost = append(lost, id)
		}
	}
	if len(lost) != 1 {
		t.Fatalf("Vault issued %v before the stop point, want one lease of this install", lost)
	}
	startOperator(t, ns+"-2", "", ns)
	waitSettled(t, rc, "", settleTimeout)
	framework.Eventually(t, time.Minute, func() string {
		if live := fw.VaultLeases(t, path); slices.Contains(live, lost[0]) {
			return fmt.Sprintf("the lost lease %s is still live; the sweep's status: %+v", lost[0], fw.GetConnection(t, connection).Status.OrphanLeases)
		}
		return ""
	})
	return rc, lost[0], time.Since(killed).Round(time.Second)
}
