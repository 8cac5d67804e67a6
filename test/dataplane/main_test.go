// Package dataplane proves, on the test ground's real node, that a rotation changes users and not
// pods: real Redis pods (Debian's 7.0), real consumers running the test ground's Redis client in
// pods, a real Vault whose database engine issues the credentials, and keyroll's manager in this
// process. The tests are those of issue 15 (rotation without restarting Redis) and issue 16
// (safe restarts: replicas first, FAILOVER before the primary, restart in place, disruptions).
package dataplane

import (
	"os"
	"testing"
	"time"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

// leaseCheckInterval is the operator's --lease-check-interval here: how soon a lease revoked in
// Vault is noticed.
const leaseCheckInterval = 10 * time.Second

// The roles of the ground's own Redis (the one Vault's "redis" connection manages), named without
// the package's prefix (fw.Role and fw.Path add it).
var roles = []testground.RedisRole{
	{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	// Leases of two minutes, which a rollout of five outlives unless they are renewed.
	{Name: "brief", DefaultTTL: 2 * time.Minute, MaxTTL: time.Hour},
	{Name: "hardened", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour, ACLRules: []string{"~app:*", "+@read", "+@write", "-@dangerous"}},
}

func TestMain(m *testing.M) {
	fw = framework.New(framework.Config{
		Name:     "dataplane",
		Ground:   testground.Options{Node: true, Redis: true, Vault: true, ExternalSecretsCRDs: true},
		Roles:    roles,
		Operator: &framework.OperatorOptions{LeaseCheckInterval: leaseCheckInterval, Endpoints: true},
		InfoLogs: true,
	})
	os.Exit(fw.Run(m))
}
