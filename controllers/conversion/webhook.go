// Package conversion serves the conversion webhook between keyroll's API versions on every manager
// replica, not only the leader: the certificate it serves (made and rotated by keyroll from a CA of
// its own and kept in a Secret; or kept in that Secret by cert-manager; or mounted by Operator
// Lifecycle Manager); the CRDs' conversion settings (the webhook's Service or URL and the CA
// bundle; OLM writes its own); and, once per start of the leader, every stored object rewritten at
// the storage version, with the CRDs' status.storedVersions set to it alone.
package conversion

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/certs"
)

// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;update,resourceNames=redisclusters.keyroll.dev;vaultconnections.keyroll.dev
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions/status,verbs=update,resourceNames=redisclusters.keyroll.dev;vaultconnections.keyroll.dev
// The Secret is read, created and patched with the manager's rights on Secrets (controllers/rbac.go).

// Path is where the webhook answers conversion reviews.
const Path = "/convert"

// CRDs are keyroll's CustomResourceDefinitions, whose versions the webhook converts.
var CRDs = []string{"redisclusters.keyroll.dev", "vaultconnections.keyroll.dev"}

// Options configure the webhook.
type Options struct {
	// Secret is the Secret that keeps the CA and the serving certificate.
	Secret types.NamespacedName
	// Service is the Service in front of the replicas' webhook servers (port 443); the API server
	// reaches the webhook through it, and the certificate names it.
	Service types.NamespacedName
	// URL, when set, is where the API server reaches the webhook instead of Service: for a manager
	// outside the cluster (development, tests). Its host is in the certificate.
	URL string
	// CertValidity and CAValidity are how long a serving certificate and a CA are valid; each is
	// replaced after two thirds of it.
	CertValidity, CAValidity time.Duration
	// Reload is how often each replica reads the Secret for a replaced certificate.
	Reload time.Duration
	// CertManager says that a cert-manager Certificate keeps the Secret (tls.crt, tls.key, and
	// ca.crt, its issuer's CA): keyroll makes and renews nothing, reads the Secret, serves its
	// certificate and puts its ca.crt in the CRDs. CertValidity and CAValidity are then unused.
	CertManager bool
	// CertManagerWait is how long Setup waits for cert-manager to write the Secret, or for the
	// files in CertDir (default 2 minutes), before the manager gives up starting.
	CertManagerWait time.Duration
	// CertDir, when set, says that Operator Lifecycle Manager keeps the certificate and the CRDs'
	// conversion settings: it mounts tls.crt and tls.key in CertDir and writes its CA into the
	// CRDs. keyroll serves the files, reloading them, and touches neither a Secret nor the CRDs'
	// conversion settings; its leader still migrates the stored objects.
	CertDir string
	// Clock tells the time.
	Clock clock.Clock
	// Reader reads the Secret and the CRDs from the API server, not from a cache (default: the
	// manager's API reader), and Writer writes them (default: the manager's client).
	Reader client.Reader
	Writer client.Client
}

// storage lists the storage version's objects of each CRD, to rewrite them.
var storage = map[string]func() client.ObjectList{
	"redisclusters.keyroll.dev":    func() client.ObjectList { return &v1beta1.RedisClusterList{} },
	"vaultconnections.keyroll.dev": func() client.ObjectList { return &v1beta1.VaultConnectionList{} },
}

// Defaults for Options.
const (
	DefaultCertValidity = 90 * 24 * time.Hour
	DefaultCAValidity   = 5 * 365 * 24 * time.Hour
	DefaultReload       = 10 * time.Second
)

func (o *Options) defaults() {
	if o.CertValidity == 0 {
		o.CertValidity = DefaultCertValidity
	}
	if o.CAValidity == 0 {
		o.CAValidity = DefaultCAValidity
	}
	if o.Reload == 0 {
		o.Reload = DefaultReload
	}
	if o.CertManagerWait == 0 {
		o.CertManagerWait = 2 * time.Minute
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// Webhook is the conversion webhook of one replica.
type Webhook struct {
	o       Options
	current atomic.Pointer[tls.Certificate]
}

// New makes the webhook of one replica; TLS is the webhook server's option that serves its
// certificate (pass it to webhook.Options.TLSOpts), and Setup starts the rest.
func New(o Options) *Webhook {
	o.defaults()
	return &Webhook{o: o}
}

// TLS makes the webhook server serve the certificate the Secret holds, as last read.
func (w *Webhook) TLS(c *tls.Config) {
	c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		if cert := w.current.Load(); cert != nil {
			return cert, nil
		}
		return nil, errors.New("no conversion webhook certificate yet")
	}
}

// Setup registers the conversion handler with the manager's webhook server, makes sure now,
// before the manager starts, that the Secret holds a certificate, that the CRDs trust it and that
// this replica serves it (the manager's caches list RedisClusters and VaultConnections, which
// may need converting, before any leader runs), then has every replica reload the certificate
// and the leader keep it, the CRDs and the stored objects.
func (w *Webhook) Setup(ctx context.Context, mgr ctrl.Manager) error {
	if w.o.Reader == nil {
		w.o.Reader = mgr.GetAPIReader()
	}
	if w.o.Writer == nil {
		w.o.Writer = mgr.GetClient()
	}
	mgr.GetWebhookServer().Register(Path, Handler(mgr.GetScheme()))
	k := &keeper{w: w}
	if err := w.ready(ctx, k); err != nil {
		return fmt.Errorf("conversion webhook: %w", err)
	}
	if err := mgr.Add(replicaRunnable(w.reload)); err != nil {
		return err
	}
	return mgr.Add(k)
}

// ready puts the certificate and the CRDs in order (unless OLM keeps them) and loads the
// certificate. Replicas starting together race to write the Secret and the CRDs: one wins, the
// others try again. A certificate kept by cert-manager or OLM may not be there yet: it is waited
// for, up to CertManagerWait.
func (w *Webhook) ready(ctx context.Context, k *keeper) error {
	waitUntil := w.o.Clock.Now().Add(w.o.CertManagerWait)
	for tries := 0; ; tries++ {
		var err error
		if w.o.CertDir == "" {
			err = k.trust(ctx)
		}
		if err == nil {
			err = w.load(ctx)
		}
		race := (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) && tries < 5
		waiting := (w.o.CertManager || w.o.CertDir != "") && errors.Is(err, errNoSecretYet) && w.o.Clock.Now().Before(waitUntil)
		if err == nil || (!race && !waiting) {
			return err
		}
		if waiting {
			ctrl.LoggerFrom(ctx).WithName("conversion-webhook").Info("Waiting for the webhook certificate", "from", w.source())
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-w.o.Clock.After(2 * time.Second):
			}
		}
	}
}

