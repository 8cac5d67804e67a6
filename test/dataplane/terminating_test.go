package dataplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
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
	framework.ReliabilityRow(t, "rollouts", "consumer pod drains for 20 s after SIGTERM",
		"the old user leaves the nodes only after the last pod of the old template has stopped; no consumer command fails",
		func() string {
			ok, _, _ := app.Totals()
			return fmt.Sprintf("the old pod stopped %s after the rotation, the old user was refused on the primary %s after it; %d consumer commands answered, none failed",
				podGone.Sub(rotatedAt).Round(100*time.Millisecond), userGone.Sub(podGone).Round(100*time.Millisecond), ok)
		})
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

// A rollout that outlasts the superseded lease's term: two-minute leases, and a consumer whose new
// pod counts as available only after five minutes (minReadySeconds), so that its old pod goes on
// with the old credential meanwhile. The superseded lease is renewed throughout (Vault, asked as
// root every second, has it live), its user logs in on every node every second until the rollout
// ends, and then the lease is revoked and the user refused. Also with spec.vaultPlugin, where
// Vault's plugin itself creates the user on the cluster's primary, and deletes it there when the
// lease lapses. The two run side by side.
func TestSupersededLeaseOutlivesALongRollout(t *testing.T) {
	for _, v := range []struct {
		name   string
		plugin bool
	}{{"direct", false}, {"vaultPlugin", true}} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			supersededLeaseOutlivesALongRollout(t, v.plugin)
		})
	}
}

func supersededLeaseOutlivesALongRollout(t *testing.T, plugin bool) {
	const hold = 5 * time.Minute
	base := "long-rollout"
	if plugin {
		base = "long-rollout-plugin"
	}
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, "vault-"+base, framework.Allow(ns))
	opts := []framework.ClusterOption{framework.Replicas(2), framework.WithConsumers("app"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: 10 * time.Minute}
	}}
	var rc *v1beta1.RedisCluster
	if plugin {
		rc = pluginCluster(t, ns, vc.Name, fw.Path(base), opts...)
		// brief's leases of two minutes, from a connection to the cluster's own primary.
		connectPlugin(t, rc, testground.RedisRole{Name: base, DefaultTTL: 2 * time.Minute, MaxTTL: time.Hour})
	} else {
		rc = fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("brief"), opts...)
	}
	cur := fw.WaitReady(t, rc, 3*time.Minute)
	app := fw.StartConsumers(t, ns, "app", 1, "cache:6379", "cache-credentials", func(d *appsv1.Deployment) {
		d.Spec.MinReadySeconds = int32(hold.Seconds())
	})
	oldUser, oldPass, _ := fw.Credentials(rc)
	oldLease := cur.Status.Credential.Lease.LeaseID

	rotatedAt := time.Now()
	fw.RotateNow(t, rc)
	var problems []string
	checks := 0
	var took time.Duration
	framework.ReliabilityRow(t, "rollouts", "rollout outlasts the superseded lease's term (2-minute leases, a consumer Available only after 5 minutes)"+map[bool]string{true: ", with spec.vaultPlugin", false: ""}[plugin],
		"the superseded lease renewed throughout, its user logs in on every node until the rollout ends, then revoked; no consumer command fails",
		func() string {
			sent, _, _ := app.Totals()
			return fmt.Sprintf("rollout done %s after the rotation; the superseded lease live in Vault and its user accepted on every node at each of %d checks, one a second; then revoked and refused; %d consumer commands answered, none failed", took.Round(time.Second), checks, sent)
		})
	// The rollout has ended once the status has the new credential, no rollout, and the old lease
	// no longer superseded (being revoked, or gone): before the rollout starts it is still
	// superseded. The reconcile that ends the rollout retires the old user and lease before it
	// writes that status, so a check that finds them gone waits a few seconds for the status
	// before it counts as a problem.
	ended := func() bool {
		c := fw.Get(t, rc)
		if c.Status.Credential == nil || c.Status.Credential.Version == cur.Status.Credential.Version || c.Status.Rollout != nil {
			return false
		}
		return !slices.ContainsFunc(c.Status.Leases, func(l v1beta1.LeaseRecord) bool {
			return l.LeaseID == oldLease && l.State == v1beta1.LeaseSuperseded
		})
	}
	endedSoon := func() bool {
		return framework.Poll(5*time.Second, func() string { return map[bool]string{true: "", false: "not ended"}[ended()] }) == ""
	}
	for time.Since(rotatedAt) < hold+2*time.Minute && !ended() {
		var found []string
		live, expiry := fw.LeaseExists(oldLease)
		if !live {
			found = append(found, fmt.Sprintf("%s into the rollout: the superseded lease is gone from Vault", time.Since(rotatedAt).Round(time.Second)))
		}
		if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
			found = append(found, fmt.Sprintf("%s into the rollout: %s", time.Since(rotatedAt).Round(time.Second), msg))
		}
		if len(found) > 0 && endedSoon() {
			break
		}
		problems = append(problems, found...)
		if checks++; checks%30 == 0 {
			t.Logf("%s into the rollout: superseded lease live, expires in %s", time.Since(rotatedAt).Round(time.Second), time.Until(expiry).Round(time.Second))
		}
		if len(problems) > 5 {
			break
		}
		time.Sleep(time.Second)
	}
	took = time.Since(rotatedAt)
	t.Logf("rollout done %s after the rotation (%d checks of the superseded lease and user)", took.Round(time.Second), checks)
	if len(problems) > 0 {
		t.Fatalf("%s", strings.Join(problems, "\n"))
	}
	if took < hold {
		t.Fatalf("the rollout ended %s after the rotation, before the consumer's %s: the test does not test a long rollout", took, hold)
	}
	framework.Eventually(t, time.Minute, func() string { return rotated(t, rc, cur.Status.Credential.Version) })
	framework.Eventually(t, 30*time.Second, func() string {
		if live, _ := fw.LeaseExists(oldLease); live {
			return "the superseded lease is still live after the rollout"
		}
		return fw.OnEveryPod(rc, oldUser, oldPass, false)
	})
	if _, failed, errs := app.Totals(); failed != 0 {
		t.Errorf("%d consumer commands failed: %v", failed, errs)
	}
}
