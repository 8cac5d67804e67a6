package stalled

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// A Redis pod that does not come back from its restart (rollout.redisPods Restart; the real
// node's kubelet is held, so the pod stays Terminating and still reported Ready) stops the
// rollout: once it has not run Redis for rollout.readinessTimeout after its restart, and not
// before (the pod ran for longer than that before), the cluster is Degraded with a warning event;
// no further pod and no consumer is touched, and the old credential and lease stay. Once the
// kubelet goes on, the rollout resumes and completes.
func TestStalledRolloutTouchesNoFurtherPodAndResumesWhenReady(t *testing.T) {
	ns := fw.Namespace(t, "stall")
	vc := fw.VaultConnection(t, "vault-stall", framework.Allow(ns))
	fw.StandInConsumer(t, ns, "orders-api", 2)
	const timeout = 10 * time.Second
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("orders-api"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.RedisPods = v1beta1.RedisPodsRestart
		rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: timeout}
	})
	cur := fw.WaitReady(t, rc, 90*time.Second)
	oldLease, oldVersion := cur.Status.Credential.Lease.LeaseID, cur.Status.Credential.Version
	oldUser, oldPass, _ := fw.Credentials(rc)
	before := map[string]string{}
	for _, name := range []string{"orders-0", "orders-1"} {
		p := &corev1.Pod{}
		if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
			t.Fatal(err)
		}
		before[name] = string(p.UID)
	}
	// Pods that ran for longer than readinessTimeout before their restart, as pods usually have:
	// their restart must not be timed from their creation.
	oldest := &corev1.Pod{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "orders-2"}, oldest); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(oldest.CreationTimestamp.Add(2 * timeout)))

	resume := pauseRealKubelet(t)
	fw.RotateNow(t, rc)
	var restarted time.Time
	framework.Eventually(t, 30*time.Second, func() string {
		ro := fw.Get(t, rc).Status.Rollout
		if ro == nil || ro.PodInFlight != "orders-2" || ro.PodRestartedAt == nil {
			return fmt.Sprintf("orders-2 not restarted yet: rollout %+v", ro)
		}
		restarted = ro.PodRestartedAt.Time
		return ""
	})
	cur = fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionTrue, "", 60*time.Second)
	degraded := framework.Condition(cur, v1beta1.ConditionDegraded)
	t.Logf("while orders-2 is held: Degraded %s: %s", degraded.Reason, degraded.Message)
	// Both times are whole seconds, the restart's rounded down.
	if after := degraded.LastTransitionTime.Sub(restarted); after < timeout-time.Second {
		t.Errorf("Degraded %s after orders-2 was restarted, before its readinessTimeout (%s) was over: %s", after, timeout, degraded.Message)
	}
	if degraded.Reason != v1beta1.ReasonNodeNotReady || !strings.Contains(degraded.Message, "orders-2") {
		t.Errorf("Degraded %s: %s; want %s naming orders-2", degraded.Reason, degraded.Message, v1beta1.ReasonNodeNotReady)
	}
	if cur.Status.Rollout == nil || cur.Status.Rollout.PodInFlight != "orders-2" {
		t.Fatalf("rollout status while stalled: %+v", cur.Status.Rollout)
	}
	// Nothing further happens while the pod is held.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		for name, b := range before {
			p := &corev1.Pod{}
			if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
				t.Fatal(err)
			}
			if string(p.UID) != b || p.DeletionTimestamp != nil {
				t.Fatalf("pod %s was touched while the rollout was stalled", name)
			}
		}
		if v := fw.ConsumerVersion(t, ns, "orders-api"); v != "" && v != oldVersion {
			t.Fatalf("the consumer was restarted on %s while the rollout was stalled", v)
		}
	}
	if warnings := framework.Reasons(framework.Warnings(fw.ClusterEvents(t, ns, "orders"))); !slices.Contains(warnings, degraded.Reason) {
		t.Errorf("no %s warning event (warnings: %v)", degraded.Reason, warnings)
	}
	if exists, _ := fw.LeaseExists(oldLease); !exists {
		t.Fatal("the old lease was revoked while the rollout was stalled")
	}
	if !fw.Authenticates(oldUser, oldPass) {
		t.Fatal("the old credential stopped working while the rollout was stalled")
	}
	// Every Redis runs on (the held kubelet stops none), orders-2's too, with the old user.
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
		t.Fatalf("while the rollout was stalled: %s", msg)
	}

	resume()
	start := time.Now()
	fw.WaitRolledOut(t, rc, oldLease, 120*time.Second)
	t.Logf("the rollout finished %s after the kubelet went on", time.Since(start).Round(time.Millisecond))
	fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionFalse, "", 10*time.Second)
	fw.CheckRetired(t, rc, "orders-api", oldUser, oldPass, oldLease)
}

