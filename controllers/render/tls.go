package render

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// TLS (spec.tls): the Redis nodes listen with TLS only, on RedisPort, with the certificate keyroll
// copies from the owner's Secret into TLSSecretName, which every Redis pod mounts.

// Keys of a TLS Secret, as cert-manager writes them: the owner's and keyroll's copy alike.
const (
	TLSCertKey = corev1.TLSCertKey       // tls.crt: the serving certificate, intermediates after it
	TLSKeyKey  = corev1.TLSPrivateKeyKey // tls.key
	CAKey      = "ca.crt"                // the CA that signed it; also in the credentials Secret
)

const tlsMountDir = "/etc/keyroll/tls"

// TLSSecretName is keyroll's copy of the cluster's certificate, which the Redis pods mount.
func TLSSecretName(rc *v1beta1.RedisCluster) string { return rc.Name + "-tls" }

// TLSEnabled says whether the cluster's Redis speaks TLS only.
func TLSEnabled(rc *v1beta1.RedisCluster) bool { return rc.Spec.TLS != nil }

// TLSServerName is the name keyroll, the probe sidecar and the start script verify every node's
// certificate against: the client Service's, which every node's certificate names (the nodes share
// one certificate).
func TLSServerName(rc *v1beta1.RedisCluster) string {
	return fmt.Sprintf("%s.%s.svc", rc.Name, rc.Namespace)
}

// TLSNodeNames are the DNS names a cluster's certificate must carry: the client Service's and each
// node's, under the headless Service.
func TLSNodeNames(rc *v1beta1.RedisCluster) []string {
	return []string{TLSServerName(rc), fmt.Sprintf("*.%s.%s.svc", HeadlessServiceName(rc), rc.Namespace)}
}

// TLSSecret is keyroll's copy of the owner's certificate, key and CA.
func TLSSecret(rc *v1beta1.RedisCluster, cert, key, ca []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: objectMeta(rc, TLSSecretName(rc)),
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{TLSCertKey: cert, TLSKeyKey: key, CAKey: ca},
	}
}

// tlsConfig is redis.conf's part for TLS: no plaintext port, the certificate files of the mounted
// Secret (the kubelet replaces them in place; keyroll tells Redis to read them again), replication
// over TLS, and no client certificate asked for (clients log in with their ACL user).
func tlsConfig(rc *v1beta1.RedisCluster) string {
	if !TLSEnabled(rc) {
		return fmt.Sprintf("port %d\n", RedisPort)
	}
	clientAuth := "no"
	if ClientAuthRequired(rc) {
		clientAuth = "yes"
	}
	return fmt.Sprintf(`port 0
tls-port %d
%s
tls-auth-clients %s
tls-replication yes
`, RedisPort, tlsFiles(), clientAuth)
}

// ClientAuthRequired says whether the cluster's Redis asks every client for a certificate.
func ClientAuthRequired(rc *v1beta1.RedisCluster) bool {
	return TLSEnabled(rc) && rc.Spec.TLS.ClientAuth == v1beta1.TLSClientAuthRequired
}

// tlsFiles are the certificate settings as redis.conf and CONFIG SET name them.
func tlsFiles() string {
	var lines []string
	for a := TLSReloadArgs(); len(a) >= 2; a = a[2:] {
		lines = append(lines, a[0]+" "+a[1])
	}
	return strings.Join(lines, "\n")
}

// TLSReloadArgs are the arguments of CONFIG SET that make a node read its certificate files again
// (the same paths: Redis reads the files whenever the setting is set).
func TLSReloadArgs() []string {
	return []string{
		"tls-cert-file", tlsMountDir + "/" + TLSCertKey,
		"tls-key-file", tlsMountDir + "/" + TLSKeyKey,
		"tls-ca-cert-file", tlsMountDir + "/" + CAKey,
	}
}

// redisCLITLS are redis-cli's options for the start script's peer queries: TLS, the peer's
// certificate checked against the cluster's CA, and the node's own shown when asked for one.
func redisCLITLS(rc *v1beta1.RedisCluster) string {
	if !TLSEnabled(rc) {
		return ""
	}
	return fmt.Sprintf(" --tls --cacert %[1]s/%[2]s --cert %[1]s/%[3]s --key %[1]s/%[4]s --sni %[5]s", tlsMountDir, CAKey, TLSCertKey, TLSKeyKey, TLSServerName(rc))
}

// tlsVolume and tlsMount put keyroll's copy of the certificate in a pod, readable by Redis's group.
func tlsVolume(rc *v1beta1.RedisCluster) corev1.Volume {
	return corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: TLSSecretName(rc), DefaultMode: ptr.To[int32](0o440)}}}
}

