// Package framework is what keyroll's tests under test/ are written with, as cluster-api's
// test/framework is: a test package's TestMain builds a Framework from a Config, which starts the
// test ground the package needs (test/testground), gives keyroll's operator what a Vault
// administrator would, and runs the operator in the test process or as its own process; the tests
// then create namespaces, VaultConnections and RedisClusters from options, wait on conditions and
// readiness, check credentials on Vault's Redis and on every Redis pod, read events, Vault's
// leases and its audit log, and follow consumers.
//
// Every name a package creates in the ground (namespaces, cluster-scoped objects, Vault roles,
// the operator's namespace and Vault role) goes through Name, which prefixes it with the
// package's Config.Name: two packages never create the same object, so that they can share one
// ground.
package framework

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/test/testground"
)

// Config is what a test package asks of its framework.
type Config struct {
	// Name prefixes everything the package creates in the ground (see Framework.Name); empty for
	// packages that create the fixed names of deploy/samples and the docs.
	Name string
	// Ground selects the components of the test ground.
	Ground testground.Options
	// Roles are the package's Vault roles on the ground's Redis, named without the prefix; with
	// Vault and Redis in Ground the operator's Kubernetes auth role and policy are written too.
	Roles []testground.RedisRole
	// Setup runs once the ground is up and Vault is set up, before any operator starts.
	Setup func(ctx context.Context, f *Framework) error
	// Operator, when not nil, runs keyroll's manager in the test process during the tests.
	Operator *OperatorOptions
	// Teardown runs after the tests, before the ground stops, with their exit code; it returns
	// the package's (a check over everything the tests left, say).
	Teardown func(ctx context.Context, f *Framework, code int) int
	// OwnGround starts a ground of the package's own even where a shared one runs: the package
	// holds the node's kubelet or kwok, or stops a component, which the other packages would feel.
	// (A package without a Name always has its own: its objects are not told apart.)
	OwnGround bool
	// Alone says that the package's measurements need the machine to themselves (timings under
	// a load the package makes itself): make test runs it after every other package, not beside
	// the shared ground's (test/tools/packages.sh lists it in the tier "alone").
	Alone bool
	// OwnVault gives the package a Vault server of its own on a shared ground (it seals Vault, or
	// counts every request Vault answers): set up as the shared one is, its database engine on the
	// shared Redis and its Kubernetes auth on the shared API server.
	OwnVault bool
	// InfoLogs has the operator in the test process log at Info, not at debug (the default). Every
	// line also goes to Framework.Logs, for the tests that look for what must never be logged.
	InfoLogs bool
}

// The operator's service account: the name the manifests give it.
const OperatorSA = "keyroll-manager"

// Framework is one test package's handle on its test ground.
type Framework struct {
	// Config is what the package asked for.
	Config    Config
	Ground    *testground.Ground
	Client    client.Client
	Clientset *kubernetes.Clientset
	// Logs holds every line that operators in this process logged.
	Logs *SyncBuffer
	// OperatorNS and OperatorRole are the operator's namespace (its service account, leader
	// election Lease and token store are there) and its Kubernetes auth role and policy in Vault.
	OperatorNS, OperatorRole string

	operatorMu sync.Mutex // guards operator, which tests stop and start again
	operator   *Operator
	ownVault   *testground.Vault

	previousOnce sync.Once // Previous
	previousDir  string
	previousErr  error
}

// New returns a Framework for a package; Run starts it.
func New(c Config) *Framework {
	f := &Framework{Config: c, Logs: &SyncBuffer{}}
	f.OperatorNS, f.OperatorRole = f.Name("keyroll-system"), f.Name("keyroll")
	return f
}

// Name is base prefixed with the package's name: the name of a namespace, a cluster-scoped object
// or a Vault role of this package.
func (f *Framework) Name(base string) string {
	if f.Config.Name == "" {
		return base
	}
	return f.Config.Name + "-" + base
}

// LabelPackage marks the RedisClusters and VaultConnections a package creates with the package's
// name; the package's operators see those alone (--watch-selector), so that packages that share a
// ground never act on each other's.
const LabelPackage = "test.keyroll.dev/package"

// Selector selects the package's RedisClusters and VaultConnections (nil, all of them, for a
// package without a Name).
func (f *Framework) Selector() labels.Selector {
	if f.Config.Name == "" {
		return nil
	}
	return labels.SelectorFromSet(labels.Set{LabelPackage: f.Config.Name})
}

// Label marks an object as the package's (see LabelPackage).
func (f *Framework) Label(obj client.Object) {
	if f.Config.Name == "" {
		return
	}
	l := obj.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l[LabelPackage] = f.Config.Name
	obj.SetLabels(l)
}

