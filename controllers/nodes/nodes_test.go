package nodes

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// A Redis node that does not run is waited for until it has not run for readinessTimeout, timed
// from when it stopped: a pod being deleted that still reports Ready (its kubelet has not
// reported the end yet) stopped when its deletion began, not when it was created an hour ago.
func TestNotRunningIsTimedFromWhenThePodStopped(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(-d))) }
	const grace = 30 // seconds
	pod := func(ready bool, readySince time.Duration, deletedAgo time.Duration) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orders-2", CreationTimestamp: *ago(time.Hour)}}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: *ago(readySince)}}
		if deletedAgo > 0 {
			// The API server sets deletionTimestamp to the end of the grace period.
			p.DeletionTimestamp = ptr.To(metav1.NewTime(now.Add(-deletedAgo + grace*time.Second)))
			p.DeletionGracePeriodSeconds = ptr.To[int64](grace)
		}
		return p
	}
	cases := map[string]struct {
		pod  *corev1.Pod
		want string
	}{
		"deleted 5s ago, still reported Ready":  {pod(true, time.Hour, 5*time.Second), v1alpha1.ReasonApplying},
		"deleted 15s ago, still reported Ready": {pod(true, time.Hour, 15*time.Second), v1alpha1.ReasonNodeNotReady},
		"not Ready for 5s":                      {pod(false, 5*time.Second, 0), v1alpha1.ReasonApplying},
		"not Ready for 15s":                     {pod(false, 15*time.Second, 0), v1alpha1.ReasonNodeNotReady},
		"not Ready for 15s, deleted 5s ago":     {pod(false, 15*time.Second, 5*time.Second), v1alpha1.ReasonNodeNotReady},
		"created 5s ago, no conditions yet":     {&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orders-2", CreationTimestamp: *ago(5 * time.Second)}}, v1alpha1.ReasonApplying},
		"created 15s ago, no conditions yet":    {&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orders-2", CreationTimestamp: *ago(15 * time.Second)}}, v1alpha1.ReasonNodeNotReady},
	}
	rc := &v1alpha1.RedisCluster{}
	rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: 10 * time.Second}
	s := &Syncer{Clock: clocktesting.NewFakeClock(now)}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := s.notRunning(rc, tc.pod); got.reason != tc.want {
				t.Errorf("reason %s (%s), want %s", got.reason, got.msg, tc.want)
			}
		})
	}
}
