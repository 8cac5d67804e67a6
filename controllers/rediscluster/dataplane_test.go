package rediscluster

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
)

// setPods changes every Redis pod of the cluster, as the API server would store it.
func (h *harness) setPods(t *testing.T, change func(p *corev1.Pod)) {
	t.Helper()
	pods := &corev1.PodList{}
	if err := h.k8s.List(context.Background(), pods, client.InNamespace("shop")); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		change(&pods.Items[i])
		st := pods.Items[i].Status
		if err := h.k8s.Update(context.Background(), &pods.Items[i]); err != nil {
			t.Fatal(err)
		}
		pods.Items[i].Status = st
		if err := h.k8s.Status().Update(context.Background(), &pods.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
}

// onDataPlane makes a pod one of data plane v, made from another template than today's.
func onDataPlane(v string) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Annotations = map[string]string{v1beta1.AnnotationPodTemplate: "another-template", v1beta1.AnnotationDataPlane: v}
	}
}

// window opens the maintenance window at 06:00 UTC for an hour (the harness's clock starts at 05:06).
func window(rc *v1beta1.RedisCluster) {
	rc.Spec.Rotation.MaintenanceWindow = &v1beta1.MaintenanceWindow{Start: "06:00", Duration: metav1.Duration{Duration: time.Hour}}
}

func storage(rc *v1beta1.RedisCluster) {
	rc.Spec.Storage = &v1beta1.StorageSpec{Size: resource.MustParse("1Gi")}
}

// gonePod says which of the cluster's n Redis pods the rollout deleted (none: "").
func (h *harness) gonePod(t *testing.T, n int) string {
	t.Helper()
	for i := range n {
		name := "orders-" + strconv.Itoa(i)
		if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, &corev1.Pod{}); apierrors.IsNotFound(err) {
			return name
		}
	}
	return ""
}

// rollAll restarts the pods as the rollout deletes them, until none is left to restart; it
// returns the order.
func (h *harness) rollAll(t *testing.T) []string {
	t.Helper()
	var order []string
	for range 4 {
		rc := h.settle(t)
		gone := h.gonePod(t, int(rc.Spec.Replicas))
		if gone == "" {
			return order
		}
		order = append(order, gone)
		h.recreatePod(t, rc, int(gone[len(gone)-1]-'0'), gone+"-again")
	}
	t.Fatalf("pods restarted: %v, and more", order)
	return nil
}

// Pods made by keyroll v0.1.0 (no data-plane annotation; the pod-template hash of that release,
// which counted the probe sidecar's image) are left as they are by this keyroll, which renders the
// same template: an upgrade restarts nothing and reports nothing. One whose template the owner
// has changed since is restarted, as before.
func TestPodsOfKeyrollV010AreLeftAsTheyAre(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	legacy := func(rc *v1beta1.RedisCluster) func(p *corev1.Pod) {
		tmpl := render.StatefulSet(rc, "", testProbeImage).Spec.Template
		tmpl.Annotations = nil
		return func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: render.ProbeContainerName, Image: "registry.example/keyroll:v0.1.0"}}
			p.Annotations = map[string]string{v1beta1.AnnotationPodTemplate: render.LegacyPodTemplateHash(tmpl, "registry.example/keyroll:v0.1.0")}
		}
	}
	h.setPods(t, legacy(rc))
	h.eventReasons()
	rc = h.settle(t)
	if gone := h.restarted(t); gone != "" || rc.Status.Rollout != nil {
		t.Fatalf("pod %q restarted, rollout %+v: keyroll v0.1.0's pods run what this keyroll renders", gone, rc.Status.Rollout)
	}
	if c := condition(rc, v1beta1.ConditionDataPlaneCurrent); c != nil {
		t.Errorf("condition %+v: nothing is pending", c)
	}
	if reasons := h.eventReasons(); len(reasons) != 0 {
		t.Errorf("events %v after the upgrade", reasons)
	}

	// The hash with another probe image is another template: the check is not a pass for any pod.
	h.setPods(t, func(p *corev1.Pod) { p.Spec.InitContainers[0].Image = "registry.example/keyroll:other" })
	h.settle(t)
	if h.restarted(t) == "" {
		t.Fatal("a pod whose hash is not the v0.1.0 hash of today's template was not restarted")
	}
}

