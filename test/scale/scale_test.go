// Package scale holds keyroll's scale benchmarks (make bench): many RedisClusters on kwok's fake
// node (nothing runs in their pods), against a real API server, kube-controller-manager and Vault,
// with the operator built from main.go and run as its own process, so that its memory and CPU are
// its own. It has no tests: go test without -bench starts nothing here.
package scale

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// sizes are the counts a benchmark runs with: the environment variable env (comma-separated), or
// 100, 300 and 1,000.
func sizes(env string) []int {
	var out []int
	for _, f := range strings.Split(cmp.Or(os.Getenv(env), "100,300,1000"), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

var (
	buildOnce sync.Once
	bin       string
	binDir    string
	buildErr  error
)

// TestMain runs the benchmarks, then removes the operator they built. The grounds' envtest logs
// through controller-runtime's logger: it discards, rather than warn with a stack that none is set.
func TestMain(m *testing.M) {
	log.SetLogger(logr.Discard())
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// operatorBinary builds keyroll once for the package.
func operatorBinary(b *testing.B) string {
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "keyroll-scale-"); buildErr == nil {
			bin, buildErr = framework.BuildOperator(binDir)
		}
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return bin
}

// vaultQPS is the VaultConnection's rate limit in the benchmark (its default, 20/s with a burst of
// 40, would make 1,000 issues take 50 s by design).
const vaultQPS, vaultBurst = 1000, 1000

// controllerManagerQPS is the ground's kube-controller-manager API rate (KEYROLL_SCALE_KCM_QPS;
// 0: its default, 20/s). On kwok nothing waits for the pods it creates (the benchmark ends at
// CredentialsReady), and a faster one only competes for the machine's cores: at 500/s, 300
// clusters took 32.5 s instead of 26.7 s.
var controllerManagerQPS = envInt("KEYROLL_SCALE_KCM_QPS", 0)

// BenchmarkIssueAtScale creates N RedisClusters at once (replicas 1, VaultLease, one Vault role) on
// a fresh test ground, and reports the time until all are CredentialsReady, the Vault issues per
// cluster (target: exactly 1), the operator's API writes per cluster, its peak RSS and CPU time.
func BenchmarkIssueAtScale(b *testing.B) {
	var rows []string
	defer func() {
		if len(rows) > 0 {
			writeSection(b, "scale-table", "| N | all CredentialsReady | all objects written | Vault issues per cluster | API writes per cluster | uncached reads per cluster | peak RSS | CPU |\n|---|---|---|---|---|---|---|---|\n"+strings.Join(rows, "\n"))
		}
	}()
	for _, n := range sizes("KEYROLL_SCALE_SIZES") {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			for range b.N {
				r := issueAtScale(b, n)
				b.ReportMetric(r.credentialsReady.Seconds(), "s-to-all-CredentialsReady")
				b.ReportMetric(r.objectsWritten.Seconds(), "s-to-all-objects")
				b.ReportMetric(float64(r.issues)/float64(n), "vault-issues/cluster")
				b.ReportMetric(float64(r.writes)/float64(n), "api-writes/cluster")
				b.ReportMetric(float64(r.usage.PeakRSSBytes)/(1<<20), "peak-RSS-MiB")
				b.ReportMetric(r.usage.CPU.Seconds(), "cpu-s")
				rows = append(rows, fmt.Sprintf("| %d | %.1f s | %.1f s | %.2f | %.1f | %.1f | %.0f MiB | %.1f s |", n, r.credentialsReady.Seconds(), r.objectsWritten.Seconds(),
					float64(r.issues)/float64(n), float64(r.writes)/float64(n), r.gets/float64(n), float64(r.usage.PeakRSSBytes)/(1<<20), r.usage.CPU.Seconds()))
				fmt.Printf("scale: N=%d  all CredentialsReady %.1f s  all objects %.1f s  Vault issues/cluster %.2f  API writes/cluster %.1f  peak RSS %.0f MiB  CPU %.1f s\n",
					n, r.credentialsReady.Seconds(), r.objectsWritten.Seconds(), float64(r.issues)/float64(n), float64(r.writes)/float64(n),
					float64(r.usage.PeakRSSBytes)/(1<<20), r.usage.CPU.Seconds())
			}
		})
	}
}

type result struct {
	// objectsWritten is when every cluster's last object (its StatefulSet) was written.
	credentialsReady, objectsWritten time.Duration
	issues, writes, gets             float64
	usage                            framework.Usage
}

