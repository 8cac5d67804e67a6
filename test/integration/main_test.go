// Package integration runs keyroll's reconcilers in a manager against the real test ground: a
// kube-apiserver and etcd, kube-controller-manager, the real node (the Redis pods run Redis 7.0
// in containerd, probed by a real kubelet; keyroll reaches each by its pod IP), kwok's fake node
// beside it for consumer workloads that need not run anything (they select it with
// testground.NodeLabel), a Vault dev server with the database secrets engine and Kubernetes auth,
// the redis-server that Vault manages users on, and External Secrets Operator.
package integration

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	fw *framework.Framework
	// vaultCalls counts the HTTP attempts the operator makes to Vault, per VaultConnection.
	vaultCalls = &callCounter{}
	// auditLog is Vault's audit log, which every request to Vault reaches.
	auditLog string
)

func TestMain(m *testing.M) {
	roles := []testground.RedisRole{
		{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "short", DefaultTTL: 20 * time.Second, MaxTTL: time.Hour},
		// Leases that reach their max TTL after two renewals.
		{Name: "capped", DefaultTTL: 15 * time.Second, MaxTTL: 35 * time.Second},
		// Roles that External Secrets Operator reads for the ExternalSecret-mode tests.
		{Name: "es-store", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "es-raw", DefaultTTL: 20 * time.Second, MaxTTL: time.Hour},
		{Name: "es-warn", DefaultTTL: time.Minute, MaxTTL: time.Hour},
		{Name: "es-long", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		// One test's alone: every lease under it must be in that test's ledger.
		{Name: "es-bounds", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "es-conn", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		// Two tenants' roles, named after their namespaces (<namespace>.<role>) as the Vault
		// administrators' guide names them, for the tenancy tests.
		{Name: "ten-a.orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "ten-b.orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "nsid-a.orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "nsid-b.orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "forged.orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		{Name: "forged.es", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		// A role every allowed namespace shares (a plain allowedPaths entry, as the guide's
		// example has one), for the test of a namespace the connection does not allow.
		{Name: "shared.orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	}
	fw = framework.New(framework.Config{
		Name:   "integration",
		Ground: testground.Options{Node: true, Workloads: true, Redis: true, Vault: true, ExternalSecrets: true},
		Roles:  roles,
		// External Secrets Operator's Vault policy, named fw.Name("eso"), for the ExternalSecret-mode
		// tests; Vault's audit log, for the tenancy tests.
		Setup: func(ctx context.Context, f *framework.Framework) error {
			var err error
			if auditLog, err = f.EnableAudit(ctx); err != nil {
				return err
			}
			return f.WriteExternalSecretsPolicy(ctx, f.Name("eso"))
		},
		// The operator runs in this process with its metrics and probe endpoints, and every Vault
		// call it makes is counted.
		Operator: &framework.OperatorOptions{
			Endpoints:     true,
			VaultObserver: func(conn, _, _ string, _ float64) { vaultCalls.add(conn) },
		},
	})
	os.Exit(fw.Run(m))
}

// callCounter counts Vault calls per VaultConnection (the operator's VaultObserver feeds it).
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

// of is the number of calls made through one VaultConnection (by its full name) so far.
func (c *callCounter) of(conn string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[conn]
}
