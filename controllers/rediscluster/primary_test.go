package rediscluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// notReady makes the pod's Ready condition false from now on, and returns the pod.
func (h *harness) notReady(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(h.clock.Now())}}
	if err := h.k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// roles are the pods' role labels, by pod.
func (h *harness) roles(t *testing.T) map[string]string {
	t.Helper()
	pods := &corev1.PodList{}
	if err := h.k8s.List(context.Background(), pods, client.InNamespace("shop")); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		out[p.Name] = p.Labels[v1beta1.LabelRole]
	}
	return out
}

// restarted says which Redis pod the rollout deleted (none: "").
func (h *harness) restarted(t *testing.T) string {
	t.Helper()
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, &corev1.Pod{}); apierrors.IsNotFound(err) {
			return name
		}
	}
	return ""
}

func TestPodZeroIsTheFirstPrimaryAndThePodsCarryTheirRoles(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	if rc.Status.Primary != "orders-0" {
		t.Errorf("status.primary %q, want orders-0", rc.Status.Primary)
	}
	want := map[string]string{"orders-0": v1beta1.RolePrimary, "orders-1": v1beta1.RoleReplica, "orders-2": v1beta1.RoleReplica}
	if got := h.roles(t); !maps.Equal(got, want) {
		t.Errorf("roles %v, want %v", got, want)
	}
	before := h.redis.Commands
	h.reconcile(t)
	if h.redis.Commands != before {
		t.Errorf("keeping a healthy primary sent %d Redis commands", h.redis.Commands-before)
	}
}

// A change of the pod template (here resources) restarts the Redis pods one at a time, replicas
// first; before the primary restarts its role goes to an in-sync replica by FAILOVER, the role
// labels (so the client Service) follow, and the other replica replicates from the new primary.
func TestTemplateChangeRollsReplicasFirstThenHandsThePrimaryOver(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	h.eventReasons()

	rc.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 3 {
		rc = h.settle(t)
		gone := h.restarted(t)
		if gone == "" {
			t.Fatalf("no pod restarted; rollout %+v, conditions %+v", rc.Status.Rollout, rc.Status.Conditions)
		}
		if ro := rc.Status.Rollout; ro == nil || ro.Cause != v1beta1.RolloutForPodTemplate || ro.PodInFlight != gone {
			t.Fatalf("rollout %+v while %s restarts", ro, gone)
		}
		order = append(order, gone)
		if gone == "orders-0" && rc.Status.Primary == "orders-0" {
			t.Fatal("the primary restarted while it was the primary")
		}
		h.recreatePod(t, rc, int(gone[len(gone)-1]-'0'), gone+"-again")
	}
	rc = h.settle(t)

	if want := []string{"orders-2", "orders-1", "orders-0"}; !slices.Equal(order, want) {
		t.Errorf("restart order %v, want %v", order, want)
	}
	if rc.Status.Rollout != nil {
		t.Errorf("rollout %+v after every pod restarted", rc.Status.Rollout)
	}
	p := rc.Status.Primary
	if p != "orders-1" && p != "orders-2" {
		t.Fatalf("status.primary %q, want a replica that took over", p)
	}
	pAddr := nodeAddr(int(p[len(p)-1] - '0'))
	if h.redis.PrimaryOf(pAddr) != "" {
		t.Errorf("%s is not a primary on Redis", p)
	}
	for i := range 3 {
		if a := nodeAddr(i); a != pAddr && h.redis.PrimaryOf(a) != pAddr {
			t.Errorf("node %d replicates from %q, want the new primary %s", i, h.redis.PrimaryOf(a), pAddr)
		}
	}
	if got := h.roles(t); got[p] != v1beta1.RolePrimary || got["orders-0"] != v1beta1.RoleReplica {
		t.Errorf("roles %v, want %s primary and orders-0 a replica", got, p)
	}
	reasons := h.eventReasons()
	for _, e := range []string{v1beta1.EventPodsRolloutStarted, v1beta1.EventPrimaryHandedOver, v1beta1.EventPodsRolloutFinished} {
		if countOf(reasons, e) != 1 {
			t.Errorf("%d %s events, want 1: %v", countOf(reasons, e), e, reasons)
		}
	}
	if slices.Contains(reasons, v1beta1.EventRotationStarted) || slices.Contains(reasons, v1beta1.EventPrimaryPromoted) {
		t.Errorf("a template change was taken for a rotation or a lost primary: %v", reasons)
	}
}

