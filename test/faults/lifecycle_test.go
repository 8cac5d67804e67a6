package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// TestSourceChanged moves a live cluster to another VaultConnection and another path while the
// old connection's Vault is cut off: the new credential is issued through the new connection and
// rolled out, and the old lease waits, pending, until the old connection's Vault answers again,
// then is revoked through it (the new connection could not have revoked it then).
func TestSourceChanged(t *testing.T) {
	r := newRow(t, 12, "`connectionRef` / `path` changed", "new credential issued and rolled out; old leases revoked through the old connection")
	// The old and the new connection issue from Vault roles of their base names.
	ns, oldBase, newBase := fw.Namespace(t, "f-source"), "f-source-a", "f-source-b"
	p := vaultProxy(t)
	oldConn := fw.VaultConnection(t, oldBase, framework.Address(p.URL()), framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	newConn := fw.VaultConnection(t, newBase, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	fw.StandInConsumer(t, ns, "app", 1)
	startOperator(t, ns+"-1", "", ns)
	rc := fw.RedisCluster(t, ns, "orders", oldConn.Name, fw.Path(oldBase), framework.WithConsumers("app"))
	first := waitSettled(t, rc, "", settleTimeout).Status.Credential

	p.Cut()
	cur := fw.Get(t, rc)
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Credentials.VaultLease.ConnectionRef.Name = newConn.Name
	cur.Spec.Credentials.VaultLease.Path = fw.Path(newBase)
	if err := fw.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	var pending string
	framework.Eventually(t, settleTimeout, func() string {
		cur = fw.Get(t, rc)
		c := cur.Status.Credential
		if c == nil || c.Version == first.Version || c.VaultLease.Path != fw.Path(newBase) {
			return fmt.Sprintf("no credential from the new path yet: %+v", c)
		}
		if u := credentialsUser(rc); u != c.Username {
			return "the consumers' Secret does not hold the new credential yet"
		}
		lr := framework.Condition(cur, v1beta1.ConditionLeasesRevoked)
		if lr == nil || lr.Reason != v1beta1.ReasonRevocationPending {
			return fmt.Sprintf("LeasesRevoked is %+v, want RevocationPending while the old connection is cut off", lr)
		}
		if !slices.Contains(ledger(cur), first.Lease.LeaseID) {
			return "the old lease left the ledger while its connection was cut off"
		}
		pending = lr.Message
		return ""
	})
	rolledOut := time.Since(changed)
	if ok, _ := fw.LeaseExists(first.Lease.LeaseID); !ok {
		t.Fatalf("the old lease %s is gone while its connection was cut off: something else revoked it", first.Lease.LeaseID)
	}
	p.Restore()
	restored := time.Now()
	framework.Eventually(t, time.Minute, func() string {
		if live := fw.VaultLeases(t, fw.Path(oldBase)); len(live) != 0 {
			return fmt.Sprintf("the old path still holds %v", live)
		}
		return ""
	})
	revoked := time.Since(restored)
	waitSettled(t, rc, first.Version, settleTimeout)
	checkLeases(t, rc, newBase)
	if n := operatorLog("Lease revoked", first.Lease.LeaseID); n != 1 {
		t.Errorf("the old lease was revoked %d times, want 1", n)
	}
	r.measured = fmt.Sprintf("new credential from %s rolled out %s after the change, while the old connection was cut off (LeasesRevoked=RevocationPending: %q); the old lease revoked through the old connection %s after it came back; Vault holds no lease under the old path",
		fw.Path(newBase), rolledOut.Round(100*time.Millisecond), clip(pending, 120), revoked.Round(100*time.Millisecond))
}

// stallConsumer makes a consumer Deployment unable to roll out: its next pod selects a node that
// does not exist, and the old pod stays (maxUnavailable 0).
func stallConsumer(t *testing.T, key client.ObjectKey, stalled bool) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := fw.Client.Get(context.Background(), key, d); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Template.Spec.NodeSelector = map[string]string{testground.NodeLabel: "kwok"}
	if stalled {
		d.Spec.Template.Spec.NodeSelector[testground.NodeLabel] = "nowhere"
	}
	if err := fw.Client.Patch(context.Background(), d, patch); err != nil {
		t.Fatal(err)
	}
}

// TestConsumerNeverAvailable rotates a cluster whose consumer cannot roll out: after
// readinessTimeout the rollout is reported stalled, naming the consumer, and the superseded lease
// stays live; once the consumer can roll out, the rollout finishes and the lease is revoked.
func TestConsumerNeverAvailable(t *testing.T) {
	r := newRow(t, 13, "consumer never available", "`RolloutStalled` naming it after `readinessTimeout`; superseded lease stays live; resumes when fixed")
	base := "f-stalled"
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	app := fw.StandInConsumer(t, ns, "app", 1)
	startOperator(t, ns+"-1", "", ns)
	timeout := 15 * time.Second
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path(base), framework.WithConsumers("app"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: timeout}
	})
	first := waitSettled(t, rc, "", settleTimeout).Status.Credential
	stallConsumer(t, app, true)
	start := time.Now()
	fw.RotateNow(t, rc)
	cur := fw.WaitCondition(t, rc, v1beta1.ConditionRolloutHealthy, metav1.ConditionFalse, v1beta1.ReasonRolloutStalled, settleTimeout)
	stalledAfter := time.Since(start)
	msg := framework.Condition(cur, v1beta1.ConditionRolloutHealthy).Message
	if !strings.Contains(msg, "Deployment app") {
		t.Errorf("RolloutStalled does not name the consumer: %q", msg)
	}
	if d := framework.Condition(cur, v1beta1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue {
		t.Errorf("Degraded is %+v during the stall, want True", d)
	}
	if stalledAfter < timeout {
		t.Errorf("reported stalled %s after the rotation, before readinessTimeout %s", stalledAfter, timeout)
	}
	if ok, _ := fw.LeaseExists(first.Lease.LeaseID); !ok || !slices.Contains(ledger(cur), first.Lease.LeaseID) {
		t.Errorf("the superseded lease %s is not live and in the ledger during the stall (live %v, ledger %v)", first.Lease.LeaseID, ok, ledger(cur))
	}
	stallConsumer(t, app, false)
	fixed := time.Now()
	waitSettled(t, rc, first.Version, settleTimeout)
	resumed := time.Since(fixed)
	checkLeases(t, rc, base)
	r.measured = fmt.Sprintf("RolloutHealthy=False/RolloutStalled (Degraded) %s after the rotation (readinessTimeout %s): %q; the superseded lease live meanwhile; done %s after the consumer could roll out, the superseded lease then revoked",
		stalledAfter.Round(100*time.Millisecond), timeout, clip(msg, 140), resumed.Round(100*time.Millisecond))
}