// replicaRunnable runs on every replica, leader or not.
type replicaRunnable func(context.Context) error

func (r replicaRunnable) Start(ctx context.Context) error { return r(ctx) }

// NeedLeaderElection: every replica serves the webhook.
func (replicaRunnable) NeedLeaderElection() bool { return false }

// reload reads the Secret now and every Reload, and serves the certificate it holds.
func (w *Webhook) reload(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("conversion-webhook")
	for {
		if err := w.load(ctx); err != nil {
			log.V(1).Info("Conversion webhook certificate not read", "secret", w.o.Secret, "reason", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.o.Clock.After(w.o.Reload):
		}
	}
}

func (w *Webhook) load(ctx context.Context) error {
	certPEM, keyPEM, err := w.read(ctx)
	if err != nil {
		return err
	}
	cert, leaf, err := certs.ServingCertificate(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("%s/%s: %w", KeyCert, KeyKey, err)
	}
	if old := w.current.Load(); old == nil || !old.Leaf.Equal(leaf) {
		w.current.Store(cert)
		ctrl.LoggerFrom(ctx).WithName("conversion-webhook").Info("Serving a conversion webhook certificate",
			"serial", leaf.SerialNumber.Text(16), "notAfter", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// read returns the serving certificate and its key: from CertDir, or from the Secret.
func (w *Webhook) read(ctx context.Context) (certPEM, keyPEM []byte, err error) {
	if dir := w.o.CertDir; dir != "" {
		certPEM, err = os.ReadFile(filepath.Join(dir, KeyCert))
		if err == nil {
			keyPEM, err = os.ReadFile(filepath.Join(dir, KeyKey))
		}
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: %w", errNoSecretYet, err)
		}
		return certPEM, keyPEM, err
	}
	var s corev1.Secret
	if err := w.o.Reader.Get(ctx, w.o.Secret, &s); err != nil {
		if w.o.CertManager && apierrors.IsNotFound(err) {
			return nil, nil, errNoSecretYet
		}
		return nil, nil, err
	}
	return s.Data[KeyCert], s.Data[KeyKey], nil
}

// source names where the certificate comes from, for the log.
func (w *Webhook) source() string {
	if w.o.CertDir != "" {
		return w.o.CertDir
	}
	return "Secret " + w.o.Secret.String()
}

// Serving is the certificate this replica serves now (nil before the first read).
func (w *Webhook) Serving() *tls.Certificate { return w.current.Load() }

// hosts are the names the serving certificate is for.
func (w *Webhook) hosts() ([]string, error) {
	if w.o.URL != "" {
		req, err := http.NewRequest(http.MethodPost, w.o.URL, nil)
		if err != nil {
			return nil, fmt.Errorf("webhook URL: %w", err)
		}
		host := req.URL.Hostname()
		if host == "" {
			return nil, fmt.Errorf("webhook URL %q has no host", w.o.URL)
		}
		return []string{host}, nil
	}
	svc := w.o.Service
	return []string{
		fmt.Sprintf("%s.%s.svc", svc.Name, svc.Namespace),
		fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, svc.Namespace),
		fmt.Sprintf("%s.%s", svc.Name, svc.Namespace), svc.Name,
	}, nil
}

// clientConfig is how the API server reaches the webhook.
func (w *Webhook) clientConfig(caBundle []byte) *apiextensionsv1.WebhookClientConfig {
	cc := &apiextensionsv1.WebhookClientConfig{CABundle: caBundle}
	if w.o.URL != "" {
		u := w.o.URL
		cc.URL = &u
		return cc
	}
	path, port := Path, int32(443)
	cc.Service = &apiextensionsv1.ServiceReference{Namespace: w.o.Service.Namespace, Name: w.o.Service.Name, Path: &path, Port: &port}
	return cc
}