// A primary that is not Ready for LostAfter and does not answer is replaced by the replica that
// took in most of its stream; the other nodes, the old primary included once it runs again,
// replicate from it.
func TestLostPrimaryIsReplacedByTheReplicaWithTheMostData(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	h.settle(t)
	h.eventReasons()
	h.redis.Offsets[nodeAddr(1)], h.redis.Offsets[nodeAddr(2)] = 100, 200

	pod := h.notReady(t, "orders-0")
	h.redis.Unreachable[nodeAddr(0)] = true // its Redis is gone
	if res := h.reconcile(t); res.RequeueAfter <= 0 || res.RequeueAfter > PrimaryLostAfter {
		t.Errorf("RequeueAfter %s while the primary is not Ready: want it within %s", res.RequeueAfter, PrimaryLostAfter)
	}
	if rc := h.get(t); rc.Status.Primary != "orders-0" {
		t.Fatalf("promoted %s before the primary was lost for %s", rc.Status.Primary, PrimaryLostAfter)
	}

	h.clock.Step(PrimaryLostAfter + time.Second)
	rc := h.settle(t)
	if rc.Status.Primary != "orders-2" {
		t.Fatalf("status.primary %q, want orders-2, the replica with the highest offset", rc.Status.Primary)
	}
	// orders-0's Redis starts again, as a primary (from its disk), and Ready: it follows orders-2.
	delete(h.redis.Unreachable, nodeAddr(0))
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-0"}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(h.clock.Now())}}
	pod.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.NewTime(h.clock.Now())
	if err := h.k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	if h.redis.PrimaryOf(nodeAddr(2)) != "" || h.redis.PrimaryOf(nodeAddr(1)) != nodeAddr(2) || h.redis.PrimaryOf(nodeAddr(0)) != nodeAddr(2) {
		t.Errorf("replication: orders-2 of %q, orders-1 of %q, orders-0 of %q", h.redis.PrimaryOf(nodeAddr(2)), h.redis.PrimaryOf(nodeAddr(1)), h.redis.PrimaryOf(nodeAddr(0)))
	}
	if got := h.roles(t); got["orders-2"] != v1beta1.RolePrimary || got["orders-0"] != v1beta1.RoleReplica {
		t.Errorf("roles %v", got)
	}
	if reasons := h.eventReasons(); countOf(reasons, v1beta1.EventPrimaryPromoted) != 1 {
		t.Errorf("events %v, want one PrimaryPromoted", reasons)
	}
}

// A primary whose probe fails (a node too busy to run it in time) but whose Redis answers as the
// primary is not lost: no replica is promoted however long it stays not Ready, so that a busy
// node does not swap the roles back and forth, and no write is lost to a promotion.
func TestPrimaryNotReadyButAnsweringIsNotReplaced(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	h.settle(t)
	h.eventReasons()
	h.notReady(t, "orders-0")
	for range 3 {
		h.clock.Step(PrimaryLostAfter + time.Second)
		if res := h.reconcile(t); res.RequeueAfter <= 0 || res.RequeueAfter > PrimaryLostAfter {
			t.Errorf("RequeueAfter %s while the primary is not Ready: want it looked at again within %s", res.RequeueAfter, PrimaryLostAfter)
		}
	}
	if rc := h.get(t); rc.Status.Primary != "orders-0" {
		t.Fatalf("status.primary %s: a primary that answers as the primary was replaced", rc.Status.Primary)
	}
	if h.redis.PrimaryOf(nodeAddr(0)) != "" || h.redis.PrimaryOf(nodeAddr(1)) != nodeAddr(0) {
		t.Errorf("replication changed: orders-0 of %q, orders-1 of %q", h.redis.PrimaryOf(nodeAddr(0)), h.redis.PrimaryOf(nodeAddr(1)))
	}
	if reasons := h.eventReasons(); countOf(reasons, v1beta1.EventPrimaryPromoted) != 0 {
		t.Errorf("events %v, want no PrimaryPromoted", reasons)
	}
}

