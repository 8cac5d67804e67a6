// Package harness runs keyroll's manager in a test process against a test ground, wired as
// main.go wires it, and sets Vault up for it as docs/vault-administrators.md describes.
package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	esv1 "github.com/external-secrets/external-secrets/apis/externalsecrets/v1"
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
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers"
	"github.com/keyroll/keyroll/controllers/rediscluster"
	"github.com/keyroll/keyroll/test/testground"
)

// The operator's identity in the test ground, and its Vault role and policy.
const (
	OperatorNS   = "keyroll-system"
	OperatorSA   = "keyroll-manager"
	OperatorRole = "keyroll"
)

// SetupVault gives the operator what a Vault administrator would: the Redis roles, the policy of
// deploy/vault/policy.hcl, and Kubernetes auth for its service account.
func SetupVault(ctx context.Context, g *testground.Ground, roles ...testground.RedisRole) error {
	v := g.Vault
	if err := v.ConfigureRedis(ctx, g.Redis, roles...); err != nil {
		return err
	}
	policy, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "vault", "policy.hcl"))
	if err != nil {
		return err
	}
	if err := v.WritePolicy(ctx, OperatorRole, string(policy)); err != nil {
		return err
	}
	if err := g.CP.EnsureServiceAccount(ctx, OperatorNS, OperatorSA); err != nil {
		return err
	}
	return v.EnableKubernetesAuth(ctx, g.CP, testground.KubernetesAuthRole{
		Name: OperatorRole, ServiceAccounts: []string{OperatorSA}, Namespaces: []string{OperatorNS},
		Policies: []string{OperatorRole}, TokenTTL: time.Hour,
	})
}

// Scheme holds the types the operator uses.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	_ = esv1.AddToScheme(s)
	return s
}

// Options adjust an operator started by Start.
type Options struct {
	// LeaderElection on, with these timings (zero: off).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// MetricsAddr and ProbeAddr are where the metrics and /healthz, /readyz endpoints listen ("": off).
	MetricsAddr, ProbeAddr string
	// VaultObserver sees every Vault request.
	VaultObserver func(connection, op, outcome string, seconds float64)
	// LeaseCheckInterval is the operator's --lease-check-interval (zero: its default).
	LeaseCheckInterval time.Duration
}

// Operator is a running manager.
type Operator struct {
	Manager    ctrl.Manager
	Reconciler *rediscluster.Reconciler
	cancel     context.CancelFunc
	done       chan error
	broadcast  events.EventBroadcaster
}

// Start runs keyroll's manager against the test ground until Stop.
func Start(ctx context.Context, g *testground.Ground, o Options) (*Operator, error) {
	scheme := Scheme()
	cfg := g.CP.Config
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mo := ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: metricsAddr(o.MetricsAddr)}, HealthProbeBindAddress: metricsAddr(o.ProbeAddr),
		Cache: controllers.CacheOptions(cfg, nil),
		// Several operators, or a restarted one, register their controllers in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if o.LeaseDuration > 0 {
		mo.LeaderElection, mo.LeaderElectionID, mo.LeaderElectionNamespace = true, "keyroll.keyroll.dev", OperatorNS
		mo.LeaseDuration, mo.RenewDeadline, mo.RetryPeriod = &o.LeaseDuration, &o.RenewDeadline, &o.RetryPeriod
		mo.LeaderElectionReleaseOnCancel = true
	}
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	op := &Operator{Manager: mgr, cancel: cancel, done: make(chan error, 1)}
	op.broadcast = events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	if err := op.broadcast.StartRecordingToSinkWithContext(ctx); err != nil {
		cancel()
		return nil, err
	}
	op.Reconciler, err = controllers.Setup(mgr, controllers.Options{
		Recorder: op.broadcast.NewRecorder(scheme, "keyroll"), Clock: clock.RealClock{}, Tokens: cs,
		ServiceAccount: types.NamespacedName{Namespace: OperatorNS, Name: OperatorSA},
		VaultObserver:  o.VaultObserver, LeaseCheckInterval: o.LeaseCheckInterval, ProbeImage: testground.ProbeImage,
	})
	if err != nil {
		cancel()
		return nil, err
	}
	go func() { op.done <- mgr.Start(ctx) }()
	return op, nil
}

func metricsAddr(addr string) string {
	if addr == "" {
		return "0"
	}
	return addr
}

// Elected is closed once this operator leads (at once without leader election).
func (o *Operator) Elected() <-chan struct{} { return o.Manager.Elected() }

// Stop cancels the manager (a leader releases its Lease) and waits for it to end.
func (o *Operator) Stop() error {
	o.cancel()
	err := <-o.done
	o.broadcast.Shutdown()
	return err
}

// StartPackage starts what a test package's TestMain needs: the test ground with opts, setup on
// it (nil: none) and a client with the operator's scheme. stop ends the ground. Errors name the
// step that failed.
func StartPackage(opts testground.Options, setup func(context.Context, *testground.Ground) error) (g *testground.Ground, c client.Client, stop func(), err error) {
	if g, err = testground.Start(opts); err != nil {
		return nil, nil, nil, fmt.Errorf("starting the test ground: %w", err)
	}
	if setup != nil {
		if err := setup(context.Background(), g); err != nil {
			g.Stop()
			return nil, nil, nil, fmt.Errorf("setting up the test ground: %w", err)
		}
	}
	if c, err = client.New(g.CP.Config, client.Options{Scheme: Scheme()}); err != nil {
		g.Stop()
		return nil, nil, nil, fmt.Errorf("client: %w", err)
	}
	return g, c, g.Stop, nil
}
