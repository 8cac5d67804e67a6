package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// BenchmarkRolloutOverheadPerPod measures what a rotation with rollout.redisPods Restart costs
// beyond the pods' own readiness: from rotate-now to a finished rollout (the users on every node,
// the three Redis pods on the real node restarted one at a time, the old users retired and the
// old lease revoked), less the time each restarted pod took from its creation to Ready, per pod.
// On the real node the overhead includes each old pod's end (Redis shutting down, its kubelet
// reporting it gone, before the StatefulSet controller creates the replacement), a few seconds
// per pod on the test ground; keyroll's own steps are driven by watches.
func BenchmarkRolloutOverheadPerPod(b *testing.B) {
	// The benchmark function runs once per b.N tried: each run has its own namespace.
	base := fmt.Sprintf("bench-%d", time.Now().UnixNano()%100000)
	ns := fw.Namespace(b, base)
	vc := fw.VaultConnection(b, "vault-"+base, framework.Allow(ns))
	rc := fw.RedisCluster(b, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(3), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.RedisPods = v1beta1.RedisPodsRestart
	})
	benchRolledOut(b, rc, "")
	var overhead, total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		value := fw.RotateNow(b, rc)
		benchRolledOut(b, rc, value)
		took := time.Since(start)
		total += took
		overhead += took - podReadiness(b, rc)
	}
	b.ReportMetric(overhead.Seconds()/float64(3*b.N), "s-overhead/pod")
	b.ReportMetric(total.Seconds()/float64(b.N), "s/rotation")
}

// benchRolledOut waits until the rotate-now value is acknowledged, the rollout is over and only
// one lease is left. It polls every 5 ms, not every 100 ms as framework.Eventually does: the wait
// is part of what the benchmark measures.
func benchRolledOut(b *testing.B, rc *v1beta1.RedisCluster, ack string) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		cur := &v1beta1.RedisCluster{}
		if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), cur); err != nil {
			b.Fatal(err)
		}
		if cur.Status.RotateNowAcknowledged == ack && cur.Status.Rollout == nil && len(cur.Status.Leases) == 1 &&
			cur.Status.ReadyReplicas == 3 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Fatal("rollout did not finish")
}

// podReadiness sums, over the Redis pods, the time from creation to Ready.
func podReadiness(b *testing.B, rc *v1beta1.RedisCluster) time.Duration {
	var sum time.Duration
	for _, p := range fw.RedisPods(b, rc) {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				sum += c.LastTransitionTime.Sub(p.CreationTimestamp.Time)
			}
		}
	}
	return sum
}
