package scale

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// BenchmarkBusyCluster's sizes: KEYROLL_BUSY_SIZE RedisClusters, and in a namespace of their own
// KEYROLL_BUSY_SECRETS Secrets and KEYROLL_BUSY_CONFIGMAPS ConfigMaps of foreignDataSize each, and
// KEYROLL_BUSY_DEPLOYMENTS Deployments (of no pods) that keyroll has nothing to do with.
var (
	busySize        = envInt("KEYROLL_BUSY_SIZE", 1000)
	busySecrets     = envInt("KEYROLL_BUSY_SECRETS", 10000)
	busyConfigMaps  = envInt("KEYROLL_BUSY_CONFIGMAPS", 10000)
	busyDeployments = envInt("KEYROLL_BUSY_DEPLOYMENTS", 2000)
)

// foreignNamespace holds the foreign objects; foreignDataSize is the data of each Secret and
// ConfigMap, so that caching them would show in the operator's memory.
const (
	foreignNamespace = "busy"
	foreignDataSize  = 2 << 10
)

// busyHead is the head of the docs' busy-cluster table, busyRows its rows from the last
// BenchmarkBusyCluster (one per run that finished: without and with the foreign objects), and
// busyTable the two.
const busyHead = "| N | foreign objects | all CredentialsReady | peak RSS | live heap | CPU | read by the operator while the foreign Secrets and ConfigMaps were created | … the Deployments |\n" +
	"|---|---|---|---|---|---|---|---|\n"

var busyRows []string

func busyTable() string { return busyHead + strings.Join(busyRows, "\n") }

// busy is what one run of BenchmarkBusyCluster measured: heap is the operator's heap in use after a
// garbage collection once all were ready; readData and readDeployments what it read (settledRead)
// while the foreign Secrets and ConfigMaps, then the Deployments, were created.
type busy struct {
	credentialsReady          time.Duration
	usage                     framework.Usage
	heap                      float64
	readData, readDeployments int64
}

// BenchmarkBusyCluster creates N RedisClusters at once on two fresh grounds: an empty one, and one
// where the foreign objects were created first (after the operator started, so that a watch of
// them would deliver them all). It reports the time until all are CredentialsReady, the operator's
// peak RSS (target ≤ 100 MiB at N = 1,000 with the foreign objects), live heap and CPU, and what it
// read while the foreign objects were created: it caches only the Secrets and ConfigMaps keyroll
// labels, so it reads next to nothing of them; Deployments it watches by their metadata.
func BenchmarkBusyCluster(b *testing.B) {
	busyRows = nil
	var without busy
	for _, name := range []string{"foreign=0", "foreign=yes"} {
		foreign := name == "foreign=yes"
		b.Run(name, func(b *testing.B) {
			var res busy
			for range b.N {
				res = busyCluster(b, busySize, foreign)
			}
			reportBusy(b, busySize, foreign, res)
			if !foreign {
				without = res
			} else if without.credentialsReady > 0 {
				fmt.Printf("busy: N=%d  with the foreign objects (%.0f MiB of data) against without: peak RSS %+.1f MiB, live heap %+.1f MiB\n",
					busySize, float64(busySecrets+busyConfigMaps)*foreignDataSize/(1<<20),
					float64(res.usage.PeakRSSBytes-without.usage.PeakRSSBytes)/(1<<20), (res.heap-without.heap)/(1<<20))
			}
		})
	}
	fmt.Println("busy: " + strings.ReplaceAll(busyTable(), "\n", "\nbusy: "))
	if len(busyRows) > 0 {
		writeSection(b, "busy-table", busyTable())
	}
}

