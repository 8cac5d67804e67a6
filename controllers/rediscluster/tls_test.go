package rediscluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/test/testground"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

func withTLS(rc *v1beta1.RedisCluster) {
	rc.Spec.TLS = &v1beta1.TLSSpec{CertificateSecretRef: &v1beta1.LocalSecretReference{Name: "orders-cert"}}
}

// ownersSecret is the owner's certificate Secret for the test cluster, labelled for it.
func ownersSecret(t *testing.T, ca *testground.TestCA, rc *v1beta1.RedisCluster) (*corev1.Secret, *big.Int) {
	t.Helper()
	cert, key, sn, err := ca.IssueServer(render.TLSNodeNames(rc))
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: rc.Namespace, Name: "orders-cert", Labels: map[string]string{v1beta1.LabelTLSCertificate: rc.Name}},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{render.TLSCertKey: cert, render.TLSKeyKey: key, render.CAKey: ca.PEM},
	}, sn
}

func serialOf(t *testing.T, certPEM []byte) *big.Int {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber
}

// A TLS cluster gets no credential and no copy of a certificate until the owner's Secret is there,
// labelled for it and able to serve it; each problem is a TLSReady condition and a Warning that
// name the field and what is wrong. Then keyroll copies it into <name>-tls and the consumers'
// Secret carries its CA.
func TestTLSClusterWaitsForAUsableCertificate(t *testing.T) {
	rc := cluster(withTLS)
	ca, err := testground.NewTestCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, rc)
	h.clock.SetTime(time.Now()) // the certificates are valid from an hour ago
	good, _ := ownersSecret(t, ca, rc)
	tlsCopy := client.ObjectKey{Namespace: "shop", Name: render.TLSSecretName(rc)}
	step := func(want string) {
		t.Helper()
		h.reconcile(t)
		got := h.get(t)
		c := condition(got, v1beta1.ConditionTLSReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1beta1.ReasonInvalidCertificate || !strings.Contains(c.Message, want) || !strings.Contains(c.Message, "spec.tls.certificateSecretRef") {
			t.Fatalf("TLSReady %+v, want False naming the field and %q", c, want)
		}
		if n := h.vault.Calls(vaulttest.OpIssue); n != 0 || got.Status.Credential != nil {
			t.Fatalf("%d issues before the cluster has a certificate", n)
		}
		if err := h.k8s.Get(context.Background(), tlsCopy, &corev1.Secret{}); err == nil {
			t.Fatal("a copy of an unusable certificate was written")
		}
	}
	step("is not in namespace shop")
	unlabelled := good.DeepCopy()
	unlabelled.Labels = nil
	if err := h.k8s.Create(context.Background(), unlabelled); err != nil {
		t.Fatal(err)
	}
	step("is not labelled keyroll.dev/tls-certificate=orders")
	other, err := testground.NewTestCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	bad := good.DeepCopy()
	bad.Data[render.CAKey] = other.PEM
	bad.ResourceVersion = unlabelled.ResourceVersion
	if err := h.k8s.Update(context.Background(), bad); err != nil {
		t.Fatal(err)
	}
	step("unknown authority")
	if reasons := strings.Join(h.eventReasons(), " "); strings.Count(reasons, v1beta1.ReasonInvalidCertificate) != 1 {
		t.Errorf("events %s: want one InvalidCertificate Warning for the False transition", reasons)
	}

	good.ResourceVersion = bad.ResourceVersion
	if err := h.k8s.Update(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	h.servedBy(t, serialOf(t, good.Data[render.TLSCertKey]))
	rc = h.settle(t)
	copied := &corev1.Secret{}
	if err := h.k8s.Get(context.Background(), tlsCopy, copied); err != nil {
		t.Fatalf("no copy of the certificate: %v", err)
	}
	for _, k := range []string{render.TLSCertKey, render.TLSKeyKey, render.CAKey} {
		if string(copied.Data[k]) != string(good.Data[k]) {
			t.Errorf("the copy's %s differs from the owner's", k)
		}
	}
	creds := &corev1.Secret{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-credentials"}, creds); err != nil {
		t.Fatal(err)
	}
	if string(creds.Data[render.CAKey]) != string(ca.PEM) {
		t.Errorf("the consumers' Secret carries no ca.crt")
	}
	if c := condition(rc, v1beta1.ConditionTLSReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("TLSReady %+v once every node serves the certificate", c)
	}
}

// servedBy makes the fake nodes serve the certificate of serial sn to new connections once they
// have been told to read their files, and the first one before that.
func (h *harness) servedBy(t *testing.T, sn *big.Int, before ...*big.Int) {
	h.r.servedCertificate = func(_ context.Context, addr string, _ *tls.Config) (*x509.Certificate, error) {
		if len(before) > 0 && h.redis.Reloads(addr) == 0 {
			return &x509.Certificate{SerialNumber: before[0]}, nil
		}
		return &x509.Certificate{SerialNumber: sn}, nil
	}
}

// A renewed certificate in the owner's Secret is copied, and every running node that serves the
// old one is told to read its files again (no restart), once; TLSReady names the new serial. A
// node whose kubelet has not put the new files in yet is asked again: TLSReady says
// CertificatePending meanwhile.
func TestRenewedCertificateIsLoadedByEveryNode(t *testing.T) {
	rc := cluster(withTLS, func(rc *v1beta1.RedisCluster) { rc.Spec.Replicas = 2 })
	ca, err := testground.NewTestCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	sec, first := ownersSecret(t, ca, rc)
	h := newHarness(t, rc, sec)
	h.clock.SetTime(time.Now()) // the certificates are valid from an hour ago
	h.servedBy(t, first)
	h.settle(t)
	renewed, second := ownersSecret(t, ca, rc)
	renewed.ResourceVersion = sec.ResourceVersion
	if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(sec), sec); err != nil {
		t.Fatal(err)
	}
	renewed.ResourceVersion = sec.ResourceVersion
	if err := h.k8s.Update(context.Background(), renewed); err != nil {
		t.Fatal(err)
	}

	// The kubelet has not put the new files in pod 1 yet: it serves the old one even after a reload.
	h.r.servedCertificate = func(_ context.Context, addr string, _ *tls.Config) (*x509.Certificate, error) {
		if addr == nodeAddr(1) || h.redis.Reloads(addr) == 0 {
			return &x509.Certificate{SerialNumber: first}, nil
		}
		return &x509.Certificate{SerialNumber: second}, nil
	}
	res := h.reconcile(t)
	c := condition(h.get(t), v1beta1.ConditionTLSReady)
	if c == nil || c.Reason != v1beta1.ReasonCertificatePending || !strings.Contains(c.Message, "orders-1") || strings.Contains(c.Message, "orders-0") {
		t.Fatalf("TLSReady %+v: want CertificatePending naming orders-1 only", c)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > servedWait {
		t.Errorf("requeue after %s, want within %s to ask again", res.RequeueAfter, servedWait)
	}
	// Now its files are new: the next reload (not the one before) has it serve the new certificate.
	h.r.servedCertificate = func(_ context.Context, addr string, _ *tls.Config) (*x509.Certificate, error) {
		if n := h.redis.Reloads(addr); n == 0 || (addr == nodeAddr(1) && n < 2) {
			return &x509.Certificate{SerialNumber: first}, nil
		}
		return &x509.Certificate{SerialNumber: second}, nil
	}
	rc = h.settle(t)
	if c := condition(rc, v1beta1.ConditionTLSReady); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, second.Text(16)) {
		t.Errorf("TLSReady %+v: want True naming %x", c, second)
	}
	if a, b := h.redis.Reloads(nodeAddr(0)), h.redis.Reloads(nodeAddr(1)); a != 1 || b != 2 {
		t.Errorf("reloads: orders-0 %d (want 1), orders-1 %d (want 2: one before its files were new, one after)", a, b)
	}
	h.reconcile(t)
	if a := h.redis.Reloads(nodeAddr(0)); a != 1 {
		t.Errorf("orders-0 was told to reload %d times; once it serves the certificate, never again", a)
	}
}

