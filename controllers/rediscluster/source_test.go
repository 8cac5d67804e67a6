package rediscluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/vault"
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
	vc := &v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault-b"}, Spec: v1beta1.VaultConnectionSpec{
		Address: "https://vault-b.example:8200", AllowedNamespaces: []string{"*"}, AllowedPaths: []string{"database/creds/*"},
		Auth: v1beta1.VaultAuth{Kubernetes: &v1beta1.KubernetesAuth{Mount: "kubernetes", Role: "keyroll", Audiences: []string{"vault"}}},
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
	if cur.Version == old.Version || len(other.Leases()) != 1 || cur.Lease.LeaseID != other.Leases()[0] {
		t.Fatalf("credential %s (lease %s), leases in the new Vault %v: want a new credential from it", cur.Version, cur.Lease.LeaseID, other.Leases())
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
	if reasons := h.eventReasons(); slices.Contains(reasons, v1beta1.EventLeaseRevokedOutside) || !slices.Contains(reasons, v1beta1.EventLeaseRevoked) {
		t.Errorf("events %v: want the old lease revoked, not taken for revoked outside keyroll", reasons)
	}
	if cur.VaultLease.Path != "database/creds/orders" {
		t.Errorf("credential path %q", cur.VaultLease.Path)
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
	if cur.Version == old.Version || cur.VaultLease.Path != "database/creds/orders-v2" {
		t.Fatalf("credential %s from %q: want a new one from the new path", cur.Version, cur.VaultLease.Path)
	}
	if got := h.vault.Leases(); len(got) != 1 || got[0] != cur.Lease.LeaseID {
		t.Errorf("leases in Vault %v, want the new one only", got)
	}
	if h.staged(t).Username != cur.Username {
		t.Error("the new credential is not the staged one")
	}
}

// Defect (issue 17): a consumer that never became available held the rollout without a word.
// After readinessTimeout from its restart the rollout is reported stalled, naming it, while the
// superseded lease stays live; once it has rolled out the rollout finishes and the lease goes.
func TestConsumerThatNeverRollsOutStallsTheRolloutNamingIt(t *testing.T) {
	api := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"}}
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1beta1.ConsumerReference{{Kind: "Deployment", Name: "api"}}
	}), api)
	// The fake client runs no Deployment controller: the test sets the status it would.
	setRolledOut := func(done bool) {
		t.Helper()
		if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(api), api); err != nil {
			t.Fatal(err)
		}
		api.Status = appsv1.DeploymentStatus{ObservedGeneration: api.Generation, Replicas: 1, UpdatedReplicas: 0, AvailableReplicas: 1}
		if done {
			api.Status.UpdatedReplicas = 1
		}
		if err := h.k8s.Status().Update(context.Background(), api); err != nil {
			t.Fatal(err)
		}
	}
	rolledOut := func() { setRolledOut(true) }
	h.settle(t)
	rolledOut()
	rc := h.settle(t)
	old := rc.Status.Credential
	setRolledOut(false) // the next rollout of the Deployment never gets its pods available
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	if rc.Status.Rollout == nil || rc.Status.Rollout.ConsumerRestartedAt == nil {
		t.Fatalf("rollout %+v: want the consumer restarted and waited for", rc.Status.Rollout)
	}
	if c := condition(rc, v1beta1.ConditionRolloutHealthy); c != nil && c.Status == metav1.ConditionFalse {
		t.Fatalf("RolloutHealthy %+v before readinessTimeout", c)
	}

	h.clock.Step(5*time.Minute + time.Second) // readinessTimeout
	rc = h.settle(t)
	c := condition(rc, v1beta1.ConditionRolloutHealthy)
	if c == nil || c.Reason != v1beta1.ReasonRolloutStalled || !strings.Contains(c.Message, "Deployment api") {
		t.Fatalf("RolloutHealthy %+v after readinessTimeout: want RolloutStalled naming Deployment api", c)
	}
	if !slices.Contains(h.vault.Leases(), old.Lease.LeaseID) || !ledgerHas(rc, old.Lease.LeaseID) {
		t.Error("the superseded lease did not stay live while the consumer had not rolled out")
	}

	rolledOut()
	rc = h.settle(t)
	if rc.Status.Rollout != nil || slices.Contains(h.vault.Leases(), old.Lease.LeaseID) {
		t.Errorf("rollout %+v, old lease live %v: want the rollout done and the old lease revoked once the consumer rolled out", rc.Status.Rollout, slices.Contains(h.vault.Leases(), old.Lease.LeaseID))
	}
	if c := condition(rc, v1beta1.ConditionRolloutHealthy); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("RolloutHealthy %+v after the consumer rolled out", c)
	}
}

func ledgerHas(rc *v1beta1.RedisCluster, id string) bool {
	for _, l := range rc.Status.Leases {
		if l.LeaseID == id {
			return true
		}
	}
	return false
}

