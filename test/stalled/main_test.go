// Package stalled shows rollouts held by a node whose kubelet does not report: a Redis pod that
// does not come back from its restart while the real node's kubelet is held, and an operator
// restarted while kwok, paused, holds the consumer's new pods not Ready. Its tests hold the
// ground's kubelets (the real node's and kwok's), which would stall every other package on a
// shared ground, so the package asks for a ground of its own (framework.Config.OwnGround).
package stalled

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
		Name:      "stalled",
		OwnGround: true,
		Ground:    testground.Options{Node: true, Workloads: true, Redis: true, Vault: true, ExternalSecretsCRDs: true},
		Roles: []testground.RedisRole{
			{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
			{Name: "restart", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		},
		Operator: &framework.OperatorOptions{},
	})
	os.Exit(fw.Run(m))
}
