// Command keyroll runs the keyroll operator: the RedisCluster and VaultConnection controllers in one
// controller-runtime manager, with leader election, metrics and health probes. It is wiring only.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	uzap "go.uber.org/zap"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers"
	"github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/controllers/rediscluster"
	"github.com/keyroll/keyroll/internal/consolelog"
)

func main() {
	var (
		metricsAddr    = flag.String("metrics-bind-address", ":8443", "Address the metrics endpoint binds to; 0 disables it.")
		metricsSecure  = flag.Bool("metrics-secure", true, "Serve metrics over HTTPS to scrapers whose token the API server authenticates and authorises (get on /metrics); false serves plain HTTP to anyone, for local use only.")
		metricsCerts   = flag.String("metrics-cert-dir", "", "Directory with tls.crt and tls.key for the metrics endpoint, reloaded when they change; empty: a self-signed certificate made at start.")
		probeAddr      = flag.String("health-probe-bind-address", ":8081", "Address the /healthz and /readyz endpoints bind to.")
		pprofAddr      = flag.String("pprof-bind-address", "0", "Address Go's pprof endpoints (/debug/pprof/) bind to, for profiling; 0 (the default) disables them. Bind it to a loopback address only.")
		leaderElect    = flag.Bool("leader-elect", true, "Elect one active manager through a Lease, so that only one replica renews, rotates and revokes.")
		leaderNS       = flag.String("leader-election-namespace", "", "Namespace of the leader-election Lease; defaults to the pod's namespace.")
		leaseDuration  = flag.Duration("leader-elect-lease-duration", 15*time.Second, "How long non-leaders wait before they may take over an unrenewed leadership.")
		renewDeadline  = flag.Duration("leader-elect-renew-deadline", 10*time.Second, "How long the leader keeps retrying to renew its leadership before it gives up.")
		retryPeriod    = flag.Duration("leader-elect-retry-period", 2*time.Second, "How long candidates wait between tries to acquire or renew leadership.")
		saNamespace    = flag.String("service-account-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the operator's service account, which logs in to Vault with Kubernetes auth.")
		saName         = flag.String("service-account-name", "keyroll-manager", "Name of the operator's service account.")
		workers        = flag.Int("max-concurrent-reconciles", rediscluster.DefaultWorkers, "How many RedisClusters are reconciled at once.")
		probeImage     = flag.String("redis-probe-image", "", "Image of the Redis pods' probe sidecar (keyroll-probe, in the manager's image); empty: the image of the manager's own pod (container manager, pod POD_NAME in POD_NAMESPACE).")
		watchSelector  = flag.String("watch-selector", "", "Label selector of the RedisClusters and VaultConnections this manager handles (e.g. keyroll.dev/install=canary); empty: all. Others, and what belongs to them, it leaves alone: for two installs side by side on one cluster.")
		secretsNS      = flag.String("vault-secrets-namespace", "", "The only namespace whose Secrets a VaultConnection may name (auth.token.secretRef, auth.appRole.secretIDRef, tls.caSecretRef); empty: the operator's own (--service-account-namespace).")
		usersCheck     = flag.Duration("redis-users-check-interval", controllers.DefaultUsersCheckInterval, "How often keyroll compares every Redis node's ACL (ACL LIST) with what it confirmed there, and removes users that are not the cluster's; negative turns the comparison off.")
		webhookPort    = flag.Int("webhook-port", 9443, "Port of the conversion webhook, served by every replica; 0 serves none and leaves the CRDs alone (a manager that is not the install's, say one run for development beside it): requests in keyroll.dev/v1alpha1 then fail unless another manager serves them.")
		webhookHost    = flag.String("webhook-host", "", "Address the conversion webhook binds to; empty: every address of the pod.")
		webhookService = flag.String("webhook-service", "keyroll-webhook", "Service (in --service-account-namespace) through which the API server reaches the conversion webhook; keyroll points its CRDs at it.")
		webhookURL     = flag.String("webhook-url", "", "Where the API server reaches the conversion webhook instead of --webhook-service, for a manager outside the cluster (https://host:port/convert).")
		webhookSecret  = flag.String("webhook-secret", "keyroll-webhook-certificate", "Secret (in --service-account-namespace) where keyroll keeps the conversion webhook's CA and certificate.")
		webhookCert    = flag.Duration("webhook-cert-validity", conversion.DefaultCertValidity, "How long a conversion webhook certificate is valid; it is replaced after two thirds of it.")
		webhookCA      = flag.Duration("webhook-ca-validity", conversion.DefaultCAValidity, "How long the conversion webhook's CA is valid; it is replaced after two thirds of it, and trusted until it expires.")
		webhookCertBy  = flag.String("webhook-certificate", "keyroll", "Who keeps the conversion webhook's certificate: keyroll (in --webhook-secret, from a CA of its own; it renews both), cert-manager (a cert-manager Certificate writes tls.crt, tls.key and ca.crt in --webhook-secret; keyroll waits for it, serves it and puts its ca.crt in the CRDs) or olm (Operator Lifecycle Manager mounts tls.crt and tls.key in --webhook-cert-dir and sets the CRDs' conversion itself; keyroll serves the files). --webhook-cert-validity and --webhook-ca-validity are for keyroll's own.")
		webhookCertDir = flag.String("webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Where Operator Lifecycle Manager mounts the conversion webhook's certificate, with --webhook-certificate=olm.")
		leaseCheck     = flag.Duration("lease-check-interval", controllers.DefaultLeaseCheckInterval, "How often a live lease is looked up in Vault besides its renewals, so that a lease revoked outside keyroll is noticed within about that long; negative turns the lookups off.")
	)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(newLogger(&zapOpts))
	log := ctrl.Log.WithName("setup")
	selector, err := labels.Parse(*watchSelector)
	if err != nil {
		log.Error(err, "Invalid --watch-selector")
		os.Exit(1)
	}
	if *webhookCertBy != "keyroll" && *webhookCertBy != "cert-manager" && *webhookCertBy != "olm" {
		log.Error(nil, "Invalid --webhook-certificate: want keyroll, cert-manager or olm", "value", *webhookCertBy)
		os.Exit(1)
	}

	if err := run(ctrl.SetupSignalHandler(), managerOptions{
		metrics: metricsOptions(*metricsAddr, *metricsSecure, *metricsCerts), probeAddr: *probeAddr, pprofAddr: *pprofAddr,
		leaderElect: *leaderElect, leaderNS: *leaderNS,
		leaseDuration: *leaseDuration, renewDeadline: *renewDeadline, retryPeriod: *retryPeriod,
		serviceAccount:     types.NamespacedName{Namespace: *saNamespace, Name: *saName},
		leaseCheckInterval: *leaseCheck, usersCheckInterval: *usersCheck, workers: *workers, probeImage: *probeImage, watchSelector: selector,
		vaultSecretsNamespace: *secretsNS,
		webhookPort:           *webhookPort,
		webhookHost:           *webhookHost,
		conversion: conversion.Options{
			Secret:       types.NamespacedName{Namespace: *saNamespace, Name: *webhookSecret},
			Service:      types.NamespacedName{Namespace: *saNamespace, Name: *webhookService},
			URL:          *webhookURL,
			CertValidity: *webhookCert, CAValidity: *webhookCA,
			CertManager: *webhookCertBy == "cert-manager",
			CertDir:     olmCertDir(*webhookCertBy, *webhookCertDir),
		},
	}); err != nil {
		log.Error(err, "Manager stopped with an error")
		os.Exit(1)
	}
}

