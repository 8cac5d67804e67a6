package rollout

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

func pod(name, version string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{v1alpha1.AnnotationCredentialVersion: version}},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

func TestNextPodRestartsReplicasFirstAndThePrimaryLast(t *testing.T) {
	cases := map[string]struct {
		pods []*corev1.Pod
		want string
	}{
		"highest replica first": {[]*corev1.Pod{pod("r-0", "old", true), pod("r-1", "old", true), pod("r-2", "old", true)}, "r-2"},
		"then the next replica": {[]*corev1.Pod{pod("r-0", "old", true), pod("r-1", "old", true), pod("r-2", "new", true)}, "r-1"},
		"primary last":          {[]*corev1.Pod{pod("r-0", "old", true), pod("r-1", "new", true), pod("r-2", "new", true)}, "r-0"},
		"two-digit ordinals":    {[]*corev1.Pod{pod("r-0", "old", true), pod("r-9", "old", true), pod("r-10", "old", true)}, "r-10"},
		"nothing left":          {[]*corev1.Pod{pod("r-0", "new", true), pod("r-1", "new", true)}, ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := nextPod(tc.pods, "new")
			if (got == nil && tc.want != "") || (got != nil && got.Name != tc.want) {
				t.Fatalf("next pod %v, want %q", got, tc.want)
			}
		})
	}
}

func TestConsumerRolledOut(t *testing.T) {
	cases := map[string]struct {
		w    workload
		want bool
	}{
		"deployment done":         {deployment{deploymentWith(3, 2, 2, 3, 3, 3)}, true},
		"deployment not observed": {deployment{deploymentWith(3, 3, 2, 3, 3, 3)}, false},
		"deployment updating":     {deployment{deploymentWith(3, 2, 2, 1, 3, 3)}, false},
		"deployment unavailable":  {deployment{deploymentWith(3, 2, 2, 3, 3, 2)}, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.w.rolledOut(); got != tc.want {
				t.Fatalf("rolledOut %v, want %v", got, tc.want)
			}
		})
	}
}

func deploymentWith(replicas int32, generation, observed int64, updated, total, available int32) *appsv1.Deployment {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: generation}}
	d.Spec.Replicas = &replicas
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: observed, UpdatedReplicas: updated, Replicas: total, AvailableReplicas: available}
	return d
}

// A restart whose status record was lost is found again from the pods: the pod on the target
// version that is not Ready.
func TestUnreadyOnVersionFindsTheRestartInFlight(t *testing.T) {
	pods := []*corev1.Pod{pod("r-0", "old", true), pod("r-1", "new", false), pod("r-2", "new", true)}
	if got := unreadyOnVersion(pods, "new"); got == nil || got.Name != "r-1" {
		t.Fatalf("in flight %v, want r-1", got)
	}
	if got := unreadyOnVersion([]*corev1.Pod{pod("r-0", "old", false), pod("r-1", "new", true)}, "new"); got != nil {
		t.Fatalf("in flight %v, want none (a pod on the old version is not a restart of this rollout)", got.Name)
	}
}
