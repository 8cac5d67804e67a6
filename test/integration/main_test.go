// Package integration runs keyroll's reconcilers in a manager against the real test ground: a
// kube-apiserver and etcd, kube-controller-manager, the real node (the Redis pods run Redis 7.0
// in containerd, probed by a real kubelet; keyroll reaches each by its pod IP), kwok's fake node
// beside it for consumer workloads that need not run anything (they select it with
// testground.NodeLabel), a Vault dev server with the database secrets engine and Kubernetes auth,
// the redis-server that Vault manages users on, and External Secrets Operator.
package integration

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/controllers/rediscluster"
	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

// The operator's identity in the test ground, and its Vault role.
const operatorRole = harness.OperatorRole

var (
	ground     *testground.Ground
	k8s        client.Client
	cs         *kubernetes.Clientset
	reconciler *rediscluster.Reconciler
	// operatorLogs holds everything the operator logged.
	operatorLogs = &syncBuffer{}
	// metricsURL and probesURL are the running operator's metrics and probe endpoints.
	metricsURL, probesURL string
	// stopOperator stops the running operator (restartOperator replaces it).
	stopOperator func()
	// vaultCalls counts the HTTP attempts the operator makes to Vault, per VaultConnection.
	vaultCalls = &callCounter{}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if b := flag.Lookup("test.bench"); b != nil && b.Value.String() != "" {
		ctrllog.SetLogger(logr.Discard()) // benchmarks print numbers, not the operator's logs
	} else {
		// Every log line, debug included, is also kept for the secret-leak test.
		ctrllog.SetLogger(zap.New(zap.WriteTo(io.MultiWriter(os.Stderr, operatorLogs)), zap.UseDevMode(true)))
	}
	roles := []testground.RedisRole{
		{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "short", DefaultTTL: 20 * time.Second, MaxTTL: time.Hour},
		{Name: "restart", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		// Leases that reach their max TTL after two renewals.
		{Name: "capped", DefaultTTL: 15 * time.Second, MaxTTL: 35 * time.Second},
		// Roles that External Secrets Operator reads for the ExternalSecret-mode tests.
		{Name: "es-store", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "es-raw", DefaultTTL: 20 * time.Second, MaxTTL: time.Hour},
		{Name: "es-warn", DefaultTTL: time.Minute, MaxTTL: time.Hour},
		{Name: "es-long", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	}
	g, c, stop, err := harness.StartPackage(testground.Options{Node: true, Workloads: true, Redis: true, Vault: true, ExternalSecrets: true},
		func(ctx context.Context, g *testground.Ground) error { return harness.SetupVault(ctx, g, roles...) })
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	ground, k8s = g, c
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if cs, err = kubernetes.NewForConfig(ground.CP.Config); err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		return 1
	}
	if stopOperator, err = startOperator(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "starting the operator: %v\n", err)
		return 1
	}
	defer func() { stopOperator() }()
	return m.Run()
}

// startOperator runs keyroll's manager in this process, as main.go wires it.
func startOperator(ctx context.Context) (func(), error) {
	port, err := testground.FreePort()
	if err != nil {
		return nil, err
	}
	probePort, err := testground.FreePort()
	if err != nil {
		return nil, err
	}
	metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	probesURL = fmt.Sprintf("http://127.0.0.1:%d", probePort)
	op, err := harness.Start(ctx, ground, harness.Options{
		MetricsAddr:   fmt.Sprintf("127.0.0.1:%d", port),
		ProbeAddr:     fmt.Sprintf("127.0.0.1:%d", probePort),
		VaultObserver: func(conn, _, _ string, _ float64) { vaultCalls.add(conn) },
	})
	if err != nil {
		return nil, err
	}
	reconciler = op.Reconciler
	return func() { _ = op.Stop() }, nil
}

// restartOperator stops the operator and starts a new one, as a pod restart would.
func restartOperator(t *testing.T) {
	t.Helper()
	stopOperator()
	var err error
	if stopOperator, err = startOperator(context.Background()); err != nil {
		stopOperator = func() {}
		t.Fatalf("restarting the operator: %v", err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounter) add(conn string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[conn]++
}

// of is the number of calls made through one VaultConnection so far.
func (c *callCounter) of(conn string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[conn]
}