// An operator stopped in the middle of a rollout (the consumer's new pods are held not Ready, as
// kwok is paused) and started again resumes it, and the rotation ends with exactly the one new
// lease it began with: the restarted operator issues nothing more, and the old lease is revoked.
func TestOperatorRestartMidRolloutResumesWithOneNewLeaseAndOneRevoked(t *testing.T) {
	ns := fw.Namespace(t, "restart")
	vc := fw.VaultConnection(t, "vault-restart", framework.Allow(ns))
	fw.StandInConsumer(t, ns, "orders-api", 2)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("restart"), framework.WithConsumers("orders-api"))
	cur := fw.WaitReady(t, rc, 60*time.Second)
	oldLease := cur.Status.Credential.Lease.LeaseID
	oldUser, oldPass, _ := fw.Credentials(rc)
	if leases := fw.VaultLeases(t, fw.Path("restart")); !slices.Equal(leases, []string{oldLease}) {
		t.Fatalf("Vault leases before the rotation: %v", leases)
	}

	resume := pauseKubelets(t)
	fw.RotateNow(t, rc)
	var newLease string
	framework.Eventually(t, 60*time.Second, func() string {
		cur = fw.Get(t, rc)
		ro := cur.Status.Rollout
		if ro == nil || fw.ConsumerVersion(t, ns, "orders-api") != ro.TargetVersion {
			return fmt.Sprintf("the consumer is not restarted yet: rollout %+v", ro)
		}
		newLease = cur.Status.Credential.Lease.LeaseID
		return ""
	})
	if leases := fw.VaultLeases(t, fw.Path("restart")); len(leases) != 2 || !slices.Contains(leases, oldLease) || !slices.Contains(leases, newLease) {
		t.Fatalf("Vault leases mid-rollout: %v, want the old %s and the new %s", leases, oldLease, newLease)
	}
	fw.RestartOperator(t)
	resume()
	cur = fw.WaitRolledOut(t, rc, oldLease, 90*time.Second)
	if cur.Status.Credential.Lease.LeaseID != newLease {
		t.Errorf("the rotation ended on lease %s, not on %s it began with", cur.Status.Credential.Lease.LeaseID, newLease)
	}
	if leases := fw.VaultLeases(t, fw.Path("restart")); !slices.Equal(leases, []string{newLease}) {
		t.Fatalf("after the resumed rollout Vault holds %v for the role, want exactly the one new lease %s", leases, newLease)
	}
	fw.CheckRetired(t, rc, "orders-api", oldUser, oldPass, oldLease)
}

// pauseKubelets stops kwok, so that pods on its fake node (the consumers) are not made Ready,
// until the returned function (or the end of the test) starts it again.
func pauseKubelets(t *testing.T) (resume func()) {
	t.Helper()
	fw.Ground.Workloads.PauseKubelets()
	resumed := false
	resume = func() {
		if resumed {
			return
		}
		resumed = true
		if err := fw.Ground.Workloads.ResumeKubelets(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(resume)
	return resume
}

// pauseRealKubelet holds the real node's kubelet (testground's Node.PauseKubelet: the Redis pods
// run on, but none starts, stops or changes its status) until the returned function, or the end
// of the test, lets it go on.
func pauseRealKubelet(t *testing.T) (resume func()) {
	t.Helper()
	if err := fw.Ground.Node.PauseKubelet(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume = func() {
		if resumed {
			return
		}
		resumed = true
		if err := fw.Ground.Node.ResumeKubelet(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(resume)
	return resume
}
