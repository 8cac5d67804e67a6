package dataplane

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// killRedis kills redis-server inside a pod's container with kubectl exec, as an OOM kill or a
// crash would end it: SIGKILL, no shutdown, no save. The test then sees the container restart.
func killRedis(t *testing.T, ns, pod string) {
	t.Helper()
	// The kill runs detached, a moment after the exec returns: the container ends with its Redis,
	// and an exec still running in it would end with it (exit 137).
	script := `(sleep 0.5; for p in /proc/[0-9]*; do [ "$(cat "$p/comm" 2>/dev/null)" = redis-server ] && kill -KILL "${p#/proc/}"; done) </dev/null >/dev/null 2>&1 &`
	if out, err := fw.Kubectl(nil, "exec", "-n", ns, pod, "-c", "redis", "--", "sh", "-c", script); err != nil {
		t.Fatalf("killing Redis in %s: %v\n%s", pod, err, out)
	}
}

// A replica's Redis killed inside its container: the kubelet restarts the container in the same
// pod (the start script runs again over the files of its first start), the replica becomes Ready
// again only once it has resynced, every key is back on it, the app user logs in there, and
// keyroll confirms that run of Redis again (status.nodes). Then the primary's: a replica is
// promoted, the old primary rejoins as a replica, and no node's data is wiped.
func TestCrashedRedisContainerRestartsInPlace(t *testing.T) {
	ns := fw.Namespace(t, "crash")
	vc := fw.VaultConnection(t, "vault-crash", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3))
	fw.WaitReady(t, rc, 3*time.Minute)
	user, pass, _ := fw.Credentials(rc)
	pods := fw.RedisPods(t, rc)
	const n = 2000
	writeKeys(t, framework.PodAddr(&pods[0]), user, pass, n)
	framework.Eventually(t, time.Minute, func() string {
		if got := countKeys(t, framework.PodAddr(&pods[1]), user, pass, n); got != n {
			return fmt.Sprintf("cache-1 has %d of %d keys", got, n)
		}
		return ""
	})
	before := runs(pods)["cache-1"]
	confirmed := nodeStatus(fw.Get(t, rc), "cache-1")

	start := time.Now()
	killRedis(t, ns, "cache-1")
	framework.Eventually(t, 2*time.Minute, func() string {
		for _, p := range fw.RedisPods(t, rc) {
			if p.Name != "cache-1" {
				continue
			}
			now := runs([]corev1.Pod{p})["cache-1"]
			if now.uid != before.uid {
				return fmt.Sprintf("cache-1 is a new pod (%s), want its container restarted in place", now.uid)
			}
			if now.restarts <= before.restarts || !framework.PodReady(&p) {
				return fmt.Sprintf("cache-1: %d restarts (before %d), Ready %v", now.restarts, before.restarts, framework.PodReady(&p))
			}
			return ""
		}
		return "cache-1 is gone"
	})
	t.Logf("cache-1's Redis container restarted in place and Ready again %s after the kill", time.Since(start).Round(time.Millisecond))
	addr := framework.PodAddr(&fw.RedisPods(t, rc)[1])
	if got := countKeys(t, addr, user, pass, n); got != n {
		t.Errorf("the restarted replica has %d of %d keys", got, n)
	}
	if !accepts(addr, user, pass) {
		t.Error("the app user does not log in on the restarted replica")
	}
	framework.Eventually(t, time.Minute, func() string {
		now := nodeStatus(fw.Get(t, rc), "cache-1")
		if now == nil || now.StartedAt == nil || confirmed == nil || confirmed.StartedAt == nil || !now.StartedAt.After(confirmed.StartedAt.Time) {
			return fmt.Sprintf("status.nodes for cache-1: %+v, before the kill %+v", now, confirmed)
		}
		return ""
	})
	// keyroll's status follows the pod's readiness with a reconcile's delay.
	framework.Eventually(t, time.Minute, func() string {
		if c := framework.Condition(fw.Get(t, rc), v1beta1.ConditionReady); c == nil || c.Status != "True" {
			return fmt.Sprintf("after the restart in place: Ready %+v", c)
		}
		return ""
	})

	// The primary's Redis killed: its container restarts in the same pod and, finding only
	// replicas of itself, starts as a replica of one of them rather than as an empty primary;
	// keyroll promotes the replica with the most data. No node loses a key.
	before = runs(fw.RedisPods(t, rc))["cache-0"]
	start = time.Now()
	killRedis(t, ns, "cache-0")
	var promoted string
	framework.Eventually(t, 2*time.Minute, func() string {
		cur := fw.Get(t, rc)
		if promoted = cur.Status.Primary; promoted == "cache-0" {
			return "status.primary is still cache-0"
		}
		for _, p := range fw.RedisPods(t, rc) {
			if p.Name == "cache-0" {
				if now := runs([]corev1.Pod{p})["cache-0"]; now.uid != before.uid || now.restarts <= before.restarts {
					return fmt.Sprintf("cache-0: pod %s with %d restarts (before %s, %d): want its container restarted in place", now.uid, now.restarts, before.uid, before.restarts)
				}
			}
			if !framework.PodReady(&p) {
				return p.Name + " is not Ready"
			}
			if role := p.Labels[v1beta1.LabelRole]; (p.Name == promoted) != (role == v1beta1.RolePrimary) {
				return fmt.Sprintf("%s is labelled %q with %s the primary", p.Name, role, promoted)
			}
		}
		return ""
	})
	t.Logf("cache-0's Redis killed: %s promoted, every pod Ready again %s after the kill", promoted, time.Since(start).Round(time.Millisecond))
	for _, p := range fw.RedisPods(t, rc) {
		if got := countKeys(t, framework.PodAddr(&p), user, pass, n); got != n {
			t.Errorf("%s has %d of %d keys after the primary's crash", p.Name, got, n)
		}
	}
	after := framework.RedisClient(framework.PodAddr(&fw.RedisPods(t, rc)[ordinalOf(promoted)]), user, pass)
	defer after.Close()
	if _, err := after.Set(context.Background(), "after-crash", "1", 0).Result(); err != nil {
		t.Errorf("the promoted primary %s refuses a write: %v", promoted, err)
	}
}

func ordinalOf(pod string) int {
	n, _ := strconv.Atoi(pod[strings.LastIndexByte(pod, '-')+1:])
	return n
}

// nodeStatus is the status.nodes entry of a pod, or nil.
func nodeStatus(rc *v1beta1.RedisCluster, pod string) *v1beta1.NodeStatus {
	for i := range rc.Status.Nodes {
		if rc.Status.Nodes[i].Pod == pod {
			return &rc.Status.Nodes[i]
		}
	}
	return nil
}
