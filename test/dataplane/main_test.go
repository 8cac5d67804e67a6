// Package dataplane proves, on the test ground's real node, that a rotation changes users and not
// pods: real Redis pods (Debian's 7.0), real consumers running the test ground's Redis client in
// pods, a real Vault whose database engine issues the credentials, and keyroll's manager in this
// process. The tests are those of issue 15 (rotation without restarting Redis) and issue 16
// (safe restarts: replicas first, FAILOVER before the primary, restart in place, disruptions).
package dataplane

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	ground *testground.Ground
	k8s    client.Client
	cs     *kubernetes.Clientset
)

// leaseCheckInterval is the operator's --lease-check-interval here: how soon a lease revoked in
// Vault is noticed.
const leaseCheckInterval = 10 * time.Second

// The roles of the ground's own Redis (the one Vault's "redis" connection manages).
var roles = []testground.RedisRole{
	{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "hardened", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour, ACLRules: []string{"~app:*", "+@read", "+@write", "-@dangerous"}},
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if path := os.Getenv("KEYROLL_OPERATOR_LOG"); path != "" {
		// The operator's log in a file, to explain what a benchmark measured.
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		ctrllog.SetLogger(zap.New(zap.WriteTo(f), zap.UseDevMode(true), zap.Level(zapcore.InfoLevel)))
	} else if b := flag.Lookup("test.bench"); b != nil && b.Value.String() != "" {
		ctrllog.SetLogger(logr.Discard()) // benchmarks print numbers, not the operator's logs
	} else {
		ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true), zap.Level(zapcore.InfoLevel)))
	}
	start := time.Now()
	g, c, stop, err := harness.StartPackage(testground.Options{Node: true, Redis: true, Vault: true, ExternalSecretsCRDs: true},
		func(ctx context.Context, g *testground.Ground) error { return harness.SetupVault(ctx, g, roles...) })
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	fmt.Fprintf(os.Stderr, "dataplane: test ground with the real node up in %s\n", time.Since(start).Round(time.Millisecond))
	ground, k8s = g, c
	if cs, err = kubernetes.NewForConfig(g.CP.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	op, err := harness.Start(context.Background(), ground, harness.Options{LeaseCheckInterval: leaseCheckInterval})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the operator: %v\n", err)
		return 1
	}
	defer func() { _ = op.Stop() }()
	return m.Run()
}
