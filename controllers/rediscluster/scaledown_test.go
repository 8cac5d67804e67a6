package rediscluster

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// recreatePod does what the StatefulSet controller does after a pod was deleted: the pod again,
// from the current template (runningPods: its credential version), Ready at the same address.
func (h *harness) recreatePod(t *testing.T, rc *v1beta1.RedisCluster, i int, uid string) {
	t.Helper()
	p := runningPods(rc)[i+1].(*corev1.Pod) // after the StatefulSet
	p.UID = types.UID(uid)
	if err := h.k8s.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// Defect: replicas scaled down while a rollout restarted a pod that the scale-down removes left the
// rollout waiting for that pod until readinessTimeout, then stalled (Degraded) for good: the
// StatefulSet controller does not bring it back. The pods beyond spec.replicas are neither waited
// for nor restarted, and the rollout finishes on the pods that stay.
func TestScaleDownDuringRolloutFinishes(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, func(rc *v1beta1.RedisCluster) { rc.Spec.Rollout.RedisPods = v1beta1.RedisPodsRestart }))
	rc := h.settle(t)
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	if ro := rc.Status.Rollout; ro == nil || ro.PodInFlight != "orders-2" {
		t.Fatalf("rollout %+v: want orders-2 in flight", ro)
	}

	// The owner scales to one node; the StatefulSet controller removes orders-1 (orders-2 is gone).
	rc.Spec.Replicas = 1
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if err := h.k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-1"}}); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	if ro := rc.Status.Rollout; ro == nil || ro.PodInFlight != "orders-0" {
		t.Fatalf("after the scale-down, rollout %+v: want the remaining pod orders-0 restarted, not orders-2 waited for", ro)
	}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-0"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("orders-0 was not restarted: %v", err)
	}
	h.recreatePod(t, rc, 0, "pod-0-again")
	rc = h.settle(t)
	if rc.Status.Rollout != nil {
		t.Fatalf("the rollout did not finish on the pod that stays: %+v", rc.Status.Rollout)
	}
	if c := condition(rc, v1beta1.ConditionRolloutHealthy); c != nil && c.Reason == v1beta1.ReasonRolloutStalled {
		t.Errorf("RolloutHealthy %+v after a scale-down", c)
	}
	if reasons := h.eventReasons(); slices.Contains(reasons, v1beta1.EventRolloutStalled) || !slices.Contains(reasons, v1beta1.EventRotationFinished) {
		t.Errorf("events %v: want RotationFinished and no RolloutStalled", reasons)
	}
}