// busyCluster is one run on a fresh ground.
func busyCluster(b *testing.B, n int, foreign bool) busy {
	b.Helper()
	b.StopTimer()
	r := startRun(b, fmt.Sprintf("busy-%d-foreign-%t", n, foreign), runOptions{})
	defer r.end()
	var res busy
	if foreign {
		res.readData, res.readDeployments = createForeign(b, r)
	}
	ready := watchReady(b, r)
	b.StartTimer()
	start := time.Now()
	createAll(b, r.c, r.ns, "c", n, r.ns)
	res.credentialsReady = ready.wait(b, start, n, 15*time.Minute, func() string { return exited(r.p.Done()) })
	b.StopTimer()
	resp, err := http.Get(r.pprof + "heap?gc=1") // the heap profile collects garbage first
	if err != nil {
		b.Fatal(err)
	}
	_ = resp.Body.Close()
	res.heap = r.metric(b, func(l string) (float64, bool) { return sample(l, "go_memstats_heap_inuse_bytes ") })
	if res.usage, err = r.p.Usage(); err != nil {
		b.Fatal(err)
	}
	saveProfile(r.pprof+"heap", fmt.Sprintf("heap-busy-%d-foreign-%t.pprof", n, foreign))
	return res
}

// reportBusy reports one run, prints its busy: lines and adds its row.
func reportBusy(b *testing.B, n int, foreign bool, res busy) {
	rss, heap := float64(res.usage.PeakRSSBytes)/(1<<20), res.heap/(1<<20)
	b.ReportMetric(res.credentialsReady.Seconds(), "s-to-all-CredentialsReady")
	b.ReportMetric(rss, "peak-RSS-MiB")
	b.ReportMetric(heap, "live-heap-MiB")
	b.ReportMetric(res.usage.CPU.Seconds(), "cpu-s")
	objects, readData, readDeployments := "none", "–", "–"
	if foreign {
		objects = fmt.Sprintf("%d Secrets, %d ConfigMaps (%d KiB each), %d Deployments", busySecrets, busyConfigMaps, foreignDataSize>>10, busyDeployments)
		b.ReportMetric(float64(res.readData)/(1<<20), "MiB-read-during-foreign-data")
		b.ReportMetric(float64(res.readDeployments)/(1<<20), "MiB-read-during-deployments")
		readData = fmt.Sprintf("%.2f MiB of their %.0f MiB", float64(res.readData)/(1<<20), float64(busySecrets+busyConfigMaps)*foreignDataSize/(1<<20))
		readDeployments = fmt.Sprintf("%.1f MiB (%.0f B each)", float64(res.readDeployments)/(1<<20), float64(res.readDeployments)/float64(max(busyDeployments, 1)))
		fmt.Printf("busy: N=%d  the operator read %s while the foreign Secrets and ConfigMaps were created (not watched), %s while the Deployments were (metadata only)\n",
			n, readData, readDeployments)
	}
	fmt.Printf("busy: N=%d, foreign objects: %s: all CredentialsReady %.1f s  peak RSS %.0f MiB (target ≤ 100)  live heap %.1f MiB  CPU %.1f s\n",
		n, objects, res.credentialsReady.Seconds(), rss, heap, res.usage.CPU.Seconds())
	busyRows = append(busyRows, fmt.Sprintf("| %d | %s | %.1f s | %.0f MiB | %.1f MiB | %.1f s | %s | %s |", n, objects,
		res.credentialsReady.Seconds(), rss, heap, res.usage.CPU.Seconds(), readData, readDeployments))
}

// createForeign creates the foreign objects in foreignNamespace, none labelled by keyroll, and
// returns what the operator read while the Secrets and ConfigMaps, then the Deployments, were.
func createForeign(b *testing.B, r *run) (readData, readDeployments int64) {
	b.Helper()
	if err := r.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: foreignNamespace}}); err != nil {
		b.Fatal(err)
	}
	data := strings.Repeat("x", foreignDataSize)
	start, read0 := time.Now(), settledRead(b, r)
	createEach(b, r.c, busySecrets, func(i int) client.Object {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: foreignNamespace, Name: fmt.Sprintf("secret-%05d", i)}, StringData: map[string]string{"data": data}}
	})
	createEach(b, r.c, busyConfigMaps, func(i int) client.Object {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: foreignNamespace, Name: fmt.Sprintf("config-%05d", i)}, Data: map[string]string{"data": data}}
	})
	read1 := settledRead(b, r)
	createEach(b, r.c, busyDeployments, func(i int) client.Object {
		return testground.ConsumerDeployment(foreignNamespace, fmt.Sprintf("app-%05d", i), 0, "redis:6379", "none")
	})
	// kube-controller-manager gives each a ReplicaSet and a status, at its 20 requests a second.
	framework.Eventually(b, 15*time.Minute, func() string {
		time.Sleep(2 * time.Second)
		list := &appsv1.DeploymentList{}
		if err := r.c.List(context.Background(), list, client.InNamespace(foreignNamespace)); err != nil {
			return err.Error()
		}
		if pending := slices.DeleteFunc(list.Items, func(d appsv1.Deployment) bool { return d.Status.ObservedGeneration >= d.Generation }); len(pending) > 0 {
			return fmt.Sprintf("%d foreign Deployments not yet observed by kube-controller-manager", len(pending))
		}
		return ""
	})
	read2 := settledRead(b, r)
	fmt.Printf("busy: %d foreign objects created, and the Deployments given their ReplicaSets, in %.1f s\n", busySecrets+busyConfigMaps+busyDeployments, time.Since(start).Seconds())
	return read1 - read0, read2 - read1
}

