package framework

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers"
	"github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/controllers/rediscluster"
	"github.com/keyroll/keyroll/test/testground"
)

// Scheme holds the types the operator and the tests use.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1beta1.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	_ = apiextensionsv1.AddToScheme(s)
	_ = externalsecrets.AddToScheme(s)
	return s
}

// OperatorOptions adjust an operator run in the test process.
type OperatorOptions struct {
	// LeaderElection on, with these timings (zero: off).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Endpoints serves the metrics and the /healthz and /readyz endpoints on free loopback ports
	// (Operator.MetricsURL, Operator.ProbesURL).
	Endpoints bool
	// VaultObserver sees every Vault request.
	VaultObserver func(connection, op, outcome string, seconds float64)
	// LeaseCheckInterval is the operator's --lease-check-interval (zero: its default).
	LeaseCheckInterval time.Duration
	// UsersCheckInterval is the operator's --redis-users-check-interval (zero: its default).
	UsersCheckInterval time.Duration
	// AsServiceAccount makes every request of the operator to the API server as its service
	// account (impersonated): with the permissions an install grants it, and no more.
	AsServiceAccount bool
	// ProbeImage is the operator's --redis-probe-image (empty: testground.ProbeImage).
	ProbeImage string
	// Conversion, when set, has the operator serve the conversion webhook as main.go does, on a
	// free loopback port that the CRDs reach by URL (Options.URL and Secret are set here; the
	// Secret is keyroll-webhook-certificate in the operator's namespace). Operator.Conversion is it.
	Conversion *conversion.Options
	// ConversionOnly runs the conversion webhook alone, without the controllers: for a manager of
	// an earlier release, which reads and writes v1alpha1, to run beside.
	ConversionOnly bool
}

// Election is a leader election quick enough for tests (a 4 s Lease).
var Election = OperatorOptions{LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}

// Operator is keyroll's manager running in the test process, wired as main.go wires it.
type Operator struct {
	Manager    ctrl.Manager
	Reconciler *rediscluster.Reconciler
	// MetricsURL and ProbesURL are its metrics endpoint and the base of /healthz and /readyz, with
	// OperatorOptions.Endpoints.
	MetricsURL, ProbesURL string
	// Conversion is the conversion webhook it serves, with OperatorOptions.Conversion.
	Conversion *conversion.Webhook
	cancel     context.CancelFunc
	done       chan error
	broadcast  events.EventBroadcaster
}

// NewOperator runs another keyroll manager in the test process until its Stop, as the package's
// operator identity (several may run at once: leader election decides which acts).
func (f *Framework) NewOperator(ctx context.Context, o OperatorOptions) (*Operator, error) {
	cfg, tokens := f.Ground.CP.Config, kubernetes.Interface(f.Clientset)
	if o.AsServiceAccount {
		cfg = rest.CopyConfig(cfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + f.OperatorNS + ":" + OperatorSA,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + f.OperatorNS, "system:authenticated"}}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		tokens = cs
	}
	op := &Operator{done: make(chan error, 1)}
	metricsAddr, probeAddr := "0", "0"
	if o.Endpoints {
		mp, err := testground.FreePort()
		if err != nil {
			return nil, err
		}
		pp, err := testground.FreePort()
		if err != nil {
			return nil, err
		}
		metricsAddr, probeAddr = fmt.Sprintf("127.0.0.1:%d", mp), fmt.Sprintf("127.0.0.1:%d", pp)
		op.MetricsURL, op.ProbesURL = "http://"+metricsAddr+"/metrics", "http://"+probeAddr
	}
	scheme := Scheme()
	mo := ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: metricsAddr}, HealthProbeBindAddress: probeAddr,
		Cache: controllers.CacheOptions(cfg, f.Selector()),
		// Several operators, or a restarted one, register their controllers in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if o.LeaseDuration > 0 {
		mo.LeaderElection, mo.LeaderElectionID, mo.LeaderElectionNamespace = true, "keyroll.keyroll.dev", f.OperatorNS
		mo.LeaseDuration, mo.RenewDeadline, mo.RetryPeriod = &o.LeaseDuration, &o.RenewDeadline, &o.RetryPeriod
		mo.LeaderElectionReleaseOnCancel = true
	}
	if o.Conversion != nil {
		port, err := testground.FreePort()
		if err != nil {
			return nil, err
		}
		co := *o.Conversion
		co.URL = fmt.Sprintf("https://127.0.0.1:%d%s", port, conversion.Path)
		co.Secret = types.NamespacedName{Namespace: f.OperatorNS, Name: "keyroll-webhook-certificate"}
		op.Conversion = conversion.New(co)
		mo.WebhookServer = webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, TLSOpts: []func(*tls.Config){op.Conversion.TLS}})
	}
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		return nil, err
	}
	op.Manager = mgr
	if op.Conversion != nil {
		if err := op.Conversion.Setup(ctx, mgr); err != nil {
			return nil, err
		}
	}
	ctx, op.cancel = context.WithCancel(ctx)
	op.broadcast = events.NewBroadcaster(&events.EventSinkImpl{Interface: tokens.EventsV1()})
	if err := op.broadcast.StartRecordingToSinkWithContext(ctx); err != nil {
		op.cancel()
		return nil, err
	}
	if o.ConversionOnly {
		go func() { op.done <- mgr.Start(ctx) }()
		return op, nil
	}
	op.Reconciler, err = controllers.Setup(mgr, controllers.Options{
		Recorder: op.broadcast.NewRecorder(scheme, "keyroll"), Clock: clock.RealClock{}, Tokens: tokens,
		ServiceAccount: types.NamespacedName{Namespace: f.OperatorNS, Name: OperatorSA},
		VaultObserver:  o.VaultObserver, LeaseCheckInterval: o.LeaseCheckInterval, UsersCheckInterval: o.UsersCheckInterval,
		ProbeImage: cmp.Or(o.ProbeImage, testground.ProbeImage),
	})
	if err != nil {
		op.cancel()
		return nil, err
	}
	go func() { op.done <- mgr.Start(ctx) }()
	return op, nil
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

// StartOperator runs the package's operator in the test process (Operator returns it); a running
// one is stopped first.
func (f *Framework) StartOperator(o OperatorOptions) error {
	f.StopOperator()
	op, err := f.NewOperator(context.Background(), o)
	if err != nil {
		return err
	}
	f.operatorMu.Lock()
	f.operator = op
	f.operatorMu.Unlock()
	return nil
}

// Operator is the package's operator running in the test process (nil while none runs).
func (f *Framework) Operator() *Operator {
	f.operatorMu.Lock()
	defer f.operatorMu.Unlock()
	return f.operator
}

// StopOperator stops the package's operator, if one runs; it releases its Lease.
func (f *Framework) StopOperator() {
	f.operatorMu.Lock()
	op := f.operator
	f.operator = nil
	f.operatorMu.Unlock()
	if op != nil {
		_ = op.Stop()
	}
}

// RestartOperator stops the package's operator and starts a new one with the options of
// Config.Operator, as a pod restart would.
func (f *Framework) RestartOperator(t testing.TB) {
	t.Helper()
	o := OperatorOptions{}
	if f.Config.Operator != nil {
		o = *f.Config.Operator
	}
	if err := f.StartOperator(o); err != nil {
		t.Fatalf("restarting the operator: %v", err)
	}
}