// A newer data plane waits for the maintenance window: it is reported at once (condition, event,
// metric) and nothing restarts; when the window opens the pods restart, replicas first, and the
// condition says every pod runs the data plane.
func TestOlderDataPlaneWaitsForTheMaintenanceWindow(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, window))
	h.settle(t)
	h.setPods(t, onDataPlane("0"))
	h.eventReasons()
	rc := h.settle(t)
	if gone := h.restarted(t); gone != "" {
		t.Fatalf("pod %s restarted outside the maintenance window", gone)
	}
	c := condition(rc, v1beta1.ConditionDataPlaneCurrent)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1beta1.ReasonRestartPending {
		t.Fatalf("condition %+v, want RestartPending", c)
	}
	if res := h.reconcile(t); res.RequeueAfter <= 0 || res.RequeueAfter > 54*time.Minute+time.Second {
		t.Errorf("looks again in %s, want when the window opens (06:00, in 54 minutes) at the latest", res.RequeueAfter)
	}
	if reasons := h.eventReasons(); countOf(reasons, v1beta1.EventDataPlaneChangePending) != 1 {
		t.Errorf("events %v, want one %s", reasons, v1beta1.EventDataPlaneChangePending)
	}

	h.clock.Step(time.Hour) // 06:06: the window is open
	order := h.rollAll(t)
	if want := []string{"orders-2", "orders-1", "orders-0"}; !slices.Equal(order, want) {
		t.Errorf("restart order %v, want %v", order, want)
	}
	rc = h.settle(t)
	if c := condition(rc, v1beta1.ConditionDataPlaneCurrent); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition %+v after every pod restarted", c)
	}
}

// One replica without storage loses its data when it restarts: a pending data-plane change is
// reported and not applied, not even in the window, until the owner asks; the ask is acknowledged.
func TestSingleReplicaWithoutStorageIsNotRestarted(t *testing.T) {
	h := newHarness(t, cluster(window))
	h.settle(t)
	h.setPods(t, onDataPlane("0"))
	h.clock.Step(time.Hour) // in the window
	rc := h.settle(t)
	if gone := h.gonePod(t, 1); gone != "" {
		t.Fatalf("the only replica, without storage, was restarted (%s)", gone)
	}
	if c := condition(rc, v1beta1.ConditionDataPlaneCurrent); c == nil || c.Reason != v1beta1.ReasonRestartPending {
		t.Fatalf("condition %+v, want RestartPending", c)
	}

	rc.Annotations = map[string]string{v1beta1.AnnotationUpgradeDataPlane: "please"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if order := h.rollAll(t); !slices.Equal(order, []string{"orders-0"}) {
		t.Fatalf("restarted %v after the ask, want orders-0", order)
	}
	if rc = h.settle(t); rc.Status.DataPlaneUpgradeAcknowledged != "please" {
		t.Errorf("ask acknowledged as %q", rc.Status.DataPlaneUpgradeAcknowledged)
	}
	if rc.DataPlaneUpgradeAsked() {
		t.Error("the ask is still open after every pod restarted")
	}
}

// With storage, the same cluster's change waits for the window only.
func TestSingleReplicaWithStorageRestartsInTheWindow(t *testing.T) {
	h := newHarness(t, cluster(window, storage))
	h.settle(t)
	h.setPods(t, onDataPlane("0"))
	h.clock.Step(time.Hour)
	if order := h.rollAll(t); !slices.Equal(order, []string{"orders-0"}) {
		t.Fatalf("restarted %v in the window, want orders-0", order)
	}
}

// Pods a newer keyroll made (a rolling upgrade of the manager, its leader moving back to the
// older one) are left alone, window or not, so that two versions never roll them back and forth;
// after a rollback the owner's ask brings them to this keyroll's data plane.
func TestNewerDataPlaneIsLeftAloneUnlessAsked(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, window))
	h.settle(t)
	h.setPods(t, onDataPlane("7"))
	h.clock.Step(time.Hour)
	rc := h.settle(t)
	if gone := h.restarted(t); gone != "" {
		t.Fatalf("pod %s of a newer keyroll restarted", gone)
	}
	if c := condition(rc, v1beta1.ConditionDataPlaneCurrent); c == nil || c.Reason != v1beta1.ReasonNewerDataPlane {
		t.Fatalf("condition %+v, want NewerDataPlane", c)
	}
	rc.Annotations = map[string]string{v1beta1.AnnotationUpgradeDataPlane: "rollback"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if order := h.rollAll(t); len(order) != 3 {
		t.Fatalf("restarted %v after the ask", order)
	}
	if rc = h.settle(t); rc.Status.DataPlaneUpgradeAcknowledged != "rollback" {
		t.Errorf("ask acknowledged as %q", rc.Status.DataPlaneUpgradeAcknowledged)
	}
}

