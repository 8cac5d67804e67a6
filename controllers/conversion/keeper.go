package conversion

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/certs"
)

// The keys of the webhook's certificate Secret (certs.Keep's; cert-manager's for the last three).
const (
	// KeyCABundle holds the CAs the API server is to trust, newest first.
	KeyCABundle = certs.KeyCABundle
	// KeyCAKey is the newest CA's private key (keyroll's own CA only).
	KeyCAKey = certs.KeyCAKey
	KeyCert  = certs.KeyCert
	KeyKey   = certs.KeyKey
)

// keeper runs on the leader: it keeps the Secret's CA and serving certificate valid, the CRDs'
// conversion settings pointing at the webhook with the CA bundle, and, once the webhook converts,
// the stored objects at the storage version.
type keeper struct {
	w        *Webhook
	migrated bool
}

// NeedLeaderElection: one replica writes the Secret and the CRDs.
func (*keeper) NeedLeaderElection() bool { return true }

// Start keeps the certificates and the CRDs until ctx ends.
func (k *keeper) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("conversion-webhook")
	o := k.w.o
	every := min(time.Minute, o.CertValidity/20)
	for {
		if err := k.keep(ctx); err != nil {
			log.Error(err, "Conversion webhook not in order; trying again", "in", every.String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-o.Clock.After(every):
		}
	}
}

func (k *keeper) keep(ctx context.Context) error {
	if k.w.o.CertDir == "" { // OLM keeps the certificate and the CRDs' conversion settings
		if err := k.trust(ctx); err != nil {
			return err
		}
	}
	if k.migrated {
		return nil
	}
	// The webhook converts once this replica serves the certificate the CRDs trust.
	if err := k.w.load(ctx); err != nil {
		return err
	}
	for _, name := range CRDs {
		if err := k.migrate(ctx, name); err != nil {
			return fmt.Errorf("migrating the stored %s: %w", name, err)
		}
	}
	k.migrated = true
	return nil
}

// trust keeps the certificates valid and the CRDs pointed at the webhook with their CA bundle.
func (k *keeper) trust(ctx context.Context) error {
	bundle, err := k.certificates(ctx)
	if err != nil {
		return fmt.Errorf("certificate Secret %s: %w", k.w.o.Secret, err)
	}
	for _, name := range CRDs {
		if err := k.inject(ctx, name, bundle); err != nil {
			return fmt.Errorf("CustomResourceDefinition %s: %w", name, err)
		}
	}
	return nil
}

// errNoSecretYet: cert-manager has not written the Secret yet, or OLM has not mounted the files.
var errNoSecretYet = errors.New("the webhook certificate is not there yet")

