package apiversions

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/conversion"
	"github.com/keyroll/keyroll/test/framework"
)

// TestWebhookCertificateRotates: with a serving certificate valid 30 s and a CA valid 90 s, the
// webhook replaces both several times in two and a half minutes while v1alpha1 reads (each a
// conversion by the webhook) go on without pause; none fails, and what the webhook serves on the
// wire changes with the Secret.
func TestWebhookCertificateRotates(t *testing.T) {
	ctx, dyn, ns := onCurrentCRDs(t, "rotate")
	// A certificate from an earlier test's manager would be reused: start from none.
	_ = fw.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: fw.OperatorNS, Name: "keyroll-webhook-certificate"}})

	if err := fw.StartOperator(framework.OperatorOptions{Conversion: &conversion.Options{
		CertValidity: 30 * time.Second, CAValidity: 90 * time.Second, Reload: time.Second,
	}}); err != nil {
		t.Fatal(err)
	}
	defer fw.StopOperator()
	op := fw.Operator()
	rc := previousSample(t, "rediscluster-vaultlease.yaml", "orders", ns)
	rc.SetAPIVersion(v1beta1.GroupVersion.String())
	if _, err := dyn.Resource(betaClusters).Namespace(ns).Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, func() string {
		if _, err := dyn.Resource(alphaClusters).Namespace(ns).Get(ctx, "orders", metav1.GetOptions{}); err != nil {
			return "first conversion: " + err.Error()
		}
		return ""
	})

	// Convert without pause while the certificates turn over.
	stopReads := convertWithoutPause(dyn, ns, "orders")

	u, err := url.Parse(webhookURL(t))
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	var bundles [][]byte
	deadline := time.Now().Add(150 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := tls.Dial("tcp", u.Host, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reads the certificate served
		if err == nil {
			served[conn.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)] = true
			_ = conn.Close()
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := fw.Client.Get(ctx, client.ObjectKey{Name: conversion.CRDs[0]}, &crd); err == nil && crd.Spec.Conversion != nil && crd.Spec.Conversion.Webhook != nil {
			b := crd.Spec.Conversion.Webhook.ClientConfig.CABundle
			if len(bundles) == 0 || !bytes.Equal(bundles[len(bundles)-1], b) {
				bundles = append(bundles, b)
			}
		}
		time.Sleep(time.Second)
	}
	reads, failures, first := stopReads()
	t.Logf("%d v1alpha1 reads through the webhook, %d failed; %d serving certificates seen on the wire; the CA bundle changed %d times",
		reads, failures, len(served), len(bundles)-1)
	if failures != 0 {
		t.Fatalf("%d of %d conversions failed while the certificates turned over; first: %v", failures, reads, first)
	}
	// One every 20 s (two thirds of 30 s), and one more with each CA, which is replaced every 60 s.
	if len(served) < 6 || len(served) > 14 {
		t.Fatalf("%d serving certificates in 150 s, want one about every 20 s, and one with each new CA", len(served))
	}
	if len(bundles) < 2 {
		t.Fatal("the CA was never replaced in 150 s (valid 90 s)")
	}
	if op.Conversion.Serving() == nil {
		t.Fatal("the webhook serves no certificate")
	}
}

// convertWithoutPause reads the RedisCluster as v1alpha1 (a conversion by the webhook) every 50 ms
// until stop, which says how many reads there were, how many failed, and the first failure.
func convertWithoutPause(dyn dynamic.Interface, ns, name string) (stop func() (reads, failures int64, first any)) {
	var n, failed atomic.Int64
	var firstFailure atomic.Value
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			n.Add(1)
			if _, err := dyn.Resource(alphaClusters).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
				failed.Add(1)
				firstFailure.CompareAndSwap(nil, err.Error())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() (int64, int64, any) {
		close(done)
		wg.Wait()
		return n.Load(), failed.Load(), firstFailure.Load()
	}
}

// webhookURL is where the CRDs send conversion reviews.
func webhookURL(t *testing.T) string {
	t.Helper()
	var crd apiextensionsv1.CustomResourceDefinition
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Name: conversion.CRDs[0]}, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Spec.Conversion == nil || crd.Spec.Conversion.Webhook == nil || crd.Spec.Conversion.Webhook.ClientConfig.URL == nil {
		t.Fatal("the CRD does not send conversions to a URL")
	}
	return *crd.Spec.Conversion.Webhook.ClientConfig.URL
}