// Defect (issue 17): while revocations kept failing, each rotation added a lease to the ledger
// until status.leases exceeded what the API server accepts, and every status write failed. Now,
// with the ledger full, no credential is issued (the current one goes on, SourceHealthy says
// LedgerFull); once revocations succeed the rotation happens.
func TestAFullLedgerHoldsRotationsInsteadOfFailingStatusWrites(t *testing.T) {
	h := newHarness(t, cluster())
	rc := h.settle(t)
	cur := rc.Status.Credential
	for i := len(rc.Status.Leases); i < credential.MaxLeases; i++ {
		rc.Status.Leases = append(rc.Status.Leases, v1beta1.LeaseRecord{
			LeaseID: fmt.Sprintf("database/creds/orders/old-%d", i), State: v1beta1.LeaseRevoking, Version: fmt.Sprintf("old%d", i),
			Username: fmt.Sprintf("V_OLD_%d", i), Connection: "vault"})
	}
	if err := h.k8s.Status().Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.vault.SetFailure(vaulttest.OpRevoke, vaulttest.Err(vaulttest.OpRevoke, vault.ClassUnavailable))
	rc = h.get(t)
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	issues := h.vault.Calls(vaulttest.OpIssue)
	for range 3 {
		// The revocations fail (and say so); the status writes must not.
		_, err := h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rc)})
		if err != nil && !strings.Contains(err.Error(), "revoking lease") {
			t.Fatalf("Reconcile: %v", err)
		}
	}
	rc = h.get(t)
	if n := h.vault.Calls(vaulttest.OpIssue) - issues; n != 0 || rc.Status.Credential.Version != cur.Version {
		t.Fatalf("%d credentials issued with a full ledger (credential %s, was %s)", n, rc.Status.Credential.Version, cur.Version)
	}
	if c := condition(rc, v1beta1.ConditionSourceHealthy); c == nil || c.Reason != v1beta1.ReasonLedgerFull {
		t.Errorf("SourceHealthy %+v, want LedgerFull", c)
	}
	if c := condition(rc, v1beta1.ConditionDegraded); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Degraded %+v with a full ledger", c)
	}

	h.vault.SetFailure(vaulttest.OpRevoke, nil)
	h.clock.Step(10 * time.Minute) // past the revocations' backoff
	rc = h.settle(t)
	if rc.Status.Credential.Version == cur.Version || len(rc.Status.Leases) >= credential.MaxLeases {
		t.Errorf("credential %s, %d leases: want the rotation once revocations made room", rc.Status.Credential.Version, len(rc.Status.Leases))
	}
	if c := condition(rc, v1beta1.ConditionSourceHealthy); c != nil && c.Status != metav1.ConditionTrue {
		t.Errorf("SourceHealthy %+v once the ledger has room", c)
	}
}

// A consumer StatefulSet with updateStrategy OnDelete never rolls its pods by itself: the
// rollout says so at once, naming it, rather than wait in silence.
func TestOnDeleteConsumerIsReported(t *testing.T) {
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "worker"},
		Spec: appsv1.StatefulSetSpec{UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType}}}
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1beta1.ConsumerReference{{Kind: "StatefulSet", Name: "worker"}}
	}), sts)
	rc := h.settle(t)
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	c := condition(rc, v1beta1.ConditionRolloutHealthy)
	if c == nil || c.Reason != v1beta1.ReasonRolloutStalled || !strings.Contains(c.Message, "StatefulSet worker has updateStrategy OnDelete") {
		t.Errorf("RolloutHealthy %+v: want the OnDelete consumer named", c)
	}
}

// A consumer whose status says it rolled out while a pod of its old template still shuts down
// (status.terminatingReplicas is there only with its feature gate) is waited for until that pod is
// gone: the pod may still use the superseded credential, whose user stays and whose lease stays
// live until then.
func TestTerminatingOldConsumerPodIsWaitedFor(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}
	api := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"}, Spec: appsv1.DeploymentSpec{Selector: sel}}
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1beta1.ConsumerReference{{Kind: "Deployment", Name: "api"}}
	}), api)
	rolledOut := func() {
		t.Helper()
		if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(api), api); err != nil {
			t.Fatal(err)
		}
		api.Status = appsv1.DeploymentStatus{ObservedGeneration: api.Generation, Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1}
		if err := h.k8s.Status().Update(context.Background(), api); err != nil {
			t.Fatal(err)
		}
	}
	h.settle(t)
	rolledOut()
	rc := h.settle(t)
	old := rc.Status.Credential
	// A pod of the current template, which the rotation's rollout replaces, and shuts down slowly.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api-old", Labels: map[string]string{"app": "api"},
		Annotations: map[string]string{v1beta1.AnnotationCredentialVersion: old.Version}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if err := h.k8s.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	rolledOut() // the Deployment's status: rolled out, no terminating count
	rc = h.settle(t)
	if rc.Status.Rollout == nil || !slices.Contains(h.vault.Leases(), old.Lease.LeaseID) {
		t.Fatalf("rollout %+v, old lease live %v: want the rollout waiting for pod api-old", rc.Status.Rollout, slices.Contains(h.vault.Leases(), old.Lease.LeaseID))
	}
	if err := h.k8s.Delete(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(2 * time.Second)
	rc = h.settle(t)
	if rc.Status.Rollout != nil || slices.Contains(h.vault.Leases(), old.Lease.LeaseID) {
		t.Errorf("rollout %+v, old lease live %v: want the rollout done once the old pod is gone", rc.Status.Rollout, slices.Contains(h.vault.Leases(), old.Lease.LeaseID))
	}
}