// certificates makes, renews and returns the CA bundle the Secret holds, and its serving
// certificate, and writes the Secret when something changed. With cert-manager it only reads
// them.
func (k *keeper) certificates(ctx context.Context) ([]byte, error) {
	o := k.w.o
	if o.CertManager {
		return k.certManagers(ctx)
	}
	log := ctrl.LoggerFrom(ctx).WithName("conversion-webhook")
	now := o.Clock.Now()
	var s corev1.Secret
	err := o.Reader.Get(ctx, o.Secret, &s)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	data := map[string][]byte{}
	for key, v := range s.Data {
		data[key] = v
	}
	hosts, err := k.w.hosts()
	if err != nil {
		return nil, err
	}
	// A new CA signs only once the API server has had time to trust it: the CRDs got the bundle
	// with it in an earlier round, and every replica reads the Secret within Reload.
	data, made, err := certs.Keep(now, data, hosts, certs.Policy{CAName: "keyroll conversion webhook CA",
		CAValidity: o.CAValidity, CertValidity: o.CertValidity, Settle: 3 * o.Reload, Margin: 3 * o.Reload})
	if err != nil {
		return nil, err
	}
	if made.CA {
		ca, _ := certs.ParseBundle(data[KeyCABundle])
		log.Info("Made a conversion webhook CA", "notAfter", ca[0].NotAfter.UTC().Format(time.RFC3339))
	}
	if made.Certificate {
		log.Info("Made a conversion webhook certificate", "hosts", hosts)
	}
	if exists && equality.Semantic.DeepEqual(data, s.Data) {
		return data[KeyCABundle], nil
	}
	if exists {
		// A patch that fails if another replica wrote the Secret since it was read.
		base := s.DeepCopy()
		s.Data = data
		return data[KeyCABundle], o.Writer.Patch(ctx, &s, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	}
	s.Data, s.Type = data, corev1.SecretTypeOpaque
	s.ObjectMeta = metav1.ObjectMeta{Namespace: o.Secret.Namespace, Name: o.Secret.Name,
		Labels: map[string]string{"app.kubernetes.io/name": "keyroll", "app.kubernetes.io/component": "conversion-webhook"}}
	return data[KeyCABundle], o.Writer.Create(ctx, &s)
}

// certManagers returns the CA bundle of the Secret that cert-manager keeps, once it holds a
// serving certificate that names the webhook and that one of the bundle's CAs signed: the API
// server would refuse any other.
func (k *keeper) certManagers(ctx context.Context) ([]byte, error) {
	o := k.w.o
	var s corev1.Secret
	if err := o.Reader.Get(ctx, o.Secret, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, errNoSecretYet
		}
		return nil, err
	}
	cas, err := certs.ParseBundle(s.Data[KeyCABundle])
	if err != nil {
		return nil, fmt.Errorf("%s: %w (the Certificate's issuer must give its CA: a CA or self-signed issuer does)", KeyCABundle, err)
	}
	_, leaf, err := certs.ServingCertificate(s.Data[KeyCert], s.Data[KeyKey])
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", KeyCert, KeyKey, err)
	}
	if !certs.InBundle(leaf, cas) {
		return nil, fmt.Errorf("%s is not signed by a CA of %s", KeyCert, KeyCABundle)
	}
	hosts, err := k.w.hosts()
	if err != nil {
		return nil, err
	}
	// The API server checks the first: the URL's host, or <service>.<namespace>.svc.
	if err := leaf.VerifyHostname(hosts[0]); err != nil {
		return nil, fmt.Errorf("%s is not for %s, the name the API server checks (the Certificate's dnsNames): %w", KeyCert, hosts[0], err)
	}
	return s.Data[KeyCABundle], nil
}

// inject points the CRD's conversion at the webhook, with the CA bundle.
func (k *keeper) inject(ctx context.Context, name string, bundle []byte) error {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := k.w.o.Reader.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
		return err
	}
	want := &apiextensionsv1.CustomResourceConversion{
		Strategy: apiextensionsv1.WebhookConverter,
		Webhook: &apiextensionsv1.WebhookConversion{
			ClientConfig:             k.w.clientConfig(bundle),
			ConversionReviewVersions: []string{"v1"},
		},
	}
	if equality.Semantic.DeepEqual(crd.Spec.Conversion, want) {
		return nil
	}
	crd.Spec.Conversion = want
	if err := k.w.o.Writer.Update(ctx, &crd); err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).WithName("conversion-webhook").Info("Pointed the CRD's conversion at the webhook", "crd", name)
	return nil
}

// migrate rewrites every stored object of the CRD at the storage version (a write of the object
// as read, which the API server stores in the storage version), then leaves only the storage
// version in status.storedVersions, so that a later release may stop serving the others.
func (k *keeper) migrate(ctx context.Context, name string) error {
	o := k.w.o
	var crd apiextensionsv1.CustomResourceDefinition
	if err := o.Reader.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
		return err
	}
	version := ""
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			version = v.Name
		}
	}
	if slices.Equal(crd.Status.StoredVersions, []string{version}) {
		return nil
	}
	newList, ok := storage[name]
	if !ok {
		return fmt.Errorf("no list type for %s", name)
	}
	list := newList()
	if err := o.Reader.List(ctx, list); err != nil {
		return err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	for _, item := range items {
		obj, ok := item.(client.Object)
		if !ok {
			return fmt.Errorf("%T is not an object", item)
		}
		// An empty merge patch changes nothing but is stored anew, at the storage version.
		if err := o.Writer.Patch(ctx, obj, client.RawPatch("application/merge-patch+json", []byte("{}"))); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: %w", client.ObjectKeyFromObject(obj), err)
		}
	}
	crd.Status.StoredVersions = []string{version}
	if err := o.Writer.Status().Update(ctx, &crd); err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).WithName("conversion-webhook").Info("Stored objects rewritten at the storage version", "crd", name, "version", version, "objects", len(items))
	return nil
}
