package dataplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// evict asks the eviction API (policy/v1) to evict a pod, as a node drain does.
func evict(ns, pod string) error {
	return fw.Clientset.CoreV1().Pods(ns).EvictV1(context.Background(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}})
}

// keyroll's PodDisruptionBudget lets a drain take one Redis pod at a time: with three pods Ready,
// evicting a replica succeeds, and evicting a second one right after is refused (429) by the
// budget; the evicted pod comes back and the cluster is Ready again. keyroll wrote its
// StatefulSet and budget once: neither changed while the pod came back.
func TestEvictionOfASecondRedisPodIsRefused(t *testing.T) {
	ns := fw.Namespace(t, "evict")
	vc := fw.VaultConnection(t, "vault-evict", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3))
	fw.WaitReady(t, rc, 3*time.Minute)
	pdb := &policyv1.PodDisruptionBudget{}
	framework.Eventually(t, time.Minute, func() string {
		if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "cache-redis"}, pdb); err != nil {
			return err.Error()
		}
		if st := pdb.Status; st.ObservedGeneration != pdb.Generation || st.ExpectedPods != 3 || st.CurrentHealthy != 3 || st.DisruptionsAllowed != 1 {
			return fmt.Sprintf("budget status %+v", st)
		}
		return ""
	})
	sts := &appsv1.StatefulSet{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "cache"}, sts); err != nil {
		t.Fatal(err)
	}
	before := runs(fw.RedisPods(t, rc))

	start := time.Now()
	if err := evict(ns, "cache-1"); err != nil {
		t.Fatalf("evicting cache-1 with three pods Ready: %v", err)
	}
	err := evict(ns, "cache-2")
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "disruption budget") {
		t.Fatalf("evicting cache-2 right after cache-1: want 429 TooManyRequests from the disruption budget, got %v", err)
	}
	t.Logf("second eviction refused %s after the first: %v", time.Since(start).Round(time.Millisecond), err)

	framework.Eventually(t, 2*time.Minute, func() string {
		pods := fw.RedisPods(t, rc)
		if len(pods) != 3 {
			return fmt.Sprintf("%d Redis pods", len(pods))
		}
		for _, p := range pods {
			if !framework.PodReady(&p) {
				return p.Name + " not Ready"
			}
		}
		now := runs(pods)
		if now["cache-1"].uid == before["cache-1"].uid || now["cache-2"].uid != before["cache-2"].uid {
			return fmt.Sprintf("cache-1 %s (before %s), cache-2 %s (before %s): want cache-1 replaced, cache-2 untouched",
				now["cache-1"].uid, before["cache-1"].uid, now["cache-2"].uid, before["cache-2"].uid)
		}
		return ""
	})
	t.Logf("cache-1 evicted and back, Ready, %s after its eviction", time.Since(start).Round(time.Millisecond))
	fw.WaitReady(t, rc, time.Minute)

	after := &appsv1.StatefulSet{}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(sts), after); err != nil {
		t.Fatal(err)
	}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(pdb), pdb); err != nil {
		t.Fatal(err)
	}
	if after.Generation != sts.Generation || pdb.Generation != 1 {
		t.Errorf("keyroll rewrote its objects in a steady state: StatefulSet generation %d (then %d), budget generation %d",
			after.Generation, sts.Generation, pdb.Generation)
	}
}

// changeTemplate gives the Redis pods a new template (a CPU request), which rolls them.
func changeTemplate(t *testing.T, rc *v1beta1.RedisCluster, cpu string) {
	t.Helper()
	cur := fw.Get(t, rc)
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}
	if err := fw.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// waitRestartOf waits until the watch has seen pod's deletion begin.
func waitRestartOf(t *testing.T, rw *framework.PodWatch, pod string) {
	t.Helper()
	framework.Eventually(t, 2*time.Minute, func() string {
		for _, r := range rw.Terminations() {
			if r.Pod == pod {
				return ""
			}
		}
		return fmt.Sprintf("%s not restarted yet (restarts %+v)", pod, rw.Terminations())
	})
}

