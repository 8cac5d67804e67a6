package rediscluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/certs"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/controllers/render"
)

// The TLS phase (spec.tls): the owner's certificate is checked and copied into <name>-tls, which
// the Redis pods mount; keyroll's own connections to the nodes check their certificate against
// its CA; a renewed certificate is loaded by every running node (CONFIG SET of the same files,
// which the kubelet has replaced) without a restart.

// certificateWait is how often a TLS cluster whose certificate cannot be used yet is looked at
// again (the owner's Secret is not watched: keyroll's cache holds its own Secrets only).
const certificateWait = 30 * time.Second

// ownersCheck is how often a cluster with the owner's certificate is looked at, at most, to find
// a renewed one: keyroll does not watch the owner's Secret (its cache holds its own Secrets only),
// so each look is one read of it.
const ownersCheck = time.Minute

// ownCheck is how often, at most, a cluster with a certificate of keyroll's is looked at for one
// that is due: a certificate is replaced within that of two thirds of its life.
const ownCheck = time.Hour

// servedWait is how often a node is asked again for the certificate it serves while the kubelet
// has not yet put the new files in its pod.
const servedWait = 10 * time.Second

// servedCertificate is the certificate a node serves to a new connection (redisnode.ServedCertificate).
type servedCertificate func(ctx context.Context, addr string, conf *tls.Config) (*x509.Certificate, error)

// nodeTLS keeps, for each TLS cluster, how keyroll checks its nodes' certificates, from the CA in
// the cluster's <name>-tls Secret as last read.
type nodeTLS struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*tls.Config
}

// For is the TLS configuration of connections to rc's nodes: nil for a cluster without TLS; for a
// TLS cluster whose CA keyroll has not read yet, one that trusts no certificate, so that no
// connection to it is ever made in clear.
func (t *nodeTLS) For(rc *v1beta1.RedisCluster) *tls.Config {
	if !render.TLSEnabled(rc) {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.m[client.ObjectKeyFromObject(rc)]; c != nil {
		return c
	}
	// An empty pool: every handshake fails before a byte of a login is sent (a nil configuration
	// would have the client log in in clear).
	return &tls.Config{RootCAs: x509.NewCertPool(), ServerName: render.TLSServerName(rc), MinVersion: tls.VersionTLS12}
}

// Forget drops what is kept of a deleted cluster.
func (t *nodeTLS) Forget(key types.NamespacedName) { t.set(key, nil) }

func (t *nodeTLS) set(key types.NamespacedName, c *tls.Config) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[types.NamespacedName]*tls.Config{}
	}
	if c == nil {
		delete(t.m, key)
		return
	}
	t.m[key] = c
}

// reconcileTLS keeps the cluster's certificate in <name>-tls (keyroll's own, or a checked copy of
// the owner's) and puts its CA bundle in in.ca. It returns false while the cluster has no usable
// certificate at all (its pods could not start), with when to look again. An owner's certificate
// that stops being usable leaves the copy as it was (in.tlsProblem): the nodes serve the last good
// one, and TLSReady says what is wrong.
func (r *deps) reconcileTLS(ctx context.Context, s *credential.Cluster, in *internal) (ok bool, wait time.Duration, err error) {
	rc := s.RC
	key := client.ObjectKeyFromObject(rc)
	if !render.TLSEnabled(rc) {
		r.tls.set(key, nil)
		return true, 0, nil
	}
	copied, err := r.ownedSecret(ctx, rc, render.TLSSecretName(rc))
	if err != nil {
		return false, 0, err
	}
	desired, problem := copied, ""
	if render.OwnCertificate(rc) {
		desired, err = r.ownCertificate(ctx, s, copied)
	} else {
		desired, problem, err = r.ownersCertificate(ctx, rc)
	}
	if err != nil {
		return false, 0, err
	}
	if in.tlsProblem = problem != ""; in.tlsProblem {
		if s.Conds.Set(v1beta1.ConditionTLSReady, metav1.ConditionFalse, v1beta1.ReasonInvalidCertificate, problem) {
			s.Conds.Announce(true, v1beta1.ReasonInvalidCertificate, "CheckCertificate", "%s", problem)
		}
		if copied.Name == "" {
			return false, certificateWait, nil
		}
		desired = copied
	} else if err := apply.Owned(ctx, r.Client, r.APIReader, rc, desired); err != nil {
		return false, 0, err
	}
	in.ca = desired.Data[render.CAKey]
	_, in.tlsLeaf, _ = certs.ServingCertificate(desired.Data[render.TLSCertKey], desired.Data[render.TLSKeyKey])
	r.tls.set(key, render.NodeClientTLS(rc, desired.Data))
	return true, 0, nil
}

