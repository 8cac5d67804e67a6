package rediscluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/redisnode"
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
		"deleted 5s ago, still reported Ready":  {pod(true, time.Hour, 5*time.Second), v1beta1.ReasonApplying},
		"deleted 15s ago, still reported Ready": {pod(true, time.Hour, 15*time.Second), v1beta1.ReasonNodeNotReady},
		"not Ready for 5s":                      {pod(false, 5*time.Second, 0), v1beta1.ReasonApplying},
		"not Ready for 15s":                     {pod(false, 15*time.Second, 0), v1beta1.ReasonNodeNotReady},
		"not Ready for 15s, deleted 5s ago":     {pod(false, 15*time.Second, 5*time.Second), v1beta1.ReasonNodeNotReady},
		"created 5s ago, no conditions yet":     {&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orders-2", CreationTimestamp: *ago(5 * time.Second)}}, v1beta1.ReasonApplying},
		"created 15s ago, no conditions yet":    {&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orders-2", CreationTimestamp: *ago(15 * time.Second)}}, v1beta1.ReasonNodeNotReady},
	}
	rc := &v1beta1.RedisCluster{}
	rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: 10 * time.Second}
	s := &usersSyncer{Clock: clocktesting.NewFakeClock(now)}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := s.notRunning(rc, tc.pod); got.reason != tc.want {
				t.Errorf("reason %s (%s), want %s", got.reason, got.msg, tc.want)
			}
		})
	}
}

// A retiring user leaves each node confirmed: a node that answers ACL DELUSER but still has the
// user stops the sync there (the nodes after it are not changed), naming the pod and the user,
// and status.retiringUsers keeps the user until every node is confirmed without it.
func TestRetiredUserIsConfirmedGoneOnEachNode(t *testing.T) {
	ctx := context.Background()
	g := newGround(t, 3)
	rc, redis, s, conds := g.rc, g.redis, g.syncer, g.conds
	rc.Status.RetiringUsers = []string{"V_OLD"}
	for i := range 3 {
		redis.AddUser(addr(i), redisnode.User{Name: "V_OLD", PasswordHash: render.HashPassword("old")}, false)
	}
	cur := render.NewCredential("V_NEW", "new")
	want := g.want(&cur)
	redis.KeepsDeleted[addr(1)] = true

	done, _, err := s.Sync(ctx, rc, conds, want)

	if done || err != nil {
		t.Fatalf("Sync: done %v, err %v; want not done while orders-1 still has V_OLD", done, err)
	}
	c := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionUsersApplied)
	if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "1 of 3") || !strings.Contains(c.Message, "orders-1") || !strings.Contains(c.Message, "V_OLD") {
		t.Errorf("UsersApplied %+v: want False, 1 of 3 confirmed, naming orders-1 and V_OLD", c)
	}
	if !slices.Equal(rc.Status.RetiringUsers, []string{"V_OLD"}) {
		t.Errorf("retiring users %v, want V_OLD kept", rc.Status.RetiringUsers)
	}
	if !redis.Accepts(addr(0), "V_OLD", "old") || redis.Accepts(addr(0), cur.Username, cur.Password) {
		t.Error("orders-0, after orders-1, was changed")
	}

	delete(redis.KeepsDeleted, addr(1))
	if done, _, err := s.Sync(ctx, rc, conds, want); !done || err != nil {
		t.Fatalf("Sync once orders-1 deletes users: done %v, err %v", done, err)
	}
	for i := range 3 {
		if slices.Contains(redis.Users(addr(i)), "V_OLD") || !redis.Accepts(addr(i), cur.Username, cur.Password) {
			t.Errorf("orders-%d has users %v: want V_NEW and not V_OLD", i, redis.Users(addr(i)))
		}
	}
	if len(rc.Status.RetiringUsers) != 0 {
		t.Errorf("retiring users %v once every node is confirmed without them", rc.Status.RetiringUsers)
	}
}

func addr(i int) string { return fmt.Sprintf("10.0.0.%d:%d", 10+i, render.RedisPort) }
