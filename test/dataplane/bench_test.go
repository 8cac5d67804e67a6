package dataplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// benchClusters is how many RedisClusters are rotated at once; they are created createBatch at
// a time.
const (
	benchClusters = 20
	createBatch   = 5
)

// phases are the moments of one cluster's rotation, seen by polling its status every 100 ms
// (framework.Eventually's interval).
type phases struct {
	asked, issued, nodes, consumers, revoked time.Time
}

// BenchmarkTwentyClustersRotateAtOnce rotates 20 real RedisClusters (3 Redis pods each, one
// consumer pod each running SET/GET non-stop) at once on the real node, and reports per cluster
// how long it took from the request to the new credential issued, on every node (confirmed),
// the consumers rolled out, and the old lease revoked, and how many client commands failed
// (the target is 0).
func BenchmarkTwentyClustersRotateAtOnce(b *testing.B) {
	ns := fw.Namespace(b, "bench")
	vc := fw.VaultConnection(b, "vault-bench", framework.Allow(ns))
	// The clusters are created a few at a time, so that sixty Redis pods and their consumers do
	// not all start at once on two cores. What is measured is the rotation, which starts once all
	// are Ready.
	start := time.Now()
	var clusters, batch []*v1beta1.RedisCluster
	for i := range benchClusters {
		name := fmt.Sprintf("c%02d", i)
		rc := fw.RedisCluster(b, ns, name, vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers(name+"-app"))
		clusters, batch = append(clusters, rc), append(batch, rc)
		if len(batch) == createBatch || i == benchClusters-1 {
			for _, rc := range batch {
				fw.WaitReady(b, rc, 10*time.Minute)
			}
			batch = nil
		}
	}
	var apps []*framework.Consumers
	for _, rc := range clusters {
		apps = append(apps, fw.StartConsumers(b, ns, rc.Name+"-app", 1, rc.Name+":6379", rc.Name+"-credentials"))
	}
	b.Logf("%d clusters and their consumers up in %s", benchClusters, time.Since(start).Round(time.Second))

	var all []phases
	for range b.N {
		b.ResetTimer()
		all = append(all, rotateAll(b, ns, clusters)...)
		b.StopTimer()
	}
	var failed int64
	var errs []string
	for _, a := range apps {
		_, f, e := a.Totals()
		failed, errs = failed+f, append(errs, e...)
	}
	report(b, all, failed)
	if failed > 0 {
		logUnusualEvents(b, ns)
		b.Errorf("%d client commands failed: %s", failed, strings.Join(errs, "\n"))
	}
}

// routine are the event reasons of every rotation; the others may explain a failed command.
var routine = map[string]bool{
	v1beta1.EventCredentialsIssued: true, v1beta1.EventRotationStarted: true, v1beta1.EventRotationFinished: true,
	v1beta1.EventUsersApplied: true, v1beta1.EventUsersRetired: true, v1beta1.EventConsumerRestarted: true,
	v1beta1.EventLeaseRevoked: true, "ScalingReplicaSet": true, "SuccessfulCreate": true, "SuccessfulDelete": true,
	"Scheduled": true, "Pulled": true, "Created": true, "Started": true, "Killing": true,
}

// logUnusualEvents logs the events of ns that are not routine (warnings, promotions, hand-overs,
// probe failures), with their times.
func logUnusualEvents(b *testing.B, ns string) {
	events, err := fw.Clientset.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Logf("listing the events of %s: %v", ns, err)
		return
	}
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeNormal && routine[e.Reason] {
			continue
		}
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		b.Logf("event %s %s %s/%s (x%d): %s", at.UTC().Format(time.RFC3339), e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Count, e.Message)
	}
}

// rotateAll asks every cluster of ns for a rotation at once and follows each through its phases.
func rotateAll(b *testing.B, ns string, clusters []*v1beta1.RedisCluster) []phases {
	b.Helper()
	type from struct {
		version, lease string
	}
	was := map[string]from{}
	for _, rc := range clusters {
		c := fw.Get(b, rc).Status.Credential
		was[rc.Name] = from{c.Version, c.Lease.LeaseID}
	}
	ph := make(map[string]*phases, len(clusters))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, rc := range clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := time.Now()
			fw.RotateNow(b, rc)
			mu.Lock()
			ph[rc.Name] = &phases{asked: at}
			mu.Unlock()
		}()
	}
	wg.Wait()
	framework.Eventually(b, 10*time.Minute, func() string {
		list := &v1beta1.RedisClusterList{}
		if err := fw.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			return err.Error()
		}
		now, pending := time.Now(), 0
		for i := range list.Items {
			rc := &list.Items[i]
			p, w := ph[rc.Name], was[rc.Name]
			c := rc.Status.Credential
			if p == nil || c == nil || c.Version == w.version {
				pending++
				continue
			}
			mark := func(t *time.Time, done bool) {
				if t.IsZero() && done {
					*t = now
				}
			}
			mark(&p.issued, true)
			u := framework.Condition(rc, v1beta1.ConditionUsersApplied)
			mark(&p.nodes, u != nil && u.Status == "True" && strings.Contains(u.Message, c.Version))
			mark(&p.consumers, !p.nodes.IsZero() && rc.Status.Rollout == nil)
			oldGone := !slices.ContainsFunc(rc.Status.Leases, func(l v1beta1.LeaseRecord) bool { return l.LeaseID == w.lease })
			mark(&p.revoked, !p.consumers.IsZero() && oldGone && len(rc.Status.RetiringUsers) == 0)
			if p.revoked.IsZero() {
				pending++
			}
		}
		if pending > 0 {
			return fmt.Sprintf("%d of %d clusters not through their rotation", pending, len(clusters))
		}
		return ""
	})
	out := make([]phases, 0, len(ph))
	for _, p := range ph {
		out = append(out, *p)
	}
	return out
}

// report puts the phase durations (median and maximum over the clusters, in seconds) and the
// failed commands into the benchmark's numbers.
func report(b *testing.B, all []phases, failed int64) {
	metric := func(name string, of func(p phases) time.Duration) {
		var d []float64
		for _, p := range all {
			d = append(d, of(p).Seconds())
		}
		slices.Sort(d)
		b.ReportMetric(d[len(d)/2], name+"-p50-s")
		b.ReportMetric(d[len(d)-1], name+"-max-s")
		// Logged too: a benchmark that fails prints no metrics.
		b.Logf("%s: p50 %.2f s, max %.2f s over %d rotations", name, d[len(d)/2], d[len(d)-1], len(d))
	}
	metric("issued", func(p phases) time.Duration { return p.issued.Sub(p.asked) })
	metric("on-every-node", func(p phases) time.Duration { return p.nodes.Sub(p.asked) })
	metric("consumers-done", func(p phases) time.Duration { return p.consumers.Sub(p.asked) })
	metric("old-lease-revoked", func(p phases) time.Duration { return p.revoked.Sub(p.asked) })
	b.ReportMetric(float64(failed), "failed-commands")
	b.ReportMetric(0, "ns/op") // the phases say it; one op is 20 rotations
}
