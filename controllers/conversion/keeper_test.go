package conversion

import (
	"context"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/certs"
)

type keeperHarness struct {
	clock *clocktesting.FakeClock
	c     client.Client
	w     *Webhook
	k     *keeper
}

func newKeeperHarness(t *testing.T) *keeperHarness {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for _, name := range CRDs {
		objs = append(objs, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	w := New(Options{
		Secret:       types.NamespacedName{Namespace: "keyroll-system", Name: "keyroll-webhook-certificate"},
		Service:      types.NamespacedName{Namespace: "keyroll-system", Name: "keyroll-webhook"},
		CertValidity: 30 * time.Minute, CAValidity: 3 * time.Hour, Reload: 10 * time.Second,
		Clock: clk, Reader: c, Writer: c,
	})
	return &keeperHarness{clock: clk, c: c, w: w, k: &keeper{w: w}}
}

// round runs the keeper once and returns the Secret's CAs and serving certificate.
func (h *keeperHarness) round(t *testing.T) ([]*x509.Certificate, *x509.Certificate) {
	t.Helper()
	if _, err := h.k.certificates(context.Background()); err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := h.c.Get(context.Background(), h.w.o.Secret, &s); err != nil {
		t.Fatal(err)
	}
	cas, err := certs.ParseBundle(s.Data[KeyCABundle])
	if err != nil {
		t.Fatal(err)
	}
	_, leaf, err := certs.ServingCertificate(s.Data[KeyCert], s.Data[KeyKey])
	if err != nil {
		t.Fatal(err)
	}
	if !certs.InBundle(leaf, cas) {
		t.Fatalf("at %s the serving certificate is signed by no CA of the bundle", h.clock.Now())
	}
	if err := leaf.VerifyHostname("keyroll-webhook.keyroll-system.svc"); err != nil {
		t.Fatal(err)
	}
	if h.clock.Now().After(leaf.NotAfter) {
		t.Fatalf("at %s the serving certificate expired (%s)", h.clock.Now(), leaf.NotAfter)
	}
	return cas, leaf
}

// TestCertificateIsReplacedBeforeExpiry: the serving certificate is replaced after two thirds of
// its life, the CA after two thirds of its, and a new CA signs only once it has been in the
// bundle for a while; an old CA stays in the bundle until it expires.
func TestCertificateIsReplacedBeforeExpiry(t *testing.T) {
	h := newKeeperHarness(t)
	cas, leaf := h.round(t)
	if len(cas) != 1 {
		t.Fatalf("%d CAs at first", len(cas))
	}
	first := leaf.SerialNumber

	h.clock.Step(19 * time.Minute)
	if _, l := h.round(t); l.SerialNumber.Cmp(first) != 0 {
		t.Fatal("the certificate was replaced before two thirds of its life")
	}
	h.clock.Step(2 * time.Minute) // 21 min of 30
	if _, l := h.round(t); l.SerialNumber.Cmp(first) == 0 {
		t.Fatal("the certificate was not replaced after two thirds of its life")
	}

	// Walk on, a minute at a time, through two replacements of the CA (each after 2 h of 3).
	newest, since, replaced := cas[0], h.clock.Now(), 0
	serials := map[string]bool{}
	for step := 0; step < 5*60; step++ {
		h.clock.Step(time.Minute)
		cas, leaf := h.round(t)
		serials[leaf.SerialNumber.String()] = true
		if !cas[0].Equal(newest) {
			newest, since, replaced = cas[0], h.clock.Now(), replaced+1
			if len(cas) != 2 {
				t.Fatalf("a new CA came with %d in the bundle, want the old one kept beside it", len(cas))
			}
			if leaf.CheckSignatureFrom(newest) == nil {
				t.Fatal("the new CA signed the serving certificate at once, before the API server could trust it")
			}
		}
		if h.clock.Now().Sub(since) > 5*time.Minute && leaf.CheckSignatureFrom(newest) != nil {
			t.Fatal("five minutes after a new CA, the serving certificate is still signed by the old one")
		}
	}
	if replaced != 2 {
		t.Fatalf("the CA was replaced %d times in five hours, want 2", replaced)
	}
	// One every 20 minutes, and one with each new CA.
	if n := len(serials); n < 15 || n > 19 {
		t.Fatalf("%d serving certificates in five hours, want 15 to 19", n)
	}
	cas, _ = h.round(t)
	for _, ca := range cas {
		if h.clock.Now().After(ca.NotAfter) {
			t.Fatalf("an expired CA is still in the bundle: %s", ca.NotAfter)
		}
	}
}

// TestCRDsPointAtTheWebhook: both CRDs convert through the webhook, with the Secret's bundle.
func TestCRDsPointAtTheWebhook(t *testing.T) {
	h := newKeeperHarness(t)
	bundle, err := h.k.certificates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range CRDs {
		if err := h.k.inject(context.Background(), name, bundle); err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := h.c.Get(context.Background(), client.ObjectKey{Name: name}, &crd); err != nil {
			t.Fatal(err)
		}
		cv := crd.Spec.Conversion
		if cv == nil || cv.Strategy != apiextensionsv1.WebhookConverter || cv.Webhook == nil || cv.Webhook.ClientConfig.Service == nil ||
			cv.Webhook.ClientConfig.Service.Name != "keyroll-webhook" || *cv.Webhook.ClientConfig.Service.Path != Path ||
			string(cv.Webhook.ClientConfig.CABundle) != string(bundle) {
			t.Fatalf("%s conversion: %+v", name, cv)
		}
	}
}

// certManagerSecret writes the Secret as a cert-manager Certificate of a CA issuer does: tls.crt
// and tls.key signed by the CA, ca.crt the CA.
func (h *keeperHarness) certManagerSecret(t *testing.T, ca *certs.Authority, hosts ...string) {
	t.Helper()
	certPEM, keyPEM, err := ca.Sign(h.clock.Now(), time.Hour, hosts)
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: h.w.o.Secret.Namespace, Name: h.w.o.Secret.Name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{KeyCert: certPEM, KeyKey: keyPEM, KeyCABundle: certs.JoinPEM([]*x509.Certificate{ca.Cert})}}
	var cur corev1.Secret
	if err := h.c.Get(context.Background(), h.w.o.Secret, &cur); err == nil {
		cur.Data = s.Data
		err = h.c.Update(context.Background(), &cur)
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := h.c.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// TestCertManagerKeepsTheCertificate: with CertManager, keyroll writes no Secret: it waits for
// cert-manager's, refuses one the API server would not accept (a certificate its ca.crt did not
// sign, or one for another name), serves what the Secret holds and puts its ca.crt in the CRDs,
// and follows it when cert-manager renews the certificate or replaces the CA.
func TestCertManagerKeepsTheCertificate(t *testing.T) {
	h := newKeeperHarness(t)
	h.w.o.CertManager = true
	ctx := context.Background()
	if err := h.k.trust(ctx); !errors.Is(err, errNoSecretYet) {
		t.Fatalf("no Secret yet: %v, want errNoSecretYet", err)
	}
	var s corev1.Secret
	if err := h.c.Get(ctx, h.w.o.Secret, &s); err == nil {
		t.Fatal("keyroll wrote the Secret that cert-manager keeps")
	}

	ca, _, err := certs.NewAuthority(h.clock.Now(), 24*time.Hour, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := certs.NewAuthority(h.clock.Now(), 24*time.Hour, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	h.certManagerSecret(t, ca, "keyroll-webhook.other-namespace.svc")
	if err := h.k.trust(ctx); err == nil || !strings.Contains(err.Error(), "keyroll-webhook.keyroll-system.svc") {
		t.Fatalf("a certificate for another name: %v; want refused, naming the name the API server checks", err)
	}
	h.certManagerSecret(t, other, "keyroll-webhook.keyroll-system.svc")
	if err := h.c.Get(ctx, h.w.o.Secret, &s); err != nil {
		t.Fatal(err)
	}
	s.Data[KeyCABundle] = certs.JoinPEM([]*x509.Certificate{ca.Cert})
	if err := h.c.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	if err := h.k.trust(ctx); err == nil || !strings.Contains(err.Error(), "not signed by a CA of ca.crt") {
		t.Fatalf("a certificate its ca.crt did not sign: %v; want refused", err)
	}

	crdBundle := func() string {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := h.c.Get(ctx, client.ObjectKey{Name: CRDs[0]}, &crd); err != nil {
			t.Fatal(err)
		}
		if crd.Spec.Conversion == nil || crd.Spec.Conversion.Webhook == nil {
			return ""
		}
		return string(crd.Spec.Conversion.Webhook.ClientConfig.CABundle)
	}
	for i, issuer := range []*certs.Authority{ca, ca, other} { // issued, renewed, a new CA
		h.clock.Step(time.Minute)
		h.certManagerSecret(t, issuer, "keyroll-webhook.keyroll-system.svc")
		if err := h.c.Get(ctx, h.w.o.Secret, &s); err != nil {
			t.Fatal(err)
		}
		written := s.ResourceVersion
		if err := h.k.trust(ctx); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if err := h.w.load(ctx); err != nil {
			t.Fatal(err)
		}
		if got := crdBundle(); got != string(s.Data[KeyCABundle]) {
			t.Fatalf("round %d: the CRD's CA bundle is not the Secret's ca.crt", i)
		}
		_, leaf, err := certs.ServingCertificate(s.Data[KeyCert], s.Data[KeyKey])
		if err != nil {
			t.Fatal(err)
		}
		if !h.w.Serving().Leaf.Equal(leaf) {
			t.Fatalf("round %d: the webhook does not serve the Secret's certificate", i)
		}
		if err := h.c.Get(ctx, h.w.o.Secret, &s); err != nil || s.ResourceVersion != written {
			t.Fatalf("round %d: keyroll wrote the Secret that cert-manager keeps (%v)", i, err)
		}
	}
}

// TestOLMMountsTheCertificate: with CertDir (Operator Lifecycle Manager's install), the webhook
// serves the files there and follows their renewal; it writes no Secret and leaves the CRDs'
// conversion settings to OLM, and still migrates.
func TestOLMMountsTheCertificate(t *testing.T) {
	h := newKeeperHarness(t)
	dir := t.TempDir()
	h.w.o.CertDir = dir
	ctx := context.Background()
	if err := h.w.load(ctx); !errors.Is(err, errNoSecretYet) {
		t.Fatalf("no files yet: %v, want errNoSecretYet", err)
	}
	ca, _, err := certs.NewAuthority(h.clock.Now(), 24*time.Hour, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 { // mounted, then renewed by OLM
		certPEM, keyPEM := mount(t, dir, ca, h.clock.Now())
		if err := h.k.keep(ctx); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		_, leaf, err := certs.ServingCertificate(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		if s := h.w.Serving(); s == nil || !s.Leaf.Equal(leaf) {
			t.Fatalf("round %d: the webhook does not serve the mounted certificate", round)
		}
		h.k.migrated = false
	}
	var s corev1.Secret
	if err := h.c.Get(ctx, h.w.o.Secret, &s); err == nil {
		t.Fatal("keyroll wrote a certificate Secret under OLM")
	}
	for _, name := range CRDs {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := h.c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			t.Fatal(err)
		}
		if crd.Spec.Conversion != nil {
			t.Fatalf("%s: keyroll set the conversion OLM keeps: %+v", name, crd.Spec.Conversion)
		}
	}
}

// TestStartWaitsForTheMountedCertificate: a manager started before OLM mounted the certificate
// (or before cert-manager wrote its Secret) waits for it, and gives up with the reason after
// CertManagerWait.
func TestStartWaitsForTheMountedCertificate(t *testing.T) {
	h := newKeeperHarness(t)
	dir := t.TempDir()
	h.w.o.CertDir, h.w.o.CertManagerWait = dir, 10*time.Second
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- h.w.ready(ctx, h.k) }()
	for !h.clock.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	ca, _, err := certs.NewAuthority(h.clock.Now(), time.Hour, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	mount(t, dir, ca, h.clock.Now())
	h.clock.Step(2 * time.Second)
	if err := <-done; err != nil || h.w.Serving() == nil {
		t.Fatalf("after the files came: %v, serving %v", err, h.w.Serving())
	}

	empty := newKeeperHarness(t)
	empty.w.o.CertDir, empty.w.o.CertManagerWait = t.TempDir(), 5*time.Second
	go func() { done <- empty.w.ready(ctx, empty.k) }()
	for range 3 {
		for !empty.clock.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		empty.clock.Step(2 * time.Second)
	}
	if err := <-done; !errors.Is(err, errNoSecretYet) {
		t.Fatalf("no files after the wait: %v, want errNoSecretYet", err)
	}
}

// mount writes a serving certificate of ca and its key into dir, as OLM mounts them, and returns
// both.
func mount(t *testing.T, dir string, ca *certs.Authority, now time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := ca.Sign(now, time.Hour, []string{"keyroll-manager-service.operators.svc"})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{KeyCert: certPEM, KeyKey: keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certPEM, keyPEM
}
