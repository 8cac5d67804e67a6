// Package tokens shows that no lease dies with the Vault token that created it: keyroll's manager
// runs against a real kube-apiserver and etcd with the test ground's real node (the Redis pods
// run, and keyroll puts each credential's user on every one of them), a real Vault dev server and
// the redis-server Vault creates users on, with Kubernetes auth roles whose tokens live seconds,
// not hours: periodic ones (token_period), and bounded ones (token_ttl and token_max_ttl) that
// keyroll cannot keep alive for as long as its leases; and an AppRole of periodic tokens. kwok's
// fake node takes the stand-in consumers, which run nothing.
package tokens

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

// Kubernetes auth roles of the operator's service account, all with its policy.
const (
	// rolePeriodic issues periodic tokens: renewable for ever, each renewal for tokenPeriod.
	rolePeriodic = "keyroll-periodic"
	// roleBounded issues tokens of tokenTTL that end for good tokenMaxTTL after login.
	roleBounded = "keyroll-bounded"
	// roleAppRole is an AppRole (at approle/) of periodic tokens, the operator's policy; the
	// tests that use it make its secret ids.
	roleAppRole = "keyroll-approle"

	tokenPeriod = 15 * time.Second
	tokenTTL    = 15 * time.Second
	tokenMaxTTL = 60 * time.Second

	// leasePath issues 10-minute leases (max TTL 1h): far longer than any token here.
	leasePath = "database/creds/tokens"

	// readyTimeout bounds how long a new RedisCluster takes to be Ready: its pods run on the real
	// node one after the other, each Ready through the kubelet's probe, while other tests' run too.
	readyTimeout = 2 * time.Minute
)

var (
	ground *testground.Ground
	k8s    client.Client
	cs     *kubernetes.Clientset
	// operatorLogs holds everything the operator logged, for the secret-leak check.
	operatorLogs = &syncBuffer{}

	opMu     sync.Mutex
	operator *harness.Operator
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(zap.New(zap.WriteTo(io.MultiWriter(os.Stderr, operatorLogs)), zap.UseDevMode(true)))
	g, c, stop, err := harness.StartPackage(testground.Options{Node: true, Workloads: true, Redis: true, Vault: true}, setupVault)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	ground, k8s = g, c
	if cs, err = kubernetes.NewForConfig(g.CP.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := startOperator(harness.Options{}); err != nil {
		fmt.Fprintf(os.Stderr, "starting the operator: %v\n", err)
		return 1
	}
	defer stopOperator()
	return m.Run()
}

// setupVault gives the operator what a Vault administrator would, plus the short-lived token roles.
func setupVault(ctx context.Context, g *testground.Ground) error {
	if err := harness.SetupVault(ctx, g, testground.RedisRole{Name: "tokens", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour}); err != nil {
		return err
	}
	role := func(name string) testground.KubernetesAuthRole {
		return testground.KubernetesAuthRole{Name: name, ServiceAccounts: []string{harness.OperatorSA},
			Namespaces: []string{harness.OperatorNS}, Policies: []string{harness.OperatorRole}}
	}
	periodic, bounded := role(rolePeriodic), role(roleBounded)
	periodic.TokenPeriod = tokenPeriod
	bounded.TokenTTL, bounded.TokenMaxTTL = tokenTTL, tokenMaxTTL
	for _, r := range []testground.KubernetesAuthRole{periodic, bounded} {
		if err := g.Vault.WriteKubernetesAuthRole(ctx, r); err != nil {
			return err
		}
	}
	return setupAppRole(ctx, g)
}

// setupAppRole enables the AppRole auth method at approle/ and writes roleAppRole.
func setupAppRole(ctx context.Context, g *testground.Ground) error {
	if err := g.Vault.Root.Sys().EnableAuthWithOptionsWithContext(ctx, "approle", &vaultapi.EnableAuthOptions{Type: "approle"}); err != nil {
		return fmt.Errorf("enabling approle auth: %w", err)
	}
	_, err := g.Vault.Root.Logical().WriteWithContext(ctx, "auth/approle/role/"+roleAppRole, map[string]any{
		"token_policies": harness.OperatorRole, "token_period": tokenPeriod.String(),
	})
	if err != nil {
		return fmt.Errorf("writing approle role %s: %w", roleAppRole, err)
	}
	return nil
}

// startOperator runs keyroll's manager in this process, as main.go wires it.
func startOperator(o harness.Options) error {
	op, err := harness.Start(context.Background(), ground, o)
	if err != nil {
		return err
	}
	opMu.Lock()
	operator = op
	opMu.Unlock()
	return nil
}

func stopOperator() {
	opMu.Lock()
	op := operator
	operator = nil
	opMu.Unlock()
	if op != nil {
		_ = op.Stop()
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
