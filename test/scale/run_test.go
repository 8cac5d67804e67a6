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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

// run is one fresh test ground with Vault, a VaultConnection named after its namespace and the
// operator running as its own process, for one benchmark size.
type run struct {
	g          *testground.Ground
	c          client.Client
	p          *harness.Process
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
	r := &run{g: g, ns: "scale", stop: []func(){g.Stop}}
	b.Cleanup(r.end)
	ttl := o.leaseTTL
	if ttl == 0 {
		ttl = time.Hour
	}
	if err := harness.SetupVault(ctx, g, testground.RedisRole{Name: "scale", DefaultTTL: ttl, MaxTTL: 2 * ttl}); err != nil {
		b.Fatal(err)
	}
	cfg := rest.CopyConfig(g.CP.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	if r.c, err = client.New(cfg, client.Options{Scheme: harness.Scheme()}); err != nil {
		b.Fatal(err)
	}
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
	r.p, err = harness.StartProcess(g, operatorBinary(b), harness.ProcessOptions{MetricsPort: port,
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
	r.waitConnectionReady(b, r.ns)
	return r
}

// connection creates the VaultConnection name (allowed in the run's namespace) to addr.
func (r *run) connection(b *testing.B, name, addr string) {
	b.Helper()
	vc := &v1alpha1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.VaultConnectionSpec{
		Address: addr, AllowedNamespaces: []string{r.ns},
		Auth:      v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: harness.OperatorRole}},
		RateLimit: &v1alpha1.VaultRateLimit{QPS: vaultQPS, Burst: vaultBurst},
	}}
	if err := r.c.Create(context.Background(), vc); err != nil {
		b.Fatal(err)
	}
}

// waitConnectionReady waits until the VaultConnection name is Ready.
func (r *run) waitConnectionReady(b *testing.B, name string) {
	b.Helper()
	waitFor(b, 2*time.Minute, func() bool {
		cur := &v1alpha1.VaultConnection{}
		return r.c.Get(context.Background(), client.ObjectKey{Name: name}, cur) == nil &&
			meta.IsStatusConditionTrue(cur.Status.Conditions, v1alpha1.ConditionReady)
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