// TestDeleteMidRolloutAndWithVaultDown deletes a cluster in the middle of a rollout (its consumer
// stalled, two leases live), and another while its Vault is cut off: every lease is revoked; the
// second's finalizer holds, RevocationPending, until Vault answers again.
func TestDeleteMidRolloutAndWithVaultDown(t *testing.T) {
	r := newRow(t, 14, "delete mid-rollout; delete with Vault down", "every lease revoked (with Vault down: finalizer holds, `RevocationPending`, revoked after return)")
	// The connections issue from Vault roles of their base names.
	base, downBase := "f-delete", "f-delete-down"
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	p := vaultProxy(t)
	down := fw.VaultConnection(t, downBase, framework.Address(p.URL()), framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	app := fw.StandInConsumer(t, ns, "app", 1)
	startOperator(t, ns+"-1", "", ns)
	a := fw.RedisCluster(t, ns, "rolling", vc.Name, fw.Path(base), framework.WithConsumers("app"))
	b := fw.RedisCluster(t, ns, "cutoff", down.Name, fw.Path(downBase))
	waitSettled(t, a, "", settleTimeout)
	waitSettled(t, b, "", settleTimeout)

	stallConsumer(t, app, true)
	fw.RotateNow(t, a)
	framework.Eventually(t, settleTimeout, func() string {
		if n := len(fw.VaultLeases(t, fw.Path(base))); n != 2 || fw.Get(t, a).Status.Rollout == nil {
			return fmt.Sprintf("%d leases live, rollout %+v; want the rotation in progress with both leases", n, fw.Get(t, a).Status.Rollout)
		}
		return ""
	})
	fw.DeleteAndWait(t, a, time.Minute)
	if live := fw.VaultLeases(t, fw.Path(base)); len(live) != 0 {
		t.Errorf("deleted mid-rollout, Vault still holds %v", live)
	}

	p.Cut()
	if err := fw.Client.Delete(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	cur := fw.WaitCondition(t, b, v1beta1.ConditionLeasesRevoked, metav1.ConditionFalse, v1beta1.ReasonRevocationPending, time.Minute)
	if len(fw.VaultLeases(t, fw.Path(downBase))) != 1 || len(cur.Status.Leases) != 1 {
		t.Fatalf("with Vault cut off: Vault holds %v, the ledger %v; want the lease in both", fw.VaultLeases(t, fw.Path(downBase)), ledger(cur))
	}
	time.Sleep(5 * time.Second) // the finalizer holds
	if fw.Get(t, b).DeletionTimestamp == nil {
		t.Fatal("the cluster is not being deleted")
	}
	p.Restore()
	restored := time.Now()
	fw.DeleteAndWait(t, b, time.Minute) // deleted already: it waits until it is gone
	after := time.Since(restored)
	if live := fw.VaultLeases(t, fw.Path(downBase)); len(live) != 0 {
		t.Errorf("deleted with Vault down, Vault still holds %v after its return", live)
	}
	r.measured = fmt.Sprintf("deleted mid-rollout: both leases revoked, 0 left; deleted with Vault cut off: finalizer held with LeasesRevoked=RevocationPending, the lease revoked and the cluster gone %s after Vault's return",
		after.Round(100*time.Millisecond))
}

// clip shortens s to n bytes for a table cell.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
