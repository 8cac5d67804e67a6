// Package node runs keyroll against the test ground's real node: Redis pods that really run,
// probed by a real kubelet, replicating over cluster DNS, reached through kube-proxy; Secrets that
// the kubelet projects into running pods; and the manager itself as a pod from deploy/default.
// The ground also runs a Vault dev server (reachable from pods through the node's bridge) and the
// redis-server Vault's database engine creates users on.
package node

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

// auditLog is the package's Vault audit log (framework.EnableAudit).
var auditLog string

// The Vault roles of this package: orders for the sample RedisCluster, node for the others.
var roles = []testground.RedisRole{
	{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "node", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
}

func TestMain(m *testing.M) {
	fw = framework.New(framework.Config{
		Name: "node",
		// External Secrets Operator's CRDs: the manager watches ExternalSecrets and does not start
		// without their API.
		// External Secrets Operator runs: the upgrade test holds a RedisCluster in ExternalSecret mode.
		Ground: testground.Options{Node: true, Redis: true, Vault: true, ExternalSecrets: true},
		Roles:  roles,
		// Vault's audit log (what the upgrade test issues and revokes) and ESO's Vault policy.
		Setup: func(ctx context.Context, f *framework.Framework) error {
			var err error
			if auditLog, err = f.EnableAudit(ctx); err != nil {
				return err
			}
			if err := f.WriteExternalSecretsPolicy(ctx, f.Name("eso")); err != nil {
				return err
			}
			// The manager's image, which most tests here run, is built before any test's clock
			// starts: a cold build beside the suite's load takes longer than a test's deadline.
			return f.Ground.Node.LoadManagerImage(ctx)
		},
		// keyroll's manager runs in this process, with leader election on the Lease the deployed
		// manager uses, so that the two never act at once.
		Operator: &framework.OperatorOptions{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second},
	})
	// The operator in this process is the deployed manager's identity: the same service account
	// (keyroll-manager, which the operator's Kubernetes auth role in Vault binds) and the same
	// leader-election Lease, both in the manifests' namespace rather than a prefixed one.
	fw.OperatorNS = framework.ManagerNS
	os.Exit(fw.Run(m))
}
