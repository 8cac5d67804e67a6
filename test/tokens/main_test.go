// Package tokens shows that no lease dies with the Vault token that created it: keyroll's manager
// runs against a real kube-apiserver and etcd with the test ground's real node (the Redis pods
// run, and keyroll puts each credential's user on every one of them), a real Vault dev server and
// the redis-server Vault creates users on, with Kubernetes auth roles whose tokens live seconds,
// not hours: periodic ones (token_period), and bounded ones (token_ttl and token_max_ttl) that
// keyroll cannot keep alive for as long as its leases; and an AppRole of periodic tokens. kwok's
// fake node takes the stand-in consumers, which run nothing.
package tokens

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

const (
	tokenPeriod = 15 * time.Second
	tokenTTL    = 15 * time.Second
	tokenMaxTTL = 60 * time.Second

	// readyTimeout bounds how long a new RedisCluster takes to be Ready: its pods run on the real
	// node one after the other, each Ready through the kubelet's probe, while other tests' run too.
	readyTimeout = 2 * time.Minute
)

var (
	fw *framework.Framework

	// Auth roles of the operator's service account in fw.OperatorNS, all with its policy
	// (fw.OperatorRole), named through fw.Name; TestMain sets them.
	//
	// rolePeriodic issues periodic tokens: renewable for ever, each renewal for tokenPeriod.
	rolePeriodic string
	// roleBounded issues tokens of tokenTTL that end for good tokenMaxTTL after login.
	roleBounded string
	// roleAppRole is an AppRole (at approle/) of periodic tokens, the operator's policy; the
	// tests that use it make its secret ids.
	roleAppRole string

	// leasePath issues 10-minute leases (max TTL 1h): far longer than any token here.
	leasePath string
)

func TestMain(m *testing.M) {
	fw = framework.New(framework.Config{
		Name:     "tokens",
		Ground:   testground.Options{Node: true, Workloads: true, Redis: true, Vault: true},
		Roles:    []testground.RedisRole{{Name: "tokens", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour}},
		Setup:    setupTokenRoles,
		Operator: &framework.OperatorOptions{},
	})
	rolePeriodic, roleBounded, roleAppRole = fw.Name("keyroll-periodic"), fw.Name("keyroll-bounded"), fw.Name("keyroll-approle")
	leasePath = fw.Path("tokens")
	os.Exit(fw.Run(m))
}

// setupTokenRoles adds, to what fw.SetupVault gave the operator, the short-lived token roles.
func setupTokenRoles(ctx context.Context, f *framework.Framework) error {
	periodic, bounded := f.OperatorAuthRole(0), f.OperatorAuthRole(tokenTTL)
	periodic.Name, periodic.TokenPeriod = rolePeriodic, tokenPeriod
	bounded.Name, bounded.TokenMaxTTL = roleBounded, tokenMaxTTL
	for _, r := range []testground.KubernetesAuthRole{periodic, bounded} {
		if err := f.Ground.Vault.WriteKubernetesAuthRole(ctx, r); err != nil {
			return err
		}
	}
	return setupAppRole(ctx, f)
}

// setupAppRole enables the AppRole auth method at approle/ (unless another package sharing the
// ground did) and writes roleAppRole.
func setupAppRole(ctx context.Context, f *framework.Framework) error {
	root := f.Ground.Vault.Root
	err := root.Sys().EnableAuthWithOptionsWithContext(ctx, "approle", &vaultapi.EnableAuthOptions{Type: "approle"})
	if err != nil && !strings.Contains(err.Error(), "path is already in use") {
		return fmt.Errorf("enabling approle auth: %w", err)
	}
	_, err = root.Logical().WriteWithContext(ctx, "auth/approle/role/"+roleAppRole, map[string]any{
		"token_policies": f.OperatorRole, "token_period": tokenPeriod.String(),
	})
	if err != nil {
		return fmt.Errorf("writing approle role %s: %w", roleAppRole, err)
	}
	return nil
}