// A superseded lease that consumers not yet restarted still use is renewed while the rollout goes
// on, through its own connection, past the end of its first term; one that Vault renews no further
// is reported (SupersededLeaseEnding) with the time the rollout must be done by; one that is gone
// from Vault is honoured: its user is cut off (onRevokedOutside CutOff) and it leaves the ledger.
func TestSupersededLeaseIsKeptAliveWhileTheRolloutRuns(t *testing.T) {
	api := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"}}
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1beta1.ConsumerReference{{Kind: "Deployment", Name: "api"}}
	}), api)
	h.vault.LeaseDuration, h.vault.MaxTTL = 2*time.Minute, 7*time.Minute
	setRolledOut := func(done bool) {
		t.Helper()
		if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(api), api); err != nil {
			t.Fatal(err)
		}
		api.Status = appsv1.DeploymentStatus{ObservedGeneration: api.Generation, Replicas: 1, AvailableReplicas: 1}
		if done {
			api.Status.UpdatedReplicas = 1
		}
		if err := h.k8s.Status().Update(context.Background(), api); err != nil {
			t.Fatal(err)
		}
	}
	h.settle(t)
	setRolledOut(true)
	rc := h.settle(t)
	old := rc.Status.Credential
	setRolledOut(false) // the rotation's rollout of the Deployment does not finish
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	h.eventReasons()
	for range 8 { // 4 minutes: twice the lease's first term
		h.clock.Step(30 * time.Second)
		rc = h.settle(t)
	}
	rec, ok := leaseRecord(rc, old.Lease.LeaseID)
	if !ok || !slices.Contains(h.vault.Leases(), old.Lease.LeaseID) || rec.LastRenewal == nil || !rec.ExpiresAt.After(h.clock.Now()) {
		t.Fatalf("4 minutes into the rollout: the superseded lease is live in Vault %v, in the ledger %+v; want it renewed and live", slices.Contains(h.vault.Leases(), old.Lease.LeaseID), rec)
	}
	for range 4 { // 6 minutes, the max TTL (7) within a term's reach: Vault renews no further
		h.clock.Step(30 * time.Second)
		rc = h.settle(t)
	}
	if rec, _ := leaseRecord(rc, old.Lease.LeaseID); !rec.RenewalCapped || !slices.Contains(h.eventReasons(), v1beta1.EventSupersededLeaseEnding) {
		t.Errorf("near the max TTL: record %+v; want renewalCapped and a SupersededLeaseEnding event", rec)
	}
	for range 4 { // 8 minutes: the lease has ended in Vault
		h.clock.Step(30 * time.Second)
		rc = h.settle(t)
	}
	if rec, ok := leaseRecord(rc, old.Lease.LeaseID); ok || slices.Contains(h.redis.Users(nodeAddr(0)), old.Username) {
		t.Errorf("past the max TTL: record %+v, users %v; want the ended lease out of the ledger and its user cut off", rec, h.redis.Users(nodeAddr(0)))
	}

	// A second rotation's superseded lease, revoked outside keyroll, is cut off.
	h2 := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1beta1.ConsumerReference{{Kind: "Deployment", Name: "api"}}
	}), &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"}})
	h2.vault.LeaseDuration = 2 * time.Minute
	h, api = h2, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"}}
	h.settle(t)
	setRolledOut(true)
	rc = h.settle(t)
	old = rc.Status.Credential
	setRolledOut(false)
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	h.vault.RevokeOutside(old.Lease.LeaseID)
	h.clock.Step(90 * time.Second)
	rc = h.settle(t)
	if _, ok := leaseRecord(rc, old.Lease.LeaseID); ok {
		t.Errorf("a superseded lease revoked outside: still in the ledger %v, retiring users %v", ok, rc.Status.RetiringUsers)
	}
	if slices.Contains(h.redis.Users(nodeAddr(0)), old.Username) {
		t.Errorf("the revoked superseded user %s is still on the node: %v", old.Username, h.redis.Users(nodeAddr(0)))
	}
}

func leaseRecord(rc *v1beta1.RedisCluster, id string) (v1beta1.LeaseRecord, bool) {
	for _, l := range rc.Status.Leases {
		if l.LeaseID == id {
			return l, true
		}
	}
	return v1beta1.LeaseRecord{}, false
}