// servesTheCopy makes every fake node serve the certificate of keyroll's copy (<name>-tls) as it
// is in the API server: the kubelet and a reload brought it there.
func (h *harness) servesTheCopy(t *testing.T, rc *v1beta1.RedisCluster) {
	h.r.servedCertificate = func(ctx context.Context, _ string, _ *tls.Config) (*x509.Certificate, error) {
		sec := &corev1.Secret{}
		if err := h.k8s.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: render.TLSSecretName(rc)}, sec); err != nil {
			return nil, err
		}
		b, _ := pem.Decode(sec.Data[render.TLSCertKey])
		return x509.ParseCertificate(b.Bytes)
	}
}

// tlsState reads the cluster's own CA bundle and keyroll's copy of the nodes' certificate.
func tlsState(t *testing.T, h *harness, rc *v1beta1.RedisCluster) (cas []*x509.Certificate, leaf *x509.Certificate, copied *corev1.Secret) {
	t.Helper()
	caSec, copied := &corev1.Secret{}, &corev1.Secret{}
	for name, s := range map[string]*corev1.Secret{render.TLSCASecretName(rc): caSec, render.TLSSecretName(rc): copied} {
		if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: name}, s); err != nil {
			t.Fatalf("Secret %s: %v", name, err)
		}
	}
	if string(copied.Data[render.CAKey]) != string(caSec.Data[render.CAKey]) || len(copied.Data[render.TLSCAKeyKey]) > 0 {
		t.Fatalf("the pods' Secret holds another bundle than the CA's, or the CA's key")
	}
	rest := caSec.Data[render.CAKey]
	for {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		cas = append(cas, c)
	}
	leaf, err := render.CheckCertificate(rc, copied.Data[render.TLSCertKey], copied.Data[render.TLSKeyKey], copied.Data[render.CAKey], h.clock.Now())
	if err != nil {
		t.Fatalf("keyroll's certificate cannot serve the cluster: %v", err)
	}
	return cas, leaf, copied
}