// createEach creates n objects, 64 at a time.
func createEach(b *testing.B, c client.Client, n int, object func(int) client.Object) {
	b.Helper()
	var wg sync.WaitGroup
	errs, slots := make(chan error, n), make(chan struct{}, 64)
	for i := range n {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := c.Create(context.Background(), object(i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("creating a foreign object: %v", err)
	}
}

// settledRead is how many bytes the operator has read so far (rchar of /proc/<pid>/io: from its
// sockets, mostly the API server's answers and watch events), once it reads under 64 KiB a second.
func settledRead(b *testing.B, r *run) int64 {
	b.Helper()
	read := func() int64 {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", r.p.PID()))
		if err != nil {
			b.Fatal(err)
		}
		_, rest, _ := strings.Cut(string(data), "rchar: ")
		v, _, _ := strings.Cut(rest, "\n")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("no rchar in /proc/%d/io: %v", r.p.PID(), err)
		}
		return n
	}
	last := read()
	framework.Eventually(b, 2*time.Minute, func() string {
		time.Sleep(time.Second)
		prev := last
		last = read()
		if last-prev >= 64<<10 {
			return fmt.Sprintf("the operator still reads %d bytes a second", last-prev)
		}
		return ""
	})
	return last
}

// steadyLeaseTTL is the Vault role's lease lifetime in BenchmarkSteadyState, short so that every
// lease is renewed (at 57–77 % of it) several times in the window.
const steadyLeaseTTL = 2 * time.Minute

// steadyHead is the head of the docs' steady-state table, steadyRows its row from the last
// BenchmarkSteadyState, and steadyTable the two.
const steadyHead = "| N | window | lease TTL | API writes/min | Vault renewals/min | other Vault requests/min | renewals in the busiest second | leases re-issued | reconcile errors |\n" +
	"|---|---|---|---|---|---|---|---|---|\n"

var steadyRows []string

func steadyTable() string { return steadyHead + strings.Join(steadyRows, "\n") }

// steady is what one run of BenchmarkSteadyState observed in its window: the operator's API writes
// and Vault requests (every attempt) by operation; from Vault's audit log (auditSpread) the renewals.
type steady struct {
	writes, errors    float64
	ops               map[string]float64
	renewals, busiest int
	other             map[string]int
}

// BenchmarkSteadyState creates N RedisClusters (KEYROLL_STEADY_SIZE, default 1,000), waits until
// all are CredentialsReady and their first renewals have begun, then observes KEYROLL_STEADY_WINDOW
// (default 5 minutes) of nothing: the operator's API writes and Vault requests per minute (target:
// only renewals, and the token's renew-self), and the share of the window's renewals in its
// busiest second (target: ≤ 5 %).
func BenchmarkSteadyState(b *testing.B) {
	window, err := time.ParseDuration(cmp.Or(os.Getenv("KEYROLL_STEADY_WINDOW"), "5m"))
	if err != nil {
		b.Fatalf("KEYROLL_STEADY_WINDOW: %v", err)
	}
	n := envInt("KEYROLL_STEADY_SIZE", 1000)
	b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
		var res steady
		for range b.N {
			res = steadyState(b, n, window)
		}
		minutes, others := window.Minutes(), maps.Clone(res.ops)
		maps.DeleteFunc(others, func(op string, _ float64) bool { return op == "renew" || op == "renew-self" })
		share := 100 * float64(res.busiest) / float64(max(res.renewals, 1))
		b.ReportMetric(res.writes/minutes, "api-writes/min")
		b.ReportMetric(share, "%-renewals-in-busiest-second")
		for op, v := range res.ops {
			b.ReportMetric(v/minutes, "vault-"+op+"/min")
		}
		b.ReportMetric(res.errors, "reconcile-errors")
		fmt.Printf("steady: N=%d over %s: %.1f API writes/min; Vault: %s; %.0f reconcile errors\n", n, window, res.writes/minutes, perMinute(res.ops, minutes), res.errors)
		fmt.Printf("steady: N=%d  %d renewals answered by Vault, %d in the busiest second: %.1f %% (target ≤ 5 %%); besides them and renew-self, Vault's audit log: %s\n",
			n, res.renewals, res.busiest, share, perMinute(res.other, minutes))
		steadyRows = []string{fmt.Sprintf("| %d | %s | %s | %.1f | %.1f | %s | %d of %d (%.1f %%) | %.0f | %.0f |", n, window, steadyLeaseTTL,
			res.writes/minutes, res.ops["renew"]/minutes, perMinute(others, minutes), res.busiest, res.renewals, share, res.ops["issue"], res.errors)}
		fmt.Println("steady: " + strings.ReplaceAll(steadyTable(), "\n", "\nsteady: "))
		writeSection(b, "steady-table", steadyTable())
	})
}

