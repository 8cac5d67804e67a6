package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// BenchmarkRolloutOverheadPerPod measures what a rotation with rollout.redisPods Restart costs
// beyond the pods' own readiness: from rotate-now to a finished rollout (the users on every node,
// the three Redis pods on the real node restarted one at a time, the old users retired and the
// old lease revoked), less the time each restarted pod took from its creation to Ready, per pod.
// On the real node the overhead includes each old pod's end (Redis shutting down, its kubelet
// reporting it gone, before the StatefulSet controller creates the replacement), a few seconds
// per pod on the test ground; keyroll's own steps are driven by watches.
func BenchmarkRolloutOverheadPerPod(b *testing.B) {
	ns := fmt.Sprintf("bench-%d", time.Now().UnixNano()%100000)
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	vc := &v1alpha1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault-" + ns}, Spec: v1alpha1.VaultConnectionSpec{
		Address: ground.Vault.Addr, AllowedNamespaces: []string{ns},
		Auth: v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: operatorRole}},
	}}
	rc := &v1alpha1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orders"}, Spec: v1alpha1.RedisClusterSpec{
		Replicas: 3, Version: redisVersion,
		Rollout: v1alpha1.RolloutSpec{RedisPods: v1alpha1.RedisPodsRestart},
		Credentials: v1alpha1.CredentialsSpec{Source: v1alpha1.SourceVaultLease, VaultLease: &v1alpha1.VaultLeaseSource{
			ConnectionRef: v1alpha1.ConnectionReference{Name: vc.Name}, Path: "database/creds/orders"}},
	}}
	for _, o := range []client.Object{vc, rc} {
		if err := k8s.Create(context.Background(), o); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = k8s.Delete(context.Background(), o) })
	}
	benchRolledOut(b, rc, "")
	var overhead, total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		value := fmt.Sprint(i + 1)
		patchRotateNow(b, rc, value)
		benchRolledOut(b, rc, value)
		took := time.Since(start)
		total += took
		overhead += took - podReadiness(b, rc)
	}
	b.ReportMetric(overhead.Seconds()/float64(3*b.N), "s-overhead/pod")
	b.ReportMetric(total.Seconds()/float64(b.N), "s/rotation")
}

func patchRotateNow(b *testing.B, rc *v1alpha1.RedisCluster, value string) {
	cur := &v1alpha1.RedisCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), cur); err != nil {
		b.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[v1alpha1.AnnotationRotateNow] = value
	if err := k8s.Patch(context.Background(), cur, patch); err != nil {
		b.Fatal(err)
	}
}

// benchRolledOut waits until the rotate-now value is acknowledged, the rollout is over and only
// one lease is left.
func benchRolledOut(b *testing.B, rc *v1alpha1.RedisCluster, ack string) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		cur := &v1alpha1.RedisCluster{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), cur); err != nil {
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
func podReadiness(b *testing.B, rc *v1alpha1.RedisCluster) time.Duration {
	list := &corev1.PodList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(rc.Namespace), client.MatchingLabels{v1alpha1.LabelCluster: rc.Name}); err != nil {
		b.Fatal(err)
	}
	var sum time.Duration
	for _, p := range list.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				sum += c.LastTransitionTime.Sub(p.CreationTimestamp.Time)
			}
		}
	}
	return sum
}
