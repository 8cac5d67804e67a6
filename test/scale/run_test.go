package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// run is one fresh test ground with Vault, a VaultConnection named after its namespace and the
// operator running as its own process, for one benchmark size.
type run struct {
	// fw works on the run's ground, with nothing prefixed (each run has a ground of its own).
	fw *framework.Framework
	// c is a client of the ground for creating objects by the thousand: fw.Client keeps client-go's
	// default rate limit.
	c          client.Client
	p          *framework.Process
	ns         string
	metricsURL string
	pprof      string
	stop       []func()
}

// runOptions are what a benchmark changes in its run.
type runOptions struct {
	// ground adds to the ground's options (Workloads, Redis and Vault are always on).
	ground testground.Options
	// role is the Vault role's lease lifetime (zero: an hour, so that no renewal is due).
	leaseTTL time.Duration
	// vaultAddr is the VaultConnection's address (empty: the ground's Vault).
	vaultAddr string
	// args are extra operator flags.
	args []string
}

// startRun starts the ground, Vault's role "scale", the namespace "scale" with its VaultConnection,
// and the operator; it returns once the connection is Ready. name names the operator's log.
func startRun(b *testing.B, name string, o runOptions) *run {
	b.Helper()
	ctx := context.Background()
	gopts := o.ground
	gopts.Workloads, gopts.Redis, gopts.Vault = true, true, true
	if gopts.ControllerManagerQPS == 0 {
		gopts.ControllerManagerQPS = controllerManagerQPS
	}
	g, err := testground.Start(gopts)
	if err != nil {
		b.Fatal(err)
	}
	r := &run{fw: framework.New(framework.Config{Name: ""}), ns: "scale", stop: []func(){g.Stop}}
	b.Cleanup(r.end)
	if err := r.fw.Use(g); err != nil {
		b.Fatal(err)
	}
	ttl := o.leaseTTL
	if ttl == 0 {
		ttl = time.Hour
	}
	if err := r.fw.SetupVault(ctx, testground.RedisRole{Name: "scale", DefaultTTL: ttl, MaxTTL: 2 * ttl}); err != nil {
		b.Fatal(err)
	}
	cfg := rest.CopyConfig(g.CP.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	if r.c, err = client.New(cfg, client.Options{Scheme: framework.Scheme()}); err != nil {
		b.Fatal(err)
	}
	// Not fw.Namespace: its clean-up at the benchmark's end would find the run's ground stopped
	// (the namespace goes with the ground).
	if err := r.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}); err != nil {
		b.Fatal(err)
	}
	addr := o.vaultAddr
	if addr == "" {
		addr = g.Vault.Addr
	}
	r.connection(b, r.ns, addr)
	port, err := testground.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	pprofPort, err := testground.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	// The operator's log goes with the ground, unless profiles are kept (then beside them).
	logPath := filepath.Join(g.Dir, "operator.log")
	if dir := profileDir(); dir != "" {
		logPath = filepath.Join(dir, "operator-"+name+".log")
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	r.stop = append(r.stop, func() { _ = logFile.Close() })
	var logMu sync.Mutex
	args := append([]string{"--zap-log-level=info", fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", pprofPort)}, o.args...)
	r.p, err = r.fw.StartProcess(operatorBinary(b), framework.ProcessOptions{MetricsPort: port,
		Args: append(args, strings.Fields(os.Getenv("KEYROLL_SCALE_ARGS"))...),
		Env:  strings.Fields(os.Getenv("KEYROLL_SCALE_OPERATOR_ENV")),
		Line: func(l string) {
			logMu.Lock()
			defer logMu.Unlock()
			fmt.Fprintln(logFile, l)
		}})
	if err != nil {
		b.Fatal(err)
	}
	r.stop = append(r.stop, r.p.Kill)
	fmt.Fprintf(os.Stderr, "scale: %s, the operator's log: %s\n", name, logPath)
	r.pprof = fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", pprofPort)
	r.metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	r.fw.WaitConnectionReady(b, r.ns, 2*time.Minute)
	return r
}

// connection creates the VaultConnection name (allowed in the run's namespace) to addr, at the
// benchmark's rate limit.
func (r *run) connection(b *testing.B, name, addr string) {
	b.Helper()
	r.fw.VaultConnection(b, name, framework.Allow(r.ns), framework.Address(addr), func(vc *v1beta1.VaultConnection) {
		vc.Spec.RateLimit = &v1beta1.VaultRateLimit{QPS: vaultQPS, Burst: vaultBurst}
	})
}

// end stops what the run started, the operator first.
func (r *run) end() {
	for i := len(r.stop) - 1; i >= 0; i-- {
		r.stop[i]()
	}
	r.stop = nil
}

// metric sums the operator's samples that pick selects.
func (r *run) metric(b *testing.B, pick func(string) (float64, bool)) float64 {
	b.Helper()
	return scrape(b, r.metricsURL, pick)
}

// gets picks the operator's API read requests (GET: those its cache does not answer).
func gets(l string) (float64, bool) { return sample(l, "rest_client_requests_total{", `method="GET"`) }
