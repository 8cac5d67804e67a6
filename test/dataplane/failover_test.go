package dataplane

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// watchRestarts follows the Redis pods of rc: their terminations, in order.
func watchRestarts(t *testing.T, rc *v1beta1.RedisCluster) *framework.PodWatch {
	t.Helper()
	return fw.WatchPods(t, rc.Namespace, v1beta1.LabelCluster+"="+rc.Name)
}

// The acceptance test of safe restarts (issue 16): three Redis pods with 10,000 keys and two
// consumer pods writing and reading through the client Service; a change of resources (a new pod
// template) restarts the pods one at a time, replicas first, each only while every other pod is
// Ready (a replica is Ready once linked and synced); before the primary restarts its role moves
// to a replica by FAILOVER, and the role label (so the client Service) with it. Afterwards every
// node has every key, the consumers lost no acknowledged write, and their longest outage is
// reported (target under 2 s).
func TestVersionChangeRollsReplicasFirstThenFailsOver(t *testing.T) {
	ns := fw.Namespace(t, "failover")
	vc := fw.VaultConnection(t, "vault-failover", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("app"))
	rc = fw.WaitReady(t, rc, 3*time.Minute)
	if rc.Status.Primary != "cache-0" {
		t.Fatalf("status.primary %q, want cache-0 for a new cluster", rc.Status.Primary)
	}
	user, pass, _ := fw.Credentials(rc)
	pods := fw.RedisPods(t, rc)
	writeKeys(t, framework.PodAddr(&pods[0]), user, pass, keys)
	framework.Eventually(t, time.Minute, func() string {
		for _, p := range pods[1:] {
			if got := countKeys(t, framework.PodAddr(&p), user, pass, keys); got != keys {
				return fmt.Sprintf("%s has %d of %d keys", p.Name, got, keys)
			}
		}
		return ""
	})
	app := fw.StartConsumers(t, ns, "app", 2, "cache:6379", "cache-credentials")
	rw := watchRestarts(t, rc)
	_, failedBefore, _ := app.Totals()

	// The events about the cluster so far: those of the change are the ones that come after.
	eventsBefore := framework.Reasons(fw.ClusterEvents(t, ns, rc.Name))
	start := time.Now()
	patch := client.MergeFrom(rc.DeepCopy())
	rc.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}}
	if err := fw.Client.Patch(context.Background(), rc, patch); err != nil {
		t.Fatal(err)
	}
	var final *v1beta1.RedisCluster
	framework.Eventually(t, 6*time.Minute, func() string {
		final = fw.Get(t, rc)
		if ro := final.Status.Rollout; ro != nil {
			return fmt.Sprintf("rollout %+v", ro)
		}
		if len(rw.Terminations()) < 3 {
			return fmt.Sprintf("%d pods restarted", len(rw.Terminations()))
		}
		for _, p := range fw.RedisPods(t, rc) {
			if !framework.PodReady(&p) || p.Spec.Containers[0].Resources.Requests.Cpu().MilliValue() != 10 {
				return fmt.Sprintf("%s: Ready %v, resources %v", p.Name, framework.PodReady(&p), p.Spec.Containers[0].Resources)
			}
		}
		return ""
	})
	took := time.Since(start)

	restarts := rw.Terminations()
	var order []string
	for _, r := range restarts {
		order = append(order, r.Pod)
		if len(r.NotReady) > 0 {
			t.Errorf("%s was restarted while %v were not Ready (not in sync)", r.Pod, r.NotReady)
		}
	}
	if want := []string{"cache-2", "cache-1", "cache-0"}; !slices.Equal(order, want) {
		t.Fatalf("restart order %v, want %v: replicas first, the primary last, each once", order, want)
	}
	if r := restarts[2]; r.Labels[v1beta1.LabelRole] != v1beta1.RoleReplica {
		t.Errorf("cache-0 began its restart labelled %q: want replica, its primary role handed over first", r.Labels[v1beta1.LabelRole])
	}
	newPrimary := final.Status.Primary
	if newPrimary != "cache-1" && newPrimary != "cache-2" {
		t.Fatalf("status.primary %q after the rollout: want a replica that took over by FAILOVER", newPrimary)
	}
	admin := fw.AdminPassword(rc)
	byName := map[string]corev1.Pod{}
	for _, p := range fw.RedisPods(t, rc) {
		byName[p.Name] = p
		st, err := node(framework.PodAddr(&p), admin).Replication(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		wantRole, wantLabel := "slave", v1beta1.RoleReplica
		if p.Name == newPrimary {
			wantRole, wantLabel = "master", v1beta1.RolePrimary
		}
		if st.Role != wantRole || p.Labels[v1beta1.LabelRole] != wantLabel {
			t.Errorf("%s is a %s labelled %q; want a %s labelled %q", p.Name, st.Role, p.Labels[v1beta1.LabelRole], wantRole, wantLabel)
		}
		if got := countKeys(t, framework.PodAddr(&p), user, pass, keys); got != keys {
			t.Errorf("%s has %d of %d keys after the rollout", p.Name, got, keys)
		}
	}
	// The client Service sends clients to the new primary alone.
	framework.Eventually(t, 30*time.Second, func() string {
		eps := &discoveryv1.EndpointSliceList{}
		if err := fw.Client.List(context.Background(), eps, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: "cache"}); err != nil {
			return err.Error()
		}
		var ips []string
		for _, s := range eps.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready == nil || *e.Conditions.Ready {
					ips = append(ips, e.Addresses...)
				}
			}
		}
		if len(ips) != 1 || ips[0] != byName[newPrimary].Status.PodIP {
			return fmt.Sprintf("the client Service's endpoints are %v, want %s's %s only", ips, newPrimary, byName[newPrimary].Status.PodIP)
		}
		return ""
	})
	reasons := map[string]int{}
	for _, r := range framework.NewReasons(eventsBefore, framework.Reasons(fw.ClusterEvents(t, ns, rc.Name))) {
		reasons[r]++
	}
	if reasons[v1beta1.EventPrimaryHandedOver] != 1 || reasons[v1beta1.EventPrimaryPromoted] != 0 {
		t.Errorf("events since the change: %v; want one PrimaryHandedOver and no PrimaryPromoted", reasons)
	}

	app.Halt()
	ok, failed, lastErrors := app.Totals()
	var longest, lost int64
	for _, s := range app.Stats() {
		longest, lost = max(longest, s.LongestOutageMs), lost+s.LostWrites
	}
	t.Logf("pods rolled in %s (restarts %v at %v); consumers: %d commands ok, %d failed during the rollout, longest outage %d ms, %d lost writes; errors %v",
		took.Round(time.Millisecond), order, restartTimes(restarts, start), ok, failed-failedBefore, longest, lost, lastErrors)
	if lost != 0 {
		t.Errorf("%d acknowledged writes were lost", lost)
	}
	// The outage is the time until the client Service's endpoints reach kube-proxy after the label
	// moved: writes that reach the old primary meanwhile are refused (READONLY), none is lost. The
	// target is under 2 s (1.1 s measured with the machine otherwise idle); on this 2-core machine
	// under the whole suite's load the control plane has taken 2.3 and 5.6 s. The bound is what
	// tells one reconnect from waiting for the primary's restart, or losing it.
	if longest > 10000 {
		t.Errorf("the consumers' longest outage was %d ms: want one reconnect (target under 2 s, bound 10 s)", longest)
	}
}

func restartTimes(rs []framework.Termination, start time.Time) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.At.Sub(start).Round(10*time.Millisecond).String())
	}
	return out
}
