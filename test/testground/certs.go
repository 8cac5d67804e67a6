package testground

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// certAuthority is a small CA of the test ground's own: the API server's serving certificate (with
// the node's addresses in it, so that pods can check it) and the client certificate the API server
// shows the kubelet.
type certAuthority struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

// newCA makes a self-signed CA valid for a day.
func newCA(name string) (*certAuthority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("making CA %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &certAuthority{cert: cert, key: key, CertPEM: pemBlock("CERTIFICATE", der)}, nil
}

// certRequest describes a certificate to issue.
type certRequest struct {
	CommonName    string
	Organizations []string
	IPs           []net.IP
	DNSNames      []string
	Server        bool // serving certificate; otherwise a client certificate
	// Both makes it a serving and a client certificate (a Redis node's, which its replicas show).
	Both bool
}

// issue returns a certificate and its key, both PEM-encoded.
func (ca *certAuthority) issue(req certRequest) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	switch {
	case req.Both:
		usages = append(usages, x509.ExtKeyUsageServerAuth)
	case req.Server:
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Organizations},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usages,
		IPAddresses:  req.IPs,
		DNSNames:     req.DNSNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing a certificate for %s: %w", req.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

// writeKeyPair writes a certificate and its key as certPath and keyPath (the key readable by root only).
func writeKeyPair(certPath, keyPath string, certPEM, keyPEM []byte) error {
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyPath, keyPEM, 0o600)
}

// newSigningKey is a key pair for signing service-account tokens: the private key and a
// self-signed certificate that carries the public key, both PEM-encoded.
func newSigningKey() (certPEM, keyPEM []byte, err error) {
	ca, err := newCA("keyroll-testground-service-accounts")
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return nil, nil, err
	}
	return ca.CertPEM, pemBlock("EC PRIVATE KEY", keyDER), nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// TestCA is a CA of a test's own, for certificates a test gives keyroll (a TLS RedisCluster's, as
// cert-manager's CA issuer would make them).
type TestCA struct {
	ca *certAuthority
	// PEM is the CA's certificate.
	PEM []byte
}

// NewTestCA makes a CA valid for a day.
func NewTestCA(name string) (*TestCA, error) {
	ca, err := newCA(name)
	if err != nil {
		return nil, err
	}
	return &TestCA{ca: ca, PEM: ca.CertPEM}, nil
}

// IssueServer is a serving (and client) certificate for dnsNames and ips, valid for a day, its key
// (both PEM) and its serial number.
func (c *TestCA) IssueServer(dnsNames []string, ips ...net.IP) (certPEM, keyPEM []byte, sn *big.Int, err error) {
	certPEM, keyPEM, err = c.ca.issue(certRequest{CommonName: dnsNames[0], DNSNames: dnsNames, IPs: ips, Both: true})
	if err != nil {
		return nil, nil, nil, err
	}
	return certPEM, keyPEM, serialOf(certPEM), nil
}

// IssueClient is a client certificate for name, valid for a day, and its key (both PEM).
func (c *TestCA) IssueClient(name string) (certPEM, keyPEM []byte, err error) {
	return c.ca.issue(certRequest{CommonName: name})
}

func serialOf(certPEM []byte) *big.Int {
	block, _ := pem.Decode(certPEM)
	cert, _ := x509.ParseCertificate(block.Bytes)
	return cert.SerialNumber
}

// IssueServerOnly is IssueServer's certificate without the client usage, and its key and serial.
func (c *TestCA) IssueServerOnly(dnsNames []string) (certPEM, keyPEM []byte, sn *big.Int, err error) {
	certPEM, keyPEM, err = c.ca.issue(certRequest{CommonName: dnsNames[0], DNSNames: dnsNames, Server: true})
	if err != nil {
		return nil, nil, nil, err
	}
	return certPEM, keyPEM, serialOf(certPEM), nil
}