// olmCertDir is where OLM mounts the webhook's certificate, when it keeps it.
func olmCertDir(by, dir string) string {
	if by == "olm" {
		return dir
	}
	return ""
}

// newLogger is zap as the flags say; console lines leave out the reconcile context fields
// (consolelog), JSON lines keep them.
func newLogger(o *zap.Options) logr.Logger {
	encoder := flag.Lookup("zap-encoder").Value.String()
	if encoder == "console" || (encoder == "" && o.Development) {
		return zap.New(zap.UseFlagOptions(o), zap.RawZapOpts(uzap.WrapCore(consolelog.Short)))
	}
	return zap.New(zap.UseFlagOptions(o))
}

type managerOptions struct {
	metrics                                   metricsserver.Options
	probeAddr                                 string
	pprofAddr                                 string
	leaderElect                               bool
	leaderNS                                  string
	leaseDuration, renewDeadline, retryPeriod time.Duration
	serviceAccount                            types.NamespacedName
	leaseCheckInterval, usersCheckInterval    time.Duration
	workers                                   int
	probeImage                                string
	watchSelector                             labels.Selector
	vaultSecretsNamespace                     string
	webhookPort                               int
	webhookHost                               string
	conversion                                conversion.Options
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(s))
	must(v1beta1.AddToScheme(s))
	must(v1alpha1.AddToScheme(s)) // for the conversion webhook
	must(apiextensionsv1.AddToScheme(s))
	must(externalsecrets.AddToScheme(s))
	return s
}

