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
	rc.Spec.TLS = &v1beta1.TLSSpec{CertificateSecretRef: v1beta1.LocalSecretReference{Name: "orders-cert"}}
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