func issueAtScale(b *testing.B, n int) result {
	b.Helper()
	b.StopTimer()
	r := startRun(b, strconv.Itoa(n), runOptions{})
	defer r.end()
	ready := watchReady(b, r)
	// The StatefulSet is the last object a cluster's reconcile writes.
	objects := watchSeen(b, r, &appsv1.StatefulSet{}, func(client.Object) bool { return true })
	writes0 := r.metric(b, writesOf)
	gets0 := r.metric(b, gets)

	profiled := profileCPU(r.pprof, fmt.Sprintf("cpu-%d.pprof", n), 20*time.Second)
	go func() { // where the workers wait, 10 s into the run
		time.Sleep(10 * time.Second)
		saveProfile(r.pprof+"goroutine?debug=1", fmt.Sprintf("goroutines-%d.txt", n))
	}()
	b.StartTimer()
	start := time.Now()
	createAll(b, r.c, r.ns, "c", n, r.ns)
	created := time.Since(start)
	dead := func() string { return exited(r.p.Done()) }
	took := ready.wait(b, start, n, 15*time.Minute, dead)
	b.StopTimer()
	fmt.Printf("scale: N=%d  %.1f API writes per cluster until all were CredentialsReady\n", n, (r.metric(b, writesOf)-writes0)/float64(n))
	written := objects.wait(b, start, n, 15*time.Minute, dead)

	issues := r.metric(b, issuesOf)
	issueSeconds := r.metric(b, func(l string) (float64, bool) {
		return sample(l, "keyroll_vault_request_duration_seconds_sum{", `operation="issue"`, `outcome="Success"`)
	})
	reconcileSeconds := r.metric(b, func(l string) (float64, bool) {
		return sample(l, "controller_runtime_reconcile_time_seconds_sum{", `controller="rediscluster"`)
	})
	reconciles := r.metric(b, func(l string) (float64, bool) {
		return sample(l, "controller_runtime_reconcile_time_seconds_count{", `controller="rediscluster"`)
	})
	reads := r.metric(b, gets) - gets0
	fmt.Printf("scale: N=%d  %.1f uncached reads (GET) per cluster\n", n, reads/float64(n))
	fmt.Printf("scale: N=%d  created in %.1f s; Vault issue %.0f ms on average; %.0f reconciles of %.0f ms on average\n",
		n, created.Seconds(), 1000*issueSeconds/max(issues, 1), reconciles, 1000*reconcileSeconds/max(reconciles, 1))
	writes := r.metric(b, writesOf) - writes0
	u, err := r.p.Usage()
	if err != nil {
		b.Fatal(err)
	}
	saveProfile(r.pprof+"heap", fmt.Sprintf("heap-%d.pprof", n))
	<-profiled
	return result{credentialsReady: took, objectsWritten: written, issues: issues, writes: writes, gets: reads, usage: u}
}

// createAll creates n RedisClusters <prefix>0000, <prefix>0001, ... through the VaultConnection
// connection, 32 at a time.
func createAll(b *testing.B, c client.Client, ns, prefix string, n int, connection string) {
	b.Helper()
	createParallel(b, n, func(i int) error {
		return c.Create(context.Background(), &v1beta1.RedisCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s%04d", prefix, i)},
			Spec: v1beta1.RedisClusterSpec{Replicas: 1, Credentials: v1beta1.CredentialsSpec{
				Source: v1beta1.SourceVaultLease,
				VaultLease: &v1beta1.VaultLeaseSource{
					ConnectionRef: v1beta1.ConnectionReference{Name: connection}, Path: credPath,
				},
			}},
		})
	})
}

// createParallel runs create for 0..n-1, 32 at a time, and fails the benchmark if one failed.
func createParallel(b *testing.B, n int, create func(int) error) {
	b.Helper()
	framework.Parallel(b, n, 32, create)
}

// issuesOf picks the operator's successful Vault issue requests out of a metrics line.
func issuesOf(line string) (float64, bool) {
	return sample(line, "keyroll_vault_request_duration_seconds_count{", `operation="issue"`, `outcome="Success"`)
}

// writesOf picks the operator's API write requests out of a metrics line.
func writesOf(line string) (float64, bool) {
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		if v, ok := sample(line, "rest_client_requests_total{", `method="`+m+`"`); ok {
			return v, true
		}
	}
	return 0, false
}

// sample is the value of a metrics line that starts with name and holds every label.
func sample(line, name string, labels ...string) (float64, bool) {
	if !strings.HasPrefix(line, name) {
		return 0, false
	}
	for _, l := range labels {
		if !strings.Contains(line, l) {
			return 0, false
		}
	}
	f := strings.Fields(line)
	v, err := strconv.ParseFloat(f[len(f)-1], 64)
	return v, err == nil
}

// scrape sums the samples that pick selects from the operator's metrics.
func scrape(b *testing.B, url string, pick func(string) (float64, bool)) float64 {
	b.Helper()
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := pick(sc.Text()); ok {
			sum += v
		}
	}
	return sum
}

// profileDir is where the operator's profiles go (KEYROLL_SCALE_PROFILES; none when unset).
func profileDir() string { return os.Getenv("KEYROLL_SCALE_PROFILES") }

// profileCPU takes the operator's CPU profile over the next d, into name in profileDir.
func profileCPU(pprof, name string, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		saveProfile(fmt.Sprintf("%sprofile?seconds=%d", pprof, int(d.Seconds())), name)
	}()
	return done
}

// saveProfile fetches a pprof endpoint into name in profileDir, when that is set.
func saveProfile(url, name string) {
	dir := profileDir()
	if dir == "" {
		return
	}
	resp, err := http.Get(url)
	if err != nil {
		fmt.Fprintf(os.Stderr, "profile %s: %v\n", name, err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		fmt.Fprintf(os.Stderr, "profile %s: %v\n", name, err)
		return
	}
	defer f.Close()
	_, _ = io.Copy(f, resp.Body)
}

// writeSection puts table into KEYROLL_PERFORMANCE_DOC (make bench-scale sets docs/performance.md),
// between the markers <!-- name --> and <!-- /name -->; nothing when unset, or when the benchmark
// failed.
func writeSection(b *testing.B, name, table string) {
	doc := os.Getenv("KEYROLL_PERFORMANCE_DOC")
	if doc == "" || table == "" || b.Failed() {
		return
	}
	if err := framework.WriteSection(doc, "<!-- "+name+" -->", "<!-- /"+name+" -->", table); err != nil {
		b.Fatal(err)
	}
}

// envInt is an integer from the environment, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}
