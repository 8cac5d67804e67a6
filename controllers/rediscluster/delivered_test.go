package rediscluster

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

// redisStopped makes a Redis pod one whose Redis does not run (yet): no node accepts a user.
func redisStopped(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	p.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
}

// redisBack makes a Redis pod run Redis again, Ready.
func redisBack(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(epoch)}}
}

// publishedVersion is the credential version of the consumers' Secret; "" while there is none.
func (h *harness) publishedVersion(t *testing.T) string {
	t.Helper()
	sec := &corev1.Secret{}
	err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-credentials"}, sec)
	if err != nil {
		return ""
	}
	return sec.Annotations[v1beta1.AnnotationCredentialVersion]
}

// Defect (issue 47): with a one-minute schedule, the first credential, issued eleven seconds before
// the minute, was revoked unused at the minute. Now a scheduled rotation waits until the credential
// is delivered (every node has it, the consumers' Secret too), and comes at the schedule's next
// activation after that.
func TestFirstCredentialIsDeliveredBeforeAScheduledRotation(t *testing.T) {
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) { rc.Spec.Rotation.Schedule = "* * * * *" }))
	minute := epoch.Truncate(time.Minute).Add(time.Minute)
	h.clock.SetTime(minute.Add(-11 * time.Second))
	h.setPods(t, redisStopped)
	rc := h.settle(t)
	first := rc.Status.Credential
	if first == nil || h.vault.Calls(vaulttest.OpIssue) != 1 || first.DeliveredAt != nil || h.publishedVersion(t) != "" {
		t.Fatalf("with no Redis running: credential %+v, %d issues, published %q; want one credential, not delivered",
			first, h.vault.Calls(vaulttest.OpIssue), h.publishedVersion(t))
	}

	h.clock.SetTime(minute.Add(time.Second))
	rc = h.settle(t)
	if c := rc.Status.Credential; c.Version != first.Version || h.vault.Calls(vaulttest.OpIssue) != 1 {
		t.Fatalf("at the minute, not delivered: credential %s (%s), %d issues; want the first one kept", c.Version, c.RotationReason, h.vault.Calls(vaulttest.OpIssue))
	}
	if at := status.Of(rc.Status.Credential.NextRotation); !at.Equal(minute.Add(time.Minute)) {
		t.Errorf("nextRotation %s while not delivered, want the next minute %s", at, minute.Add(time.Minute))
	}

	delivered := minute.Add(20 * time.Second)
	h.clock.SetTime(delivered)
	h.setPods(t, redisBack)
	rc = h.settle(t)
	if c := rc.Status.Credential; c.Version != first.Version || !status.Of(c.DeliveredAt).Equal(delivered) || h.publishedVersion(t) != first.Version {
		t.Fatalf("delivered: credential %s, deliveredAt %v, published %q; want the first one, delivered at %s",
			c.Version, c.DeliveredAt, h.publishedVersion(t), delivered)
	}
	if at := status.Of(rc.Status.Credential.NextRotation); !at.Equal(minute.Add(time.Minute)) {
		t.Errorf("nextRotation %s once delivered, want the minute after the delivery %s", at, minute.Add(time.Minute))
	}

	h.clock.SetTime(minute.Add(59 * time.Second))
	if rc = h.settle(t); rc.Status.Credential.Version != first.Version {
		t.Fatalf("rotated at %s, before the minute after the delivery", h.clock.Now())
	}
	h.clock.SetTime(minute.Add(time.Minute))
	rc = h.settle(t)
	if c := rc.Status.Credential; c.Version == first.Version || c.RotationReason != string(rotation.ReasonScheduledRotation) || c.DeliveredAt == nil {
		t.Errorf("at the minute after the delivery: credential %s (%s), deliveredAt %v; want a scheduled rotation, delivered",
			c.Version, c.RotationReason, c.DeliveredAt)
	}
}

// A credential that a keyroll before status.credential.deliveredAt delivered gets its delivery
// counted from its issue: a scheduled rotation that came due while the operator was being
// upgraded still comes at once, not at the activation after.
func TestCredentialDeliveredBeforeDeliveriesWereRecordedIsNotHeldBack(t *testing.T) {
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) { rc.Spec.Rotation.Schedule = "*/5 * * * *" }))
	rc := h.settle(t)
	first := rc.Status.Credential
	if !status.Of(first.DeliveredAt).Equal(epoch) {
		t.Fatalf("deliveredAt %v, want %s: the first reconciles deliver it", first.DeliveredAt, epoch)
	}
	rc.Status.Credential.DeliveredAt = nil // as an older keyroll left it
	if err := h.k8s.Status().Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}

	// The activation at 05:10 passed during the upgrade (the lease lives on until 05:16).
	h.clock.SetTime(epoch.Truncate(5 * time.Minute).Add(5*time.Minute + 30*time.Second))
	// The first reconcile finds the credential delivered and records it at its issue; it looks
	// again at once rather than at the next activation its decision, made before, planned.
	if res := h.reconcile(t); res.RequeueAfter <= 0 || res.RequeueAfter > time.Second {
		t.Errorf("after recording an earlier delivery: %+v, want to look again at once", res)
	}
	if at := h.get(t).Status.Credential.DeliveredAt; !status.Of(at).Equal(status.Of(first.IssuedAt)) {
		t.Errorf("deliveredAt %v, want the issue %v", at, first.IssuedAt)
	}
	rc = h.settle(t)

	if c := rc.Status.Credential; c.Version == first.Version || c.RotationReason != string(rotation.ReasonScheduledRotation) {
		t.Errorf("after the upgrade: credential %s (%s), want the missed activation's rotation made", c.Version, c.RotationReason)
	}
	if n := h.vault.Calls(vaulttest.OpIssue); n != 2 {
		t.Errorf("%d issues, want the first and one rotation", n)
	}
}
