package dataplane

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/rediscluster"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/test/framework"
)

// A primary whose readiness probe fails while its Redis runs on (as when a busy node runs the
// probe too late) is not lost: keyroll asks the node, finds it answering as the primary, and
// promotes no replica, however long the pod stays not Ready. The probe is made to fail by taking
// INFO from the probe user on the primary (its liveness probe, a PING, goes on passing, so that
// the kubelet does not restart Redis meanwhile); it is given back afterwards.
func TestPrimaryWhoseProbeFailsIsNotReplaced(t *testing.T) {
	ns := fw.Namespace(t, "busy")
	vc := fw.VaultConnection(t, "vault-busy", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3))
	fw.WaitReady(t, rc, 3*time.Minute)
	before := runs(fw.RedisPods(t, rc))
	admin := framework.RedisClient(framework.PodAddr(&fw.RedisPods(t, rc)[0]), render.AdminUser, fw.AdminPassword(rc))
	defer admin.Close()
	probeInfo := func(rule string) {
		t.Helper()
		if err := admin.Do(context.Background(), "ACL", "SETUSER", render.ProbeUser, rule).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s %s on cache-0: %v", render.ProbeUser, rule, err)
		}
	}
	// The events about the cluster so far: promotions counts those that come after.
	eventsBefore := framework.Reasons(fw.ClusterEvents(t, ns, rc.Name))
	start := time.Now()
	probeInfo("-info")
	restored := false
	defer func() {
		if !restored {
			probeInfo("+info")
		}
	}()

	framework.Eventually(t, time.Minute, func() string {
		if p := fw.RedisPods(t, rc)[0]; framework.PodReady(&p) {
			return "cache-0 is still Ready"
		}
		return ""
	})
	notReady := time.Now()
	t.Logf("cache-0 not Ready %s after its probe user lost INFO", notReady.Sub(start).Round(time.Millisecond))
	// Past LostAfter, and a reconcile or two after it (keyroll looks again every LostAfter).
	for time.Since(notReady) < rediscluster.PrimaryLostAfter+15*time.Second {
		if got := fw.Get(t, rc).Status.Primary; got != "cache-0" {
			t.Fatalf("status.primary %s %s after cache-0 stopped being Ready: a primary that answers was replaced", got, time.Since(notReady).Round(time.Second))
		}
		time.Sleep(time.Second)
	}
	probeInfo("+info")
	restored = true
	fw.WaitReady(t, rc, 2*time.Minute)

	for _, p := range fw.RedisPods(t, rc) {
		if role := p.Labels[v1beta1.LabelRole]; (p.Name == "cache-0") != (role == v1beta1.RolePrimary) {
			t.Errorf("%s is labelled %q with cache-0 the primary", p.Name, role)
		}
		if now := runs([]corev1.Pod{p})[p.Name]; now != before[p.Name] {
			t.Errorf("%s: pod %s with %d restarts, before %s with %d: want it untouched", p.Name, now.uid, now.restarts, before[p.Name].uid, before[p.Name].restarts)
		}
	}
	if got := promotions(t, rc, eventsBefore); got != 0 {
		t.Errorf("%d PrimaryPromoted events since cache-0's probe began to fail, want none", got)
	}
}

// promotions counts the PrimaryPromoted events about rc beyond those in before (its events'
// reasons, framework.Reasons, when the probe began to fail).
func promotions(t *testing.T, rc *v1beta1.RedisCluster, before []string) int {
	t.Helper()
	added := framework.NewReasons(before, framework.Reasons(fw.ClusterEvents(t, rc.Namespace, rc.Name)))
	return len(slices.DeleteFunc(added, func(r string) bool { return r != v1beta1.EventPrimaryPromoted }))
}