// steadyState is one run on a fresh ground, with leader election off (its Lease renewals are API
// writes too, two a second at framework.StartProcess's timings, whatever the clusters).
func steadyState(b *testing.B, n int, window time.Duration) steady {
	b.Helper()
	b.StopTimer()
	ctx := context.Background()
	r := startRun(b, fmt.Sprintf("steady-%d", n), runOptions{leaseTTL: steadyLeaseTTL, args: []string{"--leader-elect=false"}})
	defer r.end()
	// The run's role caps a lease at twice its TTL, so in the window renewals would be capped and
	// the leases replaced. A steady state has none of that: an hour outlasts the benchmark.
	if err := r.fw.Ground.Vault.WriteRedisRole(ctx, testground.RedisRole{Name: r.fw.Role("scale"), DefaultTTL: steadyLeaseTTL, MaxTTL: time.Hour}); err != nil {
		b.Fatal(err)
	}
	// Every request Vault answers, with its time, for the spread of the renewals; kept beside the
	// profiles when they are kept (fw.EnableAudit writes into the ground's directory only).
	audit := filepath.Join(cmp.Or(profileDir(), r.fw.Ground.Dir), fmt.Sprintf("vault-audit-steady-%d.log", n))
	if err := r.fw.Ground.Vault.Root.Sys().EnableAuditWithOptionsWithContext(ctx, "file", &vaultapi.EnableAuditOptions{
		Type: "file", Options: map[string]string{"file_path": audit},
	}); err != nil {
		b.Fatal(err)
	}
	ready := watchReady(b, r)
	// The StatefulSet is the last object a cluster's reconcile writes: the window opens on
	// clusters whose objects are all written.
	objects := watchSeen(b, r, &appsv1.StatefulSet{}, func(client.Object) bool { return true })
	created := time.Now()
	createAll(b, r.c, r.ns, "c", n, r.ns)
	dead := func() string { return exited(r.p.Done()) }
	ready.wait(b, created, n, 15*time.Minute, dead)
	objects.wait(b, created, n, 15*time.Minute, dead)
	framework.Eventually(b, 2*steadyLeaseTTL, func() string {
		time.Sleep(time.Second)
		if vaultOps(b, r)["renew"] == 0 {
			return "no lease renewed yet"
		}
		return ""
	})
	fmt.Printf("steady: N=%d  every cluster's objects written and the first renewals begun %.0f s after the creates\n", n, time.Since(created).Seconds())

	b.StartTimer()
	start := time.Now()
	end := start.Add(window)
	writes0, ops0, errors0, byResource0 := r.metric(b, writesOf), vaultOps(b, r), r.metric(b, reconcileErrors), apiServerWrites(b, r)
	writes, ops := writes0, ops0
	for from := start; time.Now().Before(end); {
		time.Sleep(min(time.Minute, time.Until(end)))
		now, w, o := time.Now(), r.metric(b, writesOf), vaultOps(b, r)
		fmt.Printf("steady: N=%d  %3.0f–%3.0f s: %.0f API writes; Vault %s\n", n, from.Sub(start).Seconds(), now.Sub(start).Seconds(),
			w-writes, perMinute(delta(o, ops), now.Sub(from).Minutes()))
		from, writes, ops = now, w, o
	}
	b.StopTimer()
	res := steady{writes: writes - writes0, ops: delta(ops, ops0), errors: r.metric(b, reconcileErrors) - errors0}
	fmt.Printf("steady: N=%d  writes the API server served in the window, every client's (kwok's and kube-controller-manager's too): %s\n",
		n, perMinute(delta(apiServerWrites(b, r), byResource0), window.Minutes()))
	res.renewals, res.busiest, res.other = auditSpread(b, audit, start, end)
	return res
}

