// Package nodetrust proves, on the test ground's real node, that keyroll's Redis nodes are its
// own and stay so (issue 31): the application user cannot run the commands that would take a node
// over from keyroll, keyroll removes users it did not make and sets its own back, a pod that only
// looks like a Redis node gets nothing from keyroll, and the probe sidecar holds under a flood.
// Real Redis 7.0 pods, a real Vault whose database engine issues the credentials, and keyroll's
// manager in this process, which compares every node's ACL every few seconds here.
package nodetrust

import (
	"os"
	"testing"
	"time"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

// usersCheckInterval is the operator's --redis-users-check-interval here.
const usersCheckInterval = 5 * time.Second

func TestMain(m *testing.M) {
	fw = framework.New(framework.Config{
		Name:     "nodetrust",
		Ground:   testground.Options{Node: true, Redis: true, Vault: true},
		Roles:    []testground.RedisRole{{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour}},
		Operator: &framework.OperatorOptions{Endpoints: true, UsersCheckInterval: usersCheckInterval},
		InfoLogs: true,
	})
	os.Exit(fw.Run(m))
}
