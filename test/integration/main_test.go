// Package integration runs keyroll's reconcilers in a manager against the real test ground: a
// kube-apiserver and etcd, kube-controller-manager with kwok (pods become Ready), a Vault dev
// server with the database secrets engine and Kubernetes auth, and redis-server.
package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers"
	"github.com/keyroll/keyroll/test/testground"
)

// The operator's identity in the test ground, and its Vault role and policy.
const (
	operatorNS   = "keyroll-system"
	operatorSA   = "keyroll-manager"
	operatorRole = "keyroll"
)

var (
	ground     *testground.Ground
	k8s        client.Client
	cs         *kubernetes.Clientset
	reconciler *controllers.RedisClusterReconciler
	// stopOperator stops the running operator (restartOperator replaces it).
	stopOperator func()
	// vaultCalls counts the HTTP attempts the operator makes to Vault, per VaultConnection.
	vaultCalls = &callCounter{}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	var err error
	ground, err = testground.Start(testground.Options{Workloads: true, Redis: true, Vault: true})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the test ground: %v\n", err)
		return 1
	}
	defer ground.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := setupVault(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "setting up Vault: %v\n", err)
		return 1
	}
	if stopOperator, err = startOperator(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "starting the operator: %v\n", err)
		return 1
	}
	defer func() { stopOperator() }()
	return m.Run()
}

// setupVault does what deploy/vault describes for a Vault administrator: Redis roles, the
// operator's policy, and Kubernetes auth for the operator's service account.
func setupVault(ctx context.Context) error {
	v := ground.Vault
	err := v.ConfigureRedis(ctx, ground.Redis,
		testground.RedisRole{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		testground.RedisRole{Name: "short", DefaultTTL: 20 * time.Second, MaxTTL: time.Hour},
		testground.RedisRole{Name: "restart", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	)
	if err != nil {
		return err
	}
	policy, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "vault", "policy.hcl"))
	if err != nil {
		return err
	}
	if err := v.WritePolicy(ctx, operatorRole, string(policy)); err != nil {
		return err
	}
	if err := ground.CP.EnsureServiceAccount(ctx, operatorNS, operatorSA); err != nil {
		return err
	}
	return v.EnableKubernetesAuth(ctx, ground.CP, testground.KubernetesAuthRole{
		Name: operatorRole, ServiceAccounts: []string{operatorSA}, Namespaces: []string{operatorNS},
		Policies: []string{operatorRole}, TokenTTL: time.Hour,
	})
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// restartOperator stops the operator and starts a new one, as a pod restart would.
func restartOperator(t *testing.T) {
	t.Helper()
	stopOperator()
	var err error
	if stopOperator, err = startOperator(context.Background()); err != nil {
		stopOperator = func() {}
		t.Fatalf("restarting the operator: %v", err)
	}
}

// startOperator runs keyroll's manager in this process, as main.go wires it.
func startOperator(ctx context.Context) (func(), error) {
	var err error
	scheme := newScheme()
	cfg := ground.CP.Config
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	if cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: controllers.CacheOptions(),
		// A restarted operator registers its controllers again in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		cancel()
		return nil, err
	}
	reconciler, err = controllers.Setup(mgr, controllers.Options{
		Recorder: b.NewRecorder(scheme, "keyroll"), Clock: clock.RealClock{}, Tokens: cs,
		ServiceAccount: types.NamespacedName{Namespace: operatorNS, Name: operatorSA},
		VaultObserver:  func(conn, _, _ string, _ float64) { vaultCalls.add(conn) },
	})
	if err != nil {
		cancel()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() {
		cancel()
		b.Shutdown()
		<-done
	}, nil
}

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

// of is the number of calls made through one VaultConnection so far.
func (c *callCounter) of(conn string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[conn]
}