// A scale-down that would remove the primary (a hand-over made orders-2 the primary) waits for
// the primary role to move to a pod that stays: the StatefulSet keeps orders-2 until then.
func TestScaleDownNeverRemovesThePrimary(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	// orders-2 is the primary (as after a hand-over); the others replicate from it.
	h.redis.ReplicateFrom(nodeAddr(2), nodeAddr(0), nodeAddr(1))
	h.redis.ReplicaOfNoOne(nodeAddr(2))
	rc.Status.Primary = "orders-2"
	if err := h.k8s.Status().Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	if got := h.roles(t); got["orders-2"] != v1beta1.RolePrimary {
		t.Fatalf("roles %v, want orders-2 primary", got)
	}

	rc.Spec.Replicas = 2
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	if p := rc.Status.Primary; p != "orders-0" && p != "orders-1" {
		t.Fatalf("status.primary %q after the scale-down to 2: want a pod that stays", p)
	}
	sts := &appsv1.StatefulSet{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, sts); err != nil {
		t.Fatal(err)
	}
	if *sts.Spec.Replicas != 2 {
		t.Errorf("StatefulSet replicas %d once the primary moved, want 2", *sts.Spec.Replicas)
	}
	if h.redis.PrimaryOf(nodeAddr(2)) == "" {
		t.Error("orders-2 is still a primary on Redis")
	}
}

// While the primary has not moved, the StatefulSet keeps it.
func TestStatefulSetKeepsThePrimaryUntilItMoved(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	h.redis.ReplicateFrom(nodeAddr(2), nodeAddr(0), nodeAddr(1))
	h.redis.ReplicaOfNoOne(nodeAddr(2))
	rc.Status.Primary = "orders-2"
	if err := h.k8s.Status().Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.redis.Unreachable[nodeAddr(2)] = true // the hand-over cannot happen
	rc = h.get(t)
	rc.Spec.Replicas = 2
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		h.reconcile(t)
	}
	sts := &appsv1.StatefulSet{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, sts); err != nil {
		t.Fatal(err)
	}
	if rc := h.get(t); *sts.Spec.Replicas != 3 || rc.Status.Primary != "orders-2" {
		t.Errorf("StatefulSet replicas %d, primary %s: want 3 and orders-2 while the primary cannot hand its role over", *sts.Spec.Replicas, rc.Status.Primary)
	}
}

// A hand-over whose status write was lost: status.primary still names the old primary, which is
// restarting, while the labels name the new one. The labels' record is taken at once (the new
// primary says it is one): the client Service never loses its primary, and no promotion follows.
func TestAHandOverWhoseStatusWriteWasLostIsRecordedFromTheLabels(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	h.eventReasons()
	// orders-1 took over by FAILOVER and carries the label; orders-0 restarts.
	h.redis.ReplicateFrom(nodeAddr(1), nodeAddr(0), nodeAddr(2))
	h.redis.ReplicaOfNoOne(nodeAddr(1))
	for name, role := range map[string]string{"orders-0": v1beta1.RoleReplica, "orders-1": v1beta1.RolePrimary} {
		p := &corev1.Pod{}
		if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, p); err != nil {
			t.Fatal(err)
		}
		p.Labels[v1beta1.LabelRole] = role
		if err := h.k8s.Update(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-0"}}); err != nil {
		t.Fatal(err)
	}
	if rc.Status.Primary != "orders-0" {
		t.Fatalf("status.primary %q", rc.Status.Primary)
	}

	rc = h.settle(t)
	if rc.Status.Primary != "orders-1" {
		t.Errorf("status.primary %q, want orders-1, as its label says", rc.Status.Primary)
	}
	if got := h.roles(t); got["orders-1"] != v1beta1.RolePrimary {
		t.Errorf("roles %v: the client Service lost its primary", got)
	}
	if reasons := h.eventReasons(); slices.Contains(reasons, v1beta1.EventPrimaryPromoted) {
		t.Errorf("a promotion for a hand-over already done: %v", reasons)
	}
}
