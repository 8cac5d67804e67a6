// Package isolation shows that clusters which fail do not slow the others: hundreds of
// RedisClusters whose Vault path is refused, and some whose Redis accepts connections and never
// answers, beside healthy ones, against a real API server, kube-controller-manager and Vault, with
// keyroll's manager in the test process. Their pods run on kwok's fake node, whose pod IPs are
// loopback addresses: the test serves each healthy cluster's Redis pod with a real redis-server
// bound to the pod's IP and started with the aclfile keyroll wrote for it (as the pod's container
// would be), and each hanging cluster's with a listener that accepts and never answers.
//
// With KEYROLL_RELIABILITY_DOC naming docs/reliability.md (make reliability), the measured figures
// are written into it.
package isolation

import (
	"os"
	"testing"
	"time"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

func TestMain(m *testing.M) {
	fw = framework.New(framework.Config{
		Name:   "isolation",
		Ground: testground.Options{Workloads: true, Redis: true, Vault: true},
		// Its timings are of the load its own 540 clusters make: beside the shared ground's
		// packages (image builds, helm installs), the machine's two cores are theirs as much.
		Alone: true,
		Roles: []testground.RedisRole{
			// The healthy clusters' leases: renewed every 20 s or so.
			{Name: "healthy", DefaultTTL: 30 * time.Second, MaxTTL: time.Hour},
			{Name: "hanging", DefaultTTL: time.Hour, MaxTTL: time.Hour},
		},
		Operator: &framework.OperatorOptions{},
	})
	os.Exit(fw.Run(m))
}