func tlsMount() corev1.VolumeMount {
	return corev1.VolumeMount{Name: "tls", MountPath: tlsMountDir, ReadOnly: true}
}

// probeTLSArgs are the probe sidecar's flags for a TLS cluster: the CA it checks the node with,
// and the node's certificate, which it shows when asked for one.
func probeTLSArgs(rc *v1beta1.RedisCluster) []string {
	return []string{"--tls-ca-file=" + tlsMountDir + "/" + CAKey, "--tls-server-name=" + TLSServerName(rc),
		"--tls-cert-file=" + tlsMountDir + "/" + TLSCertKey, "--tls-key-file=" + tlsMountDir + "/" + TLSKeyKey}
}

// CheckCertificate says whether cert (PEM, the leaf first), key and ca (PEM) can serve rc: the key
// is the certificate's, ca signed it (through the intermediates after the leaf), it is valid at
// now, and it names every one of TLSNodeNames. It returns the leaf. Its errors name the key of the
// Secret and what is wrong, never a byte of the key.
func CheckCertificate(rc *v1beta1.RedisCluster, cert, key, ca []byte, now time.Time) (*x509.Certificate, error) {
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("%s and %s are not a certificate and its private key: %s", TLSCertKey, TLSKeyKey, strings.TrimPrefix(err.Error(), "tls: "))
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", TLSCertKey, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s holds no PEM certificate", CAKey)
	}
	between := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%s: an intermediate certificate: %w", TLSCertKey, err)
		}
		between.AddCert(c)
	}
	for i, name := range TLSNodeNames(rc) {
		if i == 1 {
			name = strings.Replace(name, "*", rc.Name+"-0", 1) // a node's name, which the wildcard covers
		}
		_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, Intermediates: between, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			return nil, fmt.Errorf("%s (serial %x) cannot serve %s as %s: %w", TLSCertKey, leaf.SerialNumber, name, strings.Join(TLSNodeNames(rc), " and "), err)
		}
	}
	if ClientAuthRequired(rc) {
		// keyroll, the probes and the replicas show it as their client certificate.
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: between, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if err != nil {
			return nil, fmt.Errorf("%s (serial %x) cannot be the client certificate that clientAuth Required asks keyroll, the probes and the replicas for (usage client auth): %w", TLSCertKey, leaf.SerialNumber, err)
		}
	}
	return leaf, nil
}

// NodeClientTLS is how keyroll connects to the nodes of rc with the data of a TLS Secret of the
// cluster's (TLSSecret): their certificate checked against its CA, and its certificate shown when
// the node asks for one (clientAuth Required). Nil when the CA holds no certificate.
func NodeClientTLS(rc *v1beta1.RedisCluster, data map[string][]byte) *tls.Config {
	c := ClientTLS(rc, data[CAKey])
	if c == nil {
		return nil
	}
	if pair, err := tls.X509KeyPair(data[TLSCertKey], data[TLSKeyKey]); err == nil {
		c.Certificates = []tls.Certificate{pair}
	}
	return c
}

// ClientTLS is how keyroll and the probes check a node of rc whose CA bundle is ca (PEM): nil when
// ca holds no certificate.
func ClientTLS(rc *v1beta1.RedisCluster, ca []byte) *tls.Config {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil
	}
	return &tls.Config{RootCAs: pool, ServerName: TLSServerName(rc), MinVersion: tls.VersionTLS12}
}

// TLSCASecretName holds the CA keyroll makes for a TLS cluster whose owner names no certificate:
// the CA bundle (CAKey) and the newest CA's private key (TLSCAKeyKey). No pod mounts it.
func TLSCASecretName(rc *v1beta1.RedisCluster) string { return rc.Name + "-tls-ca" }

// TLSCAKeyKey is the key of the CA's private key in TLSCASecretName.
const TLSCAKeyKey = "ca.key"

// TLSCASecret is the cluster's own CA: its bundle (newest first) and the newest CA's key.
func TLSCASecret(rc *v1beta1.RedisCluster, bundle, key []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: objectMeta(rc, TLSCASecretName(rc)),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{CAKey: bundle, TLSCAKeyKey: key},
	}
}

// OwnCertificate says whether keyroll makes the cluster's certificate (TLS without the owner's).
func OwnCertificate(rc *v1beta1.RedisCluster) bool {
	return TLSEnabled(rc) && rc.Spec.TLS.CertificateSecretRef == nil
}