// ownPolicy is how keyroll keeps a cluster's own CA and certificate: a CA of a year, replaced at
// two thirds of it, which signs only after a week in the bundle (the consumers' Secret carries it:
// a client that reads ca.crt only at its start takes it in at its next restart, which a rotation
// brings), and certificates of 90 days, replaced at 60.
func ownPolicy(rc *v1beta1.RedisCluster) certs.Policy {
	return certs.Policy{CAName: fmt.Sprintf("keyroll Redis CA of %s/%s", rc.Namespace, rc.Name),
		CAValidity: 365 * 24 * time.Hour, CertValidity: 90 * 24 * time.Hour, Settle: 7 * 24 * time.Hour, Margin: 24 * time.Hour}
}

// ownCertificate keeps the cluster's own CA (<name>-tls-ca) and the nodes' certificate it signs,
// and returns the Secret for the pods (<name>-tls), which the caller writes after the CA's. A new
// CA or certificate is announced in an event (serials and dates only).
func (r *deps) ownCertificate(ctx context.Context, s *credential.Cluster, copied *corev1.Secret) (*corev1.Secret, error) {
	rc := s.RC
	caSec, err := r.ownedSecret(ctx, rc, render.TLSCASecretName(rc))
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{certs.KeyCABundle: caSec.Data[render.CAKey], certs.KeyCAKey: caSec.Data[render.TLSCAKeyKey],
		certs.KeyCert: copied.Data[render.TLSCertKey], certs.KeyKey: copied.Data[render.TLSKeyKey]}
	out, made, err := certs.Keep(r.Clock.Now(), data, render.TLSNodeNames(rc), ownPolicy(rc))
	if err != nil {
		return nil, fmt.Errorf("keeping the cluster's CA and certificate: %w", err)
	}
	if err := apply.Owned(ctx, r.Client, r.APIReader, rc, render.TLSCASecret(rc, out[certs.KeyCABundle], out[certs.KeyCAKey])); err != nil {
		return nil, err
	}
	desired := render.TLSSecret(rc, out[certs.KeyCert], out[certs.KeyKey], out[certs.KeyCABundle])
	if made.CA {
		cas, _ := certs.ParseBundle(out[certs.KeyCABundle])
		s.Conds.Event(false, v1beta1.ReasonCertificateIssued, "IssueCertificate", "Made the cluster's CA %x, valid until %s (in ca.crt of the consumers' Secret from now on)", cas[0].SerialNumber, cas[0].NotAfter.UTC().Format(time.RFC3339))
	}
	if made.Certificate {
		_, leaf, _ := certs.ServingCertificate(out[certs.KeyCert], out[certs.KeyKey])
		s.Conds.Event(false, v1beta1.ReasonCertificateIssued, "IssueCertificate", "Made the nodes' certificate %x, valid until %s", leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return desired, nil
}

// ownersCertificate reads the Secret spec.tls.certificateSecretRef names and returns keyroll's
// copy of it, or what makes it unusable.
func (r *deps) ownersCertificate(ctx context.Context, rc *v1beta1.RedisCluster) (*corev1.Secret, string, error) {
	name := rc.Spec.TLS.CertificateSecretRef.Name
	sec := &corev1.Secret{} // not in the cache, which holds keyroll's Secrets only
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: name}, sec)
	if client.IgnoreNotFound(err) != nil {
		return nil, "", fmt.Errorf("reading Secret %s (spec.tls.certificateSecretRef): %w", name, err)
	}
	field := "spec.tls.certificateSecretRef: Secret " + name
	switch {
	case err != nil:
		return nil, fmt.Sprintf("%s is not in namespace %s", field, rc.Namespace), nil
	case sec.Labels[v1beta1.LabelTLSCertificate] != rc.Name:
		// Only a Secret labelled for this cluster: not any certificate of the namespace.
		return nil, fmt.Sprintf("%s is not labelled %s=%s; keyroll uses only a Secret labelled for this cluster", field, v1beta1.LabelTLSCertificate, rc.Name), nil
	}
	cert, key, ca := sec.Data[render.TLSCertKey], sec.Data[render.TLSKeyKey], sec.Data[render.CAKey]
	if _, err := render.CheckCertificate(rc, cert, key, ca, r.Clock.Now()); err != nil {
		return nil, field + ": " + err.Error(), nil
	}
	return render.TLSSecret(rc, cert, key, ca), "", nil
}

