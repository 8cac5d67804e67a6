package rediscluster

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

func pod(name, version string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{v1beta1.AnnotationCredentialVersion: version, v1beta1.AnnotationPodTemplate: "t1"}},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// restartStep is a step of a rollout.redisPods Restart cluster whose primary is primary, rolling
// to credential new on pod template t1.
func restartStep(primary string) *step {
	rc := &v1beta1.RedisCluster{}
	rc.Status.Primary = primary
	return &step{rc: rc, want: podWant{template: "t1", version: "new", restarts: true}}
}

func onTemplate(p *corev1.Pod, template string) *corev1.Pod {
	p.Annotations[v1beta1.AnnotationPodTemplate] = template
	return p
}

func TestNextPodRestartsReplicasFirstAndThePrimaryLast(t *testing.T) {
	cases := map[string]struct {
		primary string
		pods    []*corev1.Pod
		want    string
	}{
		"highest replica first": {"r-0", []*corev1.Pod{pod("r-0", "old", true), pod("r-1", "old", true), pod("r-2", "old", true)}, "r-2"},
		"then the next replica": {"r-0", []*corev1.Pod{pod("r-0", "old", true), pod("r-1", "old", true), pod("r-2", "new", true)}, "r-1"},
		"primary last":          {"r-0", []*corev1.Pod{pod("r-0", "old", true), pod("r-1", "new", true), pod("r-2", "new", true)}, "r-0"},
		"two-digit ordinals":    {"r-0", []*corev1.Pod{pod("r-0", "old", true), pod("r-9", "old", true), pod("r-10", "old", true)}, "r-10"},
		"nothing left":          {"r-0", []*corev1.Pod{pod("r-0", "new", true), pod("r-1", "new", true)}, ""},
		// After a hand-over the primary is another pod than 0: it still goes last.
		"a moved primary last":         {"r-2", []*corev1.Pod{pod("r-0", "old", true), pod("r-1", "old", true), pod("r-2", "old", true)}, "r-1"},
		"pod 0 before a moved primary": {"r-2", []*corev1.Pod{pod("r-0", "old", true), pod("r-1", "new", true), pod("r-2", "old", true)}, "r-0"},
		// A pod on the credential but an older template is restarted too.
		"older template": {"r-0", []*corev1.Pod{pod("r-0", "new", true), onTemplate(pod("r-1", "new", true), "t0"), pod("r-2", "new", true)}, "r-1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := restartStep(tc.primary).nextPod(tc.pods)
			if (got == nil && tc.want != "") || (got != nil && got.Name != tc.want) {
				t.Fatalf("next pod %v, want %q", got, tc.want)
			}
		})
	}
}

// With rollout.redisPods Live a pod's credential does not matter, its template does.
func TestLivePodsRollForTheirTemplateOnly(t *testing.T) {
	s := restartStep("r-0")
	s.want.restarts = false
	pods := []*corev1.Pod{pod("r-0", "", true), pod("r-1", "old", true)}
	if !s.settled(pods) || s.nextPod(pods) != nil {
		t.Fatal("pods on the current template are restarted for a credential in Live mode")
	}
	pods = append(pods, onTemplate(pod("r-2", "", true), "t0"))
	if s.settled(pods) {
		t.Fatal("a pod on an older template counts as settled")
	}
	if got := s.nextPod(pods); got == nil || got.Name != "r-2" {
		t.Fatalf("next pod %v, want r-2 (older template)", got)
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
	if got := restartStep("r-0").unreadyCurrent(pods); got == nil || got.Name != "r-1" {
		t.Fatalf("in flight %v, want r-1", got)
	}
	if got := restartStep("r-0").unreadyCurrent([]*corev1.Pod{pod("r-0", "old", false), pod("r-1", "new", true)}); got != nil {
		t.Fatalf("in flight %v, want none (a pod on the old version is not a restart of this rollout)", got.Name)
	}
}