// rolledOut waits until rc has no rollout and its want pods are Ready with the CPU request.
func rolledOut(t *testing.T, rc *v1beta1.RedisCluster, want int, cpu string) *v1beta1.RedisCluster {
	t.Helper()
	var cur *v1beta1.RedisCluster
	framework.Eventually(t, 5*time.Minute, func() string {
		cur = fw.Get(t, rc)
		if ro := cur.Status.Rollout; ro != nil {
			return fmt.Sprintf("rollout %+v", ro)
		}
		pods := fw.RedisPods(t, rc)
		if len(pods) != want {
			return fmt.Sprintf("%d Redis pods, want %d", len(pods), want)
		}
		for _, p := range pods {
			if !framework.PodReady(&p) || p.Spec.Containers[0].Resources.Requests.Cpu().String() != cpu {
				return fmt.Sprintf("%s: Ready %v, requests %v", p.Name, framework.PodReady(&p), p.Spec.Containers[0].Resources.Requests)
			}
		}
		return ""
	})
	return cur
}

// A pod deleted by someone else while the rollout restarts another is waited for: keyroll
// restarts no further pod until it is back and Ready (it comes back from the new template, and
// counts as updated), then goes on, the primary last, after its hand-over.
func TestEvictedPodDuringRolloutIsWaitedFor(t *testing.T) {
	ns := fw.Namespace(t, "evicted")
	vc := fw.VaultConnection(t, "vault-evicted", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3))
	fw.WaitReady(t, rc, 3*time.Minute)
	user, pass, _ := fw.Credentials(rc)
	const n = 1000
	writeKeys(t, framework.PodAddr(&fw.RedisPods(t, rc)[0]), user, pass, n)
	rw := watchRestarts(t, rc)

	changeTemplate(t, rc, "20m")
	waitRestartOf(t, rw, "cache-2")
	if err := fw.Client.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache-1"}}); err != nil {
		t.Fatal(err)
	}
	final := rolledOut(t, rc, 3, "20m")

	restarts := rw.Terminations()
	var order []string
	for i, r := range restarts {
		order = append(order, r.Pod)
		if i != 1 && len(r.NotReady) > 0 { // the second is the test's own deletion
			t.Errorf("keyroll restarted %s while %v were not Ready", r.Pod, r.NotReady)
		}
	}
	if want := []string{"cache-2", "cache-1", "cache-0"}; !slices.Equal(order, want) {
		t.Errorf("deletions %v, want %v: keyroll restarts cache-1 no second time (it came back on the new template), and the primary last", order, want)
	}
	if final.Status.Primary == "cache-0" {
		t.Error("cache-0 restarted as the primary")
	}
	for _, p := range fw.RedisPods(t, rc) {
		if got := countKeys(t, framework.PodAddr(&p), user, pass, n); got != n {
			t.Errorf("%s has %d of %d keys", p.Name, got, n)
		}
	}
}

// Scaling down while a rollout restarts a pod the scale-down removes: the rollout finishes on the
// pods that stay, and the primary's role goes to one of them before it restarts.
func TestScaleDownDuringRolloutFinishes(t *testing.T) {
	ns := fw.Namespace(t, "scaledown")
	vc := fw.VaultConnection(t, "vault-scaledown", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3))
	fw.WaitReady(t, rc, 3*time.Minute)
	user, pass, _ := fw.Credentials(rc)
	const n = 1000
	writeKeys(t, framework.PodAddr(&fw.RedisPods(t, rc)[0]), user, pass, n)
	rw := watchRestarts(t, rc)

	changeTemplate(t, rc, "30m")
	waitRestartOf(t, rw, "cache-2")
	cur := fw.Get(t, rc)
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Replicas = 2
	if err := fw.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
	final := rolledOut(t, rc, 2, "30m")
	if final.Status.Primary != "cache-1" {
		t.Errorf("status.primary %q, want cache-1, the pod that stays besides the restarted primary", final.Status.Primary)
	}
	for _, p := range fw.RedisPods(t, rc) {
		if got := countKeys(t, framework.PodAddr(&p), user, pass, n); got != n {
			t.Errorf("%s has %d of %d keys", p.Name, got, n)
		}
	}
	var order []string
	for _, r := range rw.Terminations() {
		order = append(order, r.Pod)
	}
	t.Logf("pods deleted, in order: %v (cache-2 by the rollout, then by the scale-down)", order)
}