func run(ctx context.Context, o managerOptions) error {
	cfg := ctrl.GetConfigOrDie()
	scheme := newScheme()
	var converter *conversion.Webhook
	var webhookServer webhook.Server
	if o.webhookPort != 0 {
		converter = conversion.New(o.conversion)
		// The port is open to every pod. controller-runtime makes the http.Server itself, and
		// webhook.Options cannot set its timeouts (v0.22: ReadHeaderTimeout 32 s, MaxHeaderBytes
		// 1 MiB, no ReadTimeout or WriteTimeout): the handler bounds each review's size and time
		// (conversion.MaxReviewBytes). HTTP/2 is off, as on the metrics endpoint.
		webhookServer = webhook.NewServer(webhook.Options{Host: o.webhookHost, Port: o.webhookPort,
			TLSOpts: []func(*tls.Config){converter.TLS, http1Only}})
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		WebhookServer:                 webhookServer,
		Scheme:                        scheme,
		Metrics:                       o.metrics,
		HealthProbeBindAddress:        o.probeAddr,
		PprofBindAddress:              o.pprofAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "keyroll.keyroll.dev",
		LeaderElectionNamespace:       o.leaderNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &o.renewDeadline,
		RetryPeriod:                   &o.retryPeriod,
		// Only Secrets that keyroll labels are cached: never every Secret of the cluster.
		Cache: controllers.CacheOptions(cfg, o.watchSelector),
	})
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	probeImage, err := redisProbeImage(ctx, cs, o.probeImage)
	if err != nil {
		return err
	}
	recorder, err := eventRecorder(ctx, cs, scheme)
	if err != nil {
		return err
	}
	if converter != nil {
		if err := converter.Setup(ctx, mgr); err != nil {
			return err
		}
	}
	if _, err := controllers.Setup(mgr, controllers.Options{
		Recorder: recorder, Clock: clock.RealClock{}, Tokens: cs, ServiceAccount: o.serviceAccount,
		VaultSecretsNamespace: o.vaultSecretsNamespace,
		LeaseCheckInterval:    o.leaseCheckInterval, UsersCheckInterval: o.usersCheckInterval, Workers: o.workers, ProbeImage: probeImage,
	}); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// redisProbeImage is --redis-probe-image, or else the image the manager's own pod runs: the probe
// sidecar's binary ships in the manager's image, so that one image reference (however a
// kustomization or a chart sets it) serves both.
func redisProbeImage(ctx context.Context, cs kubernetes.Interface, flagged string) (string, error) {
	if flagged != "" {
		return flagged, nil
	}
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || name == "" {
		return "", errors.New("--redis-probe-image is empty and the manager does not know its own pod (POD_NAME and POD_NAMESPACE unset): set --redis-probe-image to the manager's image")
	}
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the manager's own pod %s/%s for its image (or set --redis-probe-image): %w", ns, name, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "manager" {
			return c.Image, nil
		}
	}
	return "", fmt.Errorf("the manager's pod %s/%s has no container named manager: set --redis-probe-image", ns, name)
}

// eventRecorder records events through the events.k8s.io API.
func eventRecorder(ctx context.Context, cs kubernetes.Interface, scheme *runtime.Scheme) (events.EventRecorder, error) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, err
	}
	return b.NewRecorder(scheme, "keyroll"), nil
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