// A pod of this data plane whose template differs was made from an older spec: the owner's change
// restarts it at once, window or not, as before.
func TestSpecChangeUnderTheSameDataPlaneRestartsAtOnce(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, window))
	h.settle(t)
	h.setPods(t, onDataPlane("1"))
	h.settle(t)
	if h.restarted(t) != "orders-2" {
		t.Fatal("a pod of an older spec was not restarted outside the window")
	}
}

// A new probe image (a keyroll upgrade that keeps the data plane) changes no pod template: each
// pod's probe sidecar gets it in place, one pod at a time, replicas first and the primary last,
// the next only once the one before runs a new sidecar container; no pod is deleted.
func TestNewProbeImageIsPutOnThePodsInPlace(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	h.settle(t)
	h.setPods(t, func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: render.ProbeContainerName, Image: "registry.example/keyroll:v0"}}
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: render.ProbeContainerName, ContainerID: "old-" + p.Name,
			Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	})
	probeOf := func(name string) (*corev1.Pod, string) {
		p := &corev1.Pod{}
		if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, p); err != nil {
			t.Fatal(err)
		}
		return p, render.ProbeImage(p.Spec)
	}
	var order []string
	for range 3 {
		h.reconcile(t)
		var swapped []string
		for _, name := range []string{"orders-0", "orders-1", "orders-2"} {
			if _, img := probeOf(name); img == testProbeImage && !slices.Contains(order, name) {
				swapped = append(swapped, name)
			}
		}
		if len(swapped) != 1 {
			t.Fatalf("after %v, one reconcile changed the probes of %v, want one pod", order, swapped)
		}
		order = append(order, swapped[0])
		h.reconcile(t) // the kubelet has not restarted the sidecar yet: nothing more
		p, _ := probeOf(swapped[0])
		if p.Annotations[v1beta1.AnnotationProbeSwappedFrom] != "old-"+p.Name {
			t.Fatalf("%s's swap records %q", p.Name, p.Annotations[v1beta1.AnnotationProbeSwappedFrom])
		}
		p.Status.InitContainerStatuses[0].ContainerID = "new-" + p.Name // now it has
		if err := h.k8s.Status().Update(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"orders-2", "orders-1", "orders-0"}; !slices.Equal(order, want) {
		t.Errorf("probes changed in the order %v, want %v", order, want)
	}
	if gone := h.restarted(t); gone != "" {
		t.Errorf("pod %s was deleted for a new probe image", gone)
	}
	if n := countOf(h.eventReasons(), v1beta1.EventProbeSidecarUpdated); n != 3 {
		t.Errorf("%d %s events, want 3", n, v1beta1.EventProbeSidecarUpdated)
	}
}
