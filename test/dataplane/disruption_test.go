package dataplane

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// evict asks the eviction API (policy/v1) to evict a pod, as a node drain does.
func evict(ns, pod string) error {
	return cs.CoreV1().Pods(ns).EvictV1(context.Background(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}})
}

// keyroll's PodDisruptionBudget lets a drain take one Redis pod at a time: with three pods Ready,
// evicting a replica succeeds, and evicting a second one right after is refused (429) by the
// budget; the evicted pod comes back and the cluster is Ready again. keyroll wrote its
// StatefulSet and budget once: neither changed while the pod came back.
func TestEvictionOfASecondRedisPodIsRefused(t *testing.T) {
	namespace(t, "evict")
	vaultConnection(t, "vault-evict", "evict")
	rc := redisCluster(t, "evict", "cache", "vault-evict", "database/creds/orders", 3)
	waitReady(t, rc, 3*time.Minute)
	pdb := &policyv1.PodDisruptionBudget{}
	eventually(t, time.Minute, func() string {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "evict", Name: "cache-redis"}, pdb); err != nil {
			return err.Error()
		}
		if st := pdb.Status; st.ObservedGeneration != pdb.Generation || st.ExpectedPods != 3 || st.CurrentHealthy != 3 || st.DisruptionsAllowed != 1 {
			return fmt.Sprintf("budget status %+v", st)
		}
		return ""
	})
	sts := &appsv1.StatefulSet{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "evict", Name: "cache"}, sts); err != nil {
		t.Fatal(err)
	}
	before := runs(redisPods(t, rc))

	start := time.Now()
	if err := evict("evict", "cache-1"); err != nil {
		t.Fatalf("evicting cache-1 with three pods Ready: %v", err)
	}
	err := evict("evict", "cache-2")
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "disruption budget") {
		t.Fatalf("evicting cache-2 right after cache-1: want 429 TooManyRequests from the disruption budget, got %v", err)
	}
	t.Logf("second eviction refused %s after the first: %v", time.Since(start).Round(time.Millisecond), err)

	eventually(t, 2*time.Minute, func() string {
		pods := redisPods(t, rc)
		if len(pods) != 3 {
			return fmt.Sprintf("%d Redis pods", len(pods))
		}
		for _, p := range pods {
			if !podReady(p) {
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
	waitReady(t, rc, time.Minute)

	after := &appsv1.StatefulSet{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(sts), after); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pdb), pdb); err != nil {
		t.Fatal(err)
	}
	if after.Generation != sts.Generation || pdb.Generation != 1 {
		t.Errorf("keyroll rewrote its objects in a steady state: StatefulSet generation %d (then %d), budget generation %d",
			after.Generation, sts.Generation, pdb.Generation)
	}
}
