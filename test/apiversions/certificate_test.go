package apiversions

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	ctx := context.Background()
	dyn := dynamicClient(t)
	ns := fw.Name("rotate")
	ensureNamespace(t, ns)
	ensureNamespace(t, fw.OperatorNS)
	installCRDs(t, currentCRDs(), false)
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
	var reads, failures atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			reads.Add(1)
			if _, err := dyn.Resource(alphaClusters).Namespace(ns).Get(ctx, "orders", metav1.GetOptions{}); err != nil {
				failures.Add(1)
				firstFailure.CompareAndSwap(nil, err.Error())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

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
	close(stop)
	wg.Wait()
	t.Logf("%d v1alpha1 reads through the webhook, %d failed; %d serving certificates seen on the wire; the CA bundle changed %d times",
		reads.Load(), failures.Load(), len(served), len(bundles)-1)
	if failures.Load() != 0 {
		t.Fatalf("%d of %d conversions failed while the certificates turned over; first: %v", failures.Load(), reads.Load(), firstFailure.Load())
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