// certificateServed makes every running node of the cluster serve the certificate of <name>-tls
// (in.tlsLeaf, as reconcileTLS left it): a node that serves another one is told to read its files
// again (the kubelet may not have put the new ones in its pod yet: then it is asked again a little
// later). TLSReady says how far it is.
func (r *deps) certificateServed(ctx context.Context, s *credential.Cluster, in *internal) (time.Duration, error) {
	admin, rc, want := in.Admin, s.RC, in.tlsLeaf
	if want == nil {
		return 0, nil // no TLS, or a copy that holds no certificate
	}
	m, err := listMembers(ctx, r.Client, rc)
	if err != nil {
		return 0, err
	}
	conf := r.tls.For(rc)
	var pending []string
	for _, p := range m.Pods {
		run, ok := running(p)
		if !ok || !podIsReady(p) {
			continue
		}
		served, err := r.servedCertificate(ctx, run.addr, conf)
		if err == nil && served.SerialNumber.Cmp(want.SerialNumber) == 0 {
			continue
		}
		n := r.nodes.Dial(run.addr, render.AdminUser, admin, conf)
		err = n.ReloadCertificate(ctx, render.TLSReloadArgs())
		_ = n.Close()
		if err != nil {
			return 0, fmt.Errorf("reloading the certificate of %s: %w", p.Name, err)
		}
		if served, err = r.servedCertificate(ctx, run.addr, conf); err != nil || served.SerialNumber.Cmp(want.SerialNumber) != 0 {
			pending = append(pending, p.Name)
			continue
		}
		s.Conds.EventAbout(p, false, v1beta1.ReasonCertificateServed, "ReloadCertificate", "Pod %s serves certificate %x (until %s), without a restart", p.Name, want.SerialNumber, want.NotAfter.UTC().Format(time.RFC3339))
	}
	switch {
	case in.tlsProblem: // TLSReady says what is wrong with the owner's certificate
	case len(pending) > 0:
		s.Conds.Set(v1beta1.ConditionTLSReady, metav1.ConditionFalse, v1beta1.ReasonCertificatePending,
			fmt.Sprintf("certificate %x is written; pods %v do not serve it yet (the kubelet puts Secret changes in pods within a minute or two)", want.SerialNumber, pending))
	case s.Conds.Set(v1beta1.ConditionTLSReady, metav1.ConditionTrue, v1beta1.ReasonCertificateServed,
		fmt.Sprintf("every running node serves certificate %x, valid until %s", want.SerialNumber, want.NotAfter.UTC().Format(time.RFC3339))):
		s.Conds.Announce(false, v1beta1.ReasonCertificateServed, "ReloadCertificate", "Every running node serves certificate %x", want.SerialNumber)
	}
	if len(pending) > 0 {
		return servedWait, nil
	}
	if render.OwnCertificate(rc) {
		return ownCheck, nil
	}
	return ownersCheck, nil
}
