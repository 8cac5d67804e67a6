package dataplane

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/test/framework"
)

// A consumer that drains its work for 20 s after SIGTERM keeps working through its termination
// after a rotation: the old user is removed from the nodes only after the last pod of the old
// template has stopped (its consumer ended, or the pod gone), not when the Deployment's status (without its terminatingReplicas, behind a
// feature gate) already counts the rollout done. No command of any consumer pod fails.
func TestTerminatingConsumerPodsAreWaitedFor(t *testing.T) {
	const linger = 20 * time.Second
	ns := fw.Namespace(t, "terminating")
	vc := fw.VaultConnection(t, "vault-terminating", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(2), framework.WithConsumers("app"))
	cur := fw.WaitReady(t, rc, 3*time.Minute)
	app := fw.StartConsumers(t, ns, "app", 1, "cache:6379", "cache-credentials", framework.Lingering(linger))
	oldUser, oldPass, _ := fw.Credentials(rc)
	ctx := context.Background()
	olds, err := fw.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=app"})
	if err != nil || len(olds.Items) != 1 {
		t.Fatalf("consumer pods %d, %v", len(olds.Items), err)
	}
	oldPod := olds.Items[0].Name
	primary := fw.RedisPods(t, rc)[0]

	// When the old pod is gone, and when the old user stops being accepted on the primary.
	var mu sync.Mutex
	var podGone, userGone time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			p, err := fw.Clientset.CoreV1().Pods(ns).Get(ctx, oldPod, metav1.GetOptions{})
			ended := apierrors.IsNotFound(err) // or its consumer has stopped, the pod object not yet removed
			if err == nil {
				for _, c := range p.Status.ContainerStatuses {
					ended = ended || (c.Name == "consumer" && c.State.Terminated != nil)
				}
			}
			gone := !accepts(framework.PodAddr(&primary), oldUser, oldPass)
			mu.Lock()
			if ended && podGone.IsZero() {
				podGone = time.Now()
			}
			if gone && userGone.IsZero() {
				userGone = time.Now()
			}
			mu.Unlock()
		}
	})
	rotatedAt := time.Now()
	fw.RotateNow(t, rc)
	framework.Eventually(t, 3*time.Minute, func() string { return rotated(t, rc, cur.Status.Credential.Version) })
	framework.Eventually(t, 10*time.Second, func() string {
		mu.Lock()
		defer mu.Unlock()
		if podGone.IsZero() || userGone.IsZero() {
			return fmt.Sprintf("old pod gone at %v, old user gone at %v", podGone, userGone)
		}
		return ""
	})
	close(stop)
	wg.Wait()
	t.Logf("rotation at 0; old consumer pod stopped at %s, old user refused on the primary at %s", podGone.Sub(rotatedAt).Round(time.Millisecond), userGone.Sub(rotatedAt).Round(time.Millisecond))
	if userGone.Before(podGone) {
		t.Errorf("the old user was removed %s before the old consumer pod stopped", podGone.Sub(userGone))
	}
	if podGone.Sub(rotatedAt) < linger {
		t.Errorf("the old pod stopped %s after the rotation, before its %s of lingering: the test does not test a terminating pod", podGone.Sub(rotatedAt), linger)
	}
	if _, failed, errs := app.Totals(); failed != 0 {
		t.Errorf("%d consumer commands failed: %v", failed, errs)
	}
}