// testIssuer is a CA as a cert-manager CA issuer holds one.
type testIssuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestIssuer(t *testing.T) *testIssuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "test issuer"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testIssuer{cert: cert, key: key}
}

// secretData is what cert-manager writes for a Certificate of this issuer for ip: tls.crt, tls.key
// (a new key each time, rotationPolicy Always) and ca.crt; and the certificate's serial.
func (i *testIssuer) secretData(t *testing.T, ip string) (map[string][]byte, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial := big.NewInt(time.Now().UnixNano())
	tmpl := &x509.Certificate{SerialNumber: serial, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP(ip)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, i.cert, &key.PublicKey, i.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: i.cert.Raw}),
	}, serial.Text(16)
}

// TestCertManagerKeepsTheWebhookCertificate: with --webhook-certificate=cert-manager the manager
// starts on a Secret that cert-manager wrote (here written as cert-manager writes it: the test
// ground has no cert-manager), puts its ca.crt in the CRDs, and serves a renewed certificate
// within a few seconds of its renewal, without a failed conversion; it never writes the Secret.
func TestCertManagerKeepsTheWebhookCertificate(t *testing.T) {
	ctx, dyn, ns := onCurrentCRDs(t, "cert-manager")
	key := client.ObjectKey{Namespace: fw.OperatorNS, Name: "keyroll-webhook-certificate"}
	_ = fw.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
	issuer := newTestIssuer(t)
	data, first := issuer.secretData(t, "127.0.0.1")
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Type: corev1.SecretTypeTLS, Data: data}
	if err := fw.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Client.Delete(context.Background(), secret) }) // the next manager makes its own
	if err := fw.StartOperator(framework.OperatorOptions{Conversion: &conversion.Options{CertManager: true, Reload: time.Second}}); err != nil {
		t.Fatal(err)
	}
	defer fw.StopOperator()
	rc := previousSample(t, "rediscluster-vaultlease.yaml", "orders", ns)
	rc.SetAPIVersion(v1beta1.GroupVersion.String())
	if _, err := dyn.Resource(betaClusters).Namespace(ns).Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := fw.Client.Get(ctx, client.ObjectKey{Name: conversion.CRDs[0]}, &crd); err != nil {
		t.Fatal(err)
	}
	if b := crd.Spec.Conversion.Webhook.ClientConfig.CABundle; !bytes.Equal(b, data["ca.crt"]) {
		t.Fatalf("the CRD's CA bundle is not the Secret's ca.crt:\n%s", b)
	}
	u, err := url.Parse(webhookURL(t))
	if err != nil {
		t.Fatal(err)
	}
	servedSerial := func() string {
		conn, err := tls.Dial("tcp", u.Host, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reads the certificate served
		if err != nil {
			return err.Error()
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)
	}
	if got := servedSerial(); got != first {
		t.Fatalf("the webhook serves %s, want the Secret's certificate %s", got, first)
	}

	stopReads := convertWithoutPause(dyn, ns, "orders")
	time.Sleep(3 * time.Second)
	renewed, serial := issuer.secretData(t, "127.0.0.1") // cert-manager renews: a new key, the same CA
	if err := fw.Client.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	secret.Data = renewed
	if err := fw.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	written := secret.ResourceVersion
	renewedAt := time.Now()
	framework.Eventually(t, 30*time.Second, func() string {
		if got := servedSerial(); got != serial {
			return "the webhook serves " + got + ", not the renewed " + serial
		}
		return ""
	})
	t.Logf("the renewed certificate served %s after cert-manager's write", time.Since(renewedAt).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	reads, failures, firstFailure := stopReads()
	t.Logf("%d v1alpha1 reads through the webhook across the renewal, %d failed", reads, failures)
	if failures != 0 {
		t.Fatalf("%d of %d conversions failed across the renewal; first: %v", failures, reads, firstFailure)
	}
	if err := fw.Client.Get(ctx, key, secret); err != nil || secret.ResourceVersion != written {
		t.Fatalf("keyroll wrote the Secret that cert-manager keeps (%v)", err)
	}
}