// apiServerWrites are the write requests the ground's API server has served, by verb and resource
// (every client's), from its own metrics.
func apiServerWrites(b *testing.B, r *run) map[string]float64 {
	b.Helper()
	body, err := r.fw.Clientset.RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("reading the API server's metrics: %v", err)
	}
	label := func(line, name string) string {
		_, rest, _ := strings.Cut(line, name+`="`)
		v, _, _ := strings.Cut(rest, `"`)
		return v
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		verb := label(line, "verb")
		if !slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE", "APPLY"}, verb) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		what := label(line, "resource")
		if sub := label(line, "subresource"); sub != "" {
			what += "/" + sub
		}
		out[verb+" "+what] += v
	}
	return out
}

// reconcileErrors picks the RedisCluster reconciles that failed out of a metrics line.
func reconcileErrors(line string) (float64, bool) {
	return sample(line, "controller_runtime_reconcile_errors_total{", `controller="rediscluster"`)
}

// vaultOps are the operator's Vault requests so far (every attempt, any outcome) by operation.
func vaultOps(b *testing.B, r *run) map[string]float64 {
	b.Helper()
	ops := map[string]float64{}
	r.metric(b, func(l string) (float64, bool) {
		if v, ok := sample(l, "keyroll_vault_request_duration_seconds_count{"); ok {
			_, rest, _ := strings.Cut(l, `operation="`)
			op, _, _ := strings.Cut(rest, `"`)
			ops[op] += v
		}
		return 0, false
	})
	return ops
}

// delta is cur minus was, of the operations that grew.
func delta(cur, was map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for op, v := range cur {
		if d := v - was[op]; d > 0 {
			out[op] = d
		}
	}
	return out
}

// auditSpread reads Vault's audit log for the responses it gave in [from, to): the lease renewals,
// the most of them in one second, and every other request by path but the token's renew-self.
func auditSpread(b *testing.B, path string, from, to time.Time) (renewals, busiest int, other map[string]int) {
	b.Helper()
	entries, err := framework.ReadAudit(path)
	if err != nil {
		b.Fatal(err)
	}
	perSecond, other := map[int64]int{}, map[string]int{}
	for _, e := range entries {
		if e.Type != "response" || e.Time.Before(from) || !e.Time.Before(to) {
			continue
		}
		switch {
		case strings.HasPrefix(e.Request.Path, "sys/leases/renew/"):
			renewals++
			perSecond[e.Time.Unix()]++
			busiest = max(busiest, perSecond[e.Time.Unix()])
		case e.Request.Path == "auth/token/renew-self":
		default:
			other[e.Request.Path]++
		}
	}
	return renewals, busiest, other
}

// perMinute lists counts over minutes as "key n/min", the largest first.
func perMinute[V int | float64](counts map[string]V, minutes float64) string {
	keys := slices.Collect(maps.Keys(counts))
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), strings.Compare(a, b))
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f/min", k, float64(counts[k])/minutes))
	}
	return cmp.Or(strings.Join(parts, ", "), "nothing")
}