// Without a certificate of the owner's, keyroll makes the cluster a CA (kept where no pod mounts
// its key) and the nodes' certificate, and the consumers' Secret carries the CA. The certificate
// is replaced at two thirds of its life; the CA at two thirds of its own, and the new CA signs
// only a week later: until then the nodes keep a certificate of the old CA, which stays in the
// bundle, so a client never meets a certificate of a CA it has not had a week to take in.
func TestOwnCertificateIsRenewedAndItsCAReplacedWithoutAGap(t *testing.T) {
	rc := cluster(func(rc *v1beta1.RedisCluster) { rc.Spec.TLS = &v1beta1.TLSSpec{} })
	h := newHarness(t, rc)
	h.servesTheCopy(t, rc)
	h.settle(t)
	cas, leaf, _ := tlsState(t, h, rc)
	if len(cas) != 1 || leaf.CheckSignatureFrom(cas[0]) != nil {
		t.Fatalf("%d CAs; the certificate signed by the first: %v", len(cas), leaf.CheckSignatureFrom(cas[0]))
	}
	creds := &corev1.Secret{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-credentials"}, creds); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(creds.Data[render.CAKey]), "BEGIN CERTIFICATE") {
		t.Error("the consumers' Secret carries no ca.crt")
	}
	if reasons := strings.Join(h.eventReasons(), " "); strings.Count(reasons, v1beta1.ReasonCertificateIssued) != 2 {
		t.Errorf("events %s: want CertificateIssued for the CA and for the certificate", reasons)
	}

	h.clock.Step(61 * 24 * time.Hour) // past two thirds of the certificate's 90 days
	h.settle(t)
	cas2, leaf2, _ := tlsState(t, h, rc)
	if leaf2.SerialNumber.Cmp(leaf.SerialNumber) == 0 || len(cas2) != 1 || !cas2[0].Equal(cas[0]) {
		t.Fatalf("after 61 days: certificate %x (was %x), %d CAs: want a new certificate of the same CA", leaf2.SerialNumber, leaf.SerialNumber, len(cas2))
	}
	if c := condition(h.get(t), v1beta1.ConditionTLSReady); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, leaf2.SerialNumber.Text(16)) {
		t.Errorf("TLSReady %+v: want True naming %x", c, leaf2.SerialNumber)
	}

	for range 3 { // a certificate every 61 days, as keyroll's hourly look replaces each: day 244
		h.clock.Step(61 * 24 * time.Hour)
		h.settle(t)
	} // past two thirds of the CA's year
	cas3, leaf3, _ := tlsState(t, h, rc)
	if len(cas3) != 2 || !cas3[1].Equal(cas[0]) {
		t.Fatalf("after 244 days: %d CAs, want a new one first and the old one kept", len(cas3))
	}
	if leaf3.CheckSignatureFrom(cas[0]) != nil {
		t.Fatalf("a certificate of the new CA is served the day it was made")
	}
	h.clock.Step(8 * 24 * time.Hour)
	h.settle(t)
	cas4, leaf4, _ := tlsState(t, h, rc)
	if leaf4.CheckSignatureFrom(cas4[0]) != nil || len(cas4) != 2 {
		t.Fatalf("a week after the new CA: the certificate is not of it (%d CAs)", len(cas4))
	}
	h.clock.Step(114 * 24 * time.Hour) // day 366: past the old CA's end
	h.settle(t)
	if cas5, _, _ := tlsState(t, h, rc); len(cas5) != 1 || !cas5[0].Equal(cas4[0]) {
		t.Errorf("after the old CA's end: %d CAs, want the new one alone", len(cas5))
	}
}

