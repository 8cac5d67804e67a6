// Package certs keeps a CA of keyroll's own and the serving certificate it signs, as the data of a
// Secret: made when missing, the certificate replaced at two thirds of its life, the CA at two
// thirds of its own with the old one trusted (in the bundle) until it expires, and a new CA
// signing only once it has had time to be trusted. The conversion webhook's certificate and a TLS
// RedisCluster's (without a certificate of the owner's) are kept this way. Plain values in and
// out: time, Secret data and names; no client.
package certs

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// The keys of a certificate Secret's data.
const (
	// KeyCABundle holds the CAs the API server is to trust, newest first: after a CA is replaced,
	// the previous one stays until it expires, so that the certificate it signed is trusted while
	// some replica still serves it.
	KeyCABundle = "ca.crt"
	// KeyCAKey is the newest CA's private key.
	KeyCAKey = "ca.key"
	// KeyCert and KeyKey are the serving certificate and its key.
	KeyCert = "tls.crt"
	KeyKey  = "tls.key"
)

// Authority is a CA that signs serving certificates.
type Authority struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewAuthority makes a CA named name, valid for validity from now.
func NewAuthority(now time.Time, validity time.Duration, name string) (*Authority, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s %s", name, now.UTC().Format(time.RFC3339))},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return &Authority{Cert: cert, key: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// Sign makes a serving certificate for the DNS names (or IP addresses), valid for validity from
// now but never beyond the CA. It may serve as a client certificate too (a Redis replica shows
// its node's certificate to its primary).
func (a *Authority) Sign(now time.Time, validity time.Duration, hosts []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(a.Cert.NotAfter) {
		notAfter = a.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-Backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// ParseAuthority reads the key of the newest CA, the first of certs (a bundle as ParseBundle reads
// it).
func ParseAuthority(certs []*x509.Certificate, keyPEM []byte) (*Authority, error) {
	if len(certs) == 0 {
		return nil, errors.New("no CA certificate")
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("no PEM key")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	if !key.PublicKey.Equal(certs[0].PublicKey) {
		return nil, errors.New("the CA key does not belong to the bundle's first CA")
	}
	return &Authority{Cert: certs[0], key: key}, nil
}

// ParseBundle reads every certificate of a PEM bundle, in order.
func ParseBundle(bundle []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// JoinPEM is the bundle of the certificates, in order.
func JoinPEM(certs []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// ServingCertificate parses the serving certificate and key.
func ServingCertificate(certPEM, keyPEM []byte) (*tls.Certificate, *x509.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	pair.Leaf = leaf
	return &pair, leaf, nil
}

// Backdate is how far before its making a certificate is valid from, for clocks a little behind.
const Backdate = time.Minute

// Due says whether a certificate has passed two thirds of its life (from when it was made) at
// now: it is replaced then, leaving a third for whoever serves it to load its successor.
func Due(now time.Time, c *x509.Certificate) bool {
	made := c.NotBefore.Add(Backdate)
	return now.After(made.Add(c.NotAfter.Sub(made) * 2 / 3))
}

// Covers says whether the certificate names every host.
func Covers(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// InBundle says whether one of the CAs signed the certificate.
func InBundle(c *x509.Certificate, cas []*x509.Certificate) bool {
	for _, ca := range cas {
		if c.CheckSignatureFrom(ca) == nil {
			return true
		}
	}
	return false
}