// Role is the name of the package's Vault role base.
func (f *Framework) Role(base string) string { return f.Name(base) }

// Path is the Vault path that issues the credentials of the package's role base.
func (f *Framework) Path(base string) string { return "database/creds/" + f.Role(base) }

// Run starts the ground, sets it up, runs the tests and stops everything; its result is the exit
// code for os.Exit. A step that fails is named on standard error and fails the package.
func (f *Framework) Run(m *testing.M) int {
	flag.Parse()
	f.setLogger()
	start := time.Now()
	if err := f.start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", f.label(), err)
		f.stop()
		return 1
	}
	how := "started"
	if f.Ground.Attached() {
		how = "shared"
	}
	fmt.Fprintf(os.Stderr, "%s: test ground %s in %s\n", f.label(), how, time.Since(start).Round(time.Millisecond))
	defer f.stop()
	defer f.removePrevious()
	code := m.Run()
	if f.Config.Teardown != nil {
		code = f.Config.Teardown(context.Background(), f, code)
	}
	return code
}

func (f *Framework) label() string {
	if f.Config.Name == "" {
		return "framework"
	}
	return f.Config.Name
}

func (f *Framework) start() error {
	g, err := f.ground()
	if err != nil {
		return fmt.Errorf("starting the test ground: %w", err)
	}
	if err := f.Use(g); err != nil {
		return err
	}
	ctx := context.Background()
	if f.Config.OwnVault && g.Attached() && g.Vault != nil {
		if err := f.startOwnVault(ctx); err != nil {
			return fmt.Errorf("starting the package's own Vault: %w", err)
		}
	}
	if f.Ground.Vault != nil && f.Ground.Redis != nil {
		if err := f.SetupVault(ctx, f.Config.Roles...); err != nil {
			return fmt.Errorf("setting up Vault: %w", err)
		}
	}
	if f.Config.Setup != nil {
		if err := f.Config.Setup(ctx, f); err != nil {
			return fmt.Errorf("setting up the test ground: %w", err)
		}
	}
	if f.Config.Operator != nil {
		if err := f.StartOperator(*f.Config.Operator); err != nil {
			return fmt.Errorf("starting the operator: %w", err)
		}
	}
	return nil
}

// ground attaches to the shared ground that testground.SharedEnv names, when it runs every
// component the package asks for, or starts one of the package's own. Only packages that ask for
// the real node share it: on a ground with a real node, pods go there unless they ask for kwok's,
// and a package written for kwok alone would have its pods run (and their images pulled) for real.
func (f *Framework) ground() (*testground.Ground, error) {
	if path := os.Getenv(testground.SharedEnv); path != "" && f.Config.Name != "" && !f.Config.OwnGround && f.Config.Ground.Node {
		g, err := testground.Attach(path)
		if err != nil {
			return nil, err
		}
		if g.Options.Covers(f.Config.Ground) {
			return g, nil
		}
		g.Stop()
	}
	return testground.Start(f.Config.Ground)
}

// Use makes the framework work on a ground started elsewhere (a test's own, or one of a
// benchmark's), without setting anything up on it; Run does not stop it.
func (f *Framework) Use(g *testground.Ground) (err error) {
	f.Ground = g
	if f.Client, err = client.New(g.CP.Config, client.Options{Scheme: Scheme()}); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if f.Clientset, err = kubernetes.NewForConfig(g.CP.Config); err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	return nil
}

func (f *Framework) stop() {
	f.StopOperator()
	if f.ownVault != nil {
		f.ownVault.Stop()
	}
	if f.Ground != nil {
		f.Ground.Stop()
	}
}

// setLogger sends what controller-runtime and the operator log to standard error and Logs, at
// debug or Info (Config.InfoLogs); to the file KEYROLL_OPERATOR_LOG names, when set (to explain what a benchmark
// measured); nowhere while benchmarks run, which print numbers.
func (f *Framework) setLogger() {
	level := zap.Level(zapcore.DebugLevel)
	if f.Config.InfoLogs {
		level = zap.Level(zapcore.InfoLevel)
	}
	if path := os.Getenv("KEYROLL_OPERATOR_LOG"); path != "" {
		if file, err := os.Create(path); err == nil {
			ctrllog.SetLogger(zap.New(zap.WriteTo(io.MultiWriter(file, f.Logs)), zap.UseDevMode(true), level))
			return
		}
	}
	if b := flag.Lookup("test.bench"); b != nil && b.Value.String() != "" {
		ctrllog.SetLogger(logr.Discard())
		return
	}
	ctrllog.SetLogger(zap.New(zap.WriteTo(io.MultiWriter(os.Stderr, f.Logs)), zap.UseDevMode(true), level))
}
