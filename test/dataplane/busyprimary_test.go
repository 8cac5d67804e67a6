package dataplane

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers/primary"
	"github.com/keyroll/keyroll/controllers/render"
)

// A primary whose readiness probe fails while its Redis runs on (as when a busy node runs the
// probe too late) is not lost: keyroll asks the node, finds it answering as the primary, and
// promotes no replica, however long the pod stays not Ready. The probe is made to fail by taking
// INFO from the probe user on the primary (its liveness probe, a PING, goes on passing, so that
// the kubelet does not restart Redis meanwhile); it is given back afterwards.
func TestPrimaryWhoseProbeFailsIsNotReplaced(t *testing.T) {
	namespace(t, "busy")
	vaultConnection(t, "vault-busy", "busy")
	rc := redisCluster(t, "busy", "cache", "vault-busy", "database/creds/orders", 3)
	waitReady(t, rc, 3*time.Minute)
	before := runs(redisPods(t, rc))
	admin := appClient(podAddr(redisPods(t, rc)[0]), render.AdminUser, adminPassword(t, rc))
	defer admin.Close()
	probeInfo := func(rule string) {
		t.Helper()
		if err := admin.Do(context.Background(), "ACL", "SETUSER", render.ProbeUser, rule).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s %s on cache-0: %v", render.ProbeUser, rule, err)
		}
	}
	start := time.Now()
	probeInfo("-info")
	restored := false
	defer func() {
		if !restored {
			probeInfo("+info")
		}
	}()

	eventually(t, time.Minute, func() string {
		if p := redisPods(t, rc)[0]; podReady(p) {
			return "cache-0 is still Ready"
		}
		return ""
	})
	notReady := time.Now()
	t.Logf("cache-0 not Ready %s after its probe user lost INFO", notReady.Sub(start).Round(time.Millisecond))
	// Past LostAfter, and a reconcile or two after it (keyroll looks again every LostAfter).
	for time.Since(notReady) < primary.LostAfter+15*time.Second {
		if got := get(t, rc).Status.Primary; got != "cache-0" {
			t.Fatalf("status.primary %s %s after cache-0 stopped being Ready: a primary that answers was replaced", got, time.Since(notReady).Round(time.Second))
		}
		time.Sleep(time.Second)
	}
	probeInfo("+info")
	restored = true
	waitReady(t, rc, 2*time.Minute)

	for _, p := range redisPods(t, rc) {
		if role := p.Labels[v1alpha1.LabelRole]; (p.Name == "cache-0") != (role == v1alpha1.RolePrimary) {
			t.Errorf("%s is labelled %q with cache-0 the primary", p.Name, role)
		}
		if now := runs([]corev1.Pod{p})[p.Name]; now != before[p.Name] {
			t.Errorf("%s: pod %s with %d restarts, before %s with %d: want it untouched", p.Name, now.uid, now.restarts, before[p.Name].uid, before[p.Name].restarts)
		}
	}
	if got := promotions(t, "busy", start); got != 0 {
		t.Errorf("%d PrimaryPromoted events since cache-0's probe began to fail, want none", got)
	}
}

// promotions counts the PrimaryPromoted events of ns's RedisClusters since start.
func promotions(t *testing.T, ns string, start time.Time) int {
	t.Helper()
	list := &corev1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		if e.InvolvedObject.Kind == "RedisCluster" && e.Reason == v1alpha1.EventPrimaryPromoted && !at.Before(start.Truncate(time.Second)) {
			n++
		}
	}
	return n
}