// A TLS cluster whose CA keyroll has not read (after a restart, or with an unusable copy) is
// dialled with TLS that trusts nothing, never in clear: a login would cross the network first.
func TestTLSClusterIsNeverDialledInClear(t *testing.T) {
	var n nodeTLS
	if c := n.For(cluster()); c != nil {
		t.Errorf("a cluster without TLS gets %+v", c)
	}
	c := n.For(cluster(withTLS))
	if c == nil || c.RootCAs == nil || !c.RootCAs.Equal(x509.NewCertPool()) {
		t.Fatalf("a TLS cluster whose CA is not known gets %+v; want TLS with an empty pool", c)
	}
	n.set(client.ObjectKeyFromObject(cluster(withTLS)), nil)
	if c := n.For(cluster(withTLS)); c == nil {
		t.Fatal("a TLS cluster whose copy holds no usable CA is dialled in clear")
	}
}

// An owner's certificate that stops being usable after a good one: TLSReady turns False
// (InvalidCertificate) and stays so over later reconciles, with one Warning, while the nodes keep
// serving the last good copy; it does not turn True again because the nodes serve that copy. Once
// the Secret is good again, TLSReady is True.
func TestUnusableOwnersCertificateStaysReported(t *testing.T) {
	rc := cluster(withTLS)
	ca, err := testground.NewTestCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	sec, first := ownersSecret(t, ca, rc)
	h := newHarness(t, rc, sec)
	h.clock.SetTime(time.Now())
	h.servedBy(t, first)
	h.settle(t)
	h.eventReasons()
	other, err := testground.NewTestCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(sec), sec); err != nil {
		t.Fatal(err)
	}
	good := sec.DeepCopy()
	sec.Data[render.CAKey] = other.PEM
	if err := h.k8s.Update(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		h.reconcile(t)
		if c := condition(h.get(t), v1beta1.ConditionTLSReady); c == nil || c.Reason != v1beta1.ReasonInvalidCertificate {
			t.Fatalf("TLSReady %+v while the owner's certificate is unusable", c)
		}
	}
	if got := strings.Join(h.eventReasons(), " "); strings.Count(got, v1beta1.ReasonInvalidCertificate) != 1 || strings.Contains(got, v1beta1.ReasonCertificateServed) {
		t.Errorf("events %q: want one InvalidCertificate and no CertificateServed", got)
	}
	copied := &corev1.Secret{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: render.TLSSecretName(rc)}, copied); err != nil || string(copied.Data[render.CAKey]) != string(ca.PEM) {
		t.Fatalf("the pods' copy changed to an unusable certificate (%v)", err)
	}
	if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(sec), sec); err != nil {
		t.Fatal(err)
	}
	sec.Data = good.Data
	if err := h.k8s.Update(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	if c := condition(h.settle(t), v1beta1.ConditionTLSReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("TLSReady %+v once the owner's Secret is good again", c)
	}
}
