// Package node runs keyroll against the test ground's real node: Redis pods that really run,
// probed by a real kubelet, replicating over cluster DNS, reached through kube-proxy; Secrets that
// the kubelet projects into running pods; and the manager itself as a pod from deploy/default.
// The ground also runs a Vault dev server (reachable from pods through the node's bridge) and the
// redis-server Vault's database engine creates users on.
package node

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

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
	// operator is the manager running in this process (nil while a test runs it as a pod).
	operator *harness.Operator
)

// The Vault roles of this package: orders for the sample RedisCluster, node for the others.
var roles = []testground.RedisRole{
	{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "node", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	start := time.Now()
	// External Secrets Operator's CRDs: the manager watches ExternalSecrets and does not start
	// without their API.
	g, c, stop, err := harness.StartPackage(testground.Options{Node: true, Redis: true, Vault: true, ExternalSecretsCRDs: true},
		func(ctx context.Context, g *testground.Ground) error { return harness.SetupVault(ctx, g, roles...) })
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	fmt.Fprintf(os.Stderr, "node: test ground with the real node up in %s\n", time.Since(start).Round(time.Millisecond))
	ground, k8s = g, c
	if cs, err = kubernetes.NewForConfig(g.CP.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := startOperator(); err != nil {
		fmt.Fprintf(os.Stderr, "starting the operator: %v\n", err)
		return 1
	}
	defer stopOperator()
	return m.Run()
}

// startOperator runs keyroll's manager in this process, with leader election on the Lease the
// deployed manager uses, so that the two never act at once.
func startOperator() error {
	var err error
	operator, err = harness.Start(context.Background(), ground, harness.Options{
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
	})
	return err
}

// stopOperator stops the in-process manager; it releases its Lease.
func stopOperator() {
	if operator != nil {
		_ = operator.Stop()
		operator = nil
	}
}
