package certs

import (
	"crypto/x509"
	"encoding/pem"
	"maps"
	"slices"
	"time"
)

// Policy is how long a kept CA and certificate live, and how their replacements are timed.
type Policy struct {
	// CAName names the CA (with the time it was made).
	CAName string
	// CAValidity and CertValidity are the lives of a new CA and a new serving certificate; each is
	// replaced at two thirds of its life (Due).
	CAValidity, CertValidity time.Duration
	// Settle is how long a new CA is only trusted (in the bundle) before it signs: the time its
	// clients need to take the new bundle in.
	Settle time.Duration
	// Margin: a certificate that ends within it is replaced at once, whatever else holds.
	Margin time.Duration
}

// Made says what Keep made.
type Made struct{ CA, Certificate bool }

// Keep brings data (a Secret's: KeyCABundle, KeyCAKey, KeyCert, KeyKey) to a CA that is not Due
// and a serving certificate for hosts that one of the bundle's CAs signed and that is not Due,
// replacing what is missing, unreadable or due as Policy says. A replaced CA stays in the bundle
// until it expires. It returns a copy of data with the changes.
func Keep(now time.Time, data map[string][]byte, hosts []string, p Policy) (map[string][]byte, Made, error) {
	out := maps.Clone(data)
	if out == nil {
		out = map[string][]byte{}
	}
	var made Made
	cas, _ := ParseBundle(out[KeyCABundle])
	ca, err := ParseAuthority(cas, out[KeyCAKey])
	if err != nil || Due(now, ca.Cert) {
		next, _, err := NewAuthority(now, p.CAValidity, p.CAName)
		if err != nil {
			return nil, made, err
		}
		ca, cas = next, append([]*x509.Certificate{next.Cert}, cas...)
		key, err := x509.MarshalECPrivateKey(next.key)
		if err != nil {
			return nil, made, err
		}
		out[KeyCAKey] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: key})
		made.CA = true
	}
	// A CA stays in the bundle until it expires: a certificate it signed may still be served.
	cas = slices.DeleteFunc(cas, func(c *x509.Certificate) bool { return now.After(c.NotAfter) })
	out[KeyCABundle] = JoinPEM(cas)

	_, leaf, err := ServingCertificate(out[KeyCert], out[KeyKey])
	young := now.Sub(ca.Cert.NotBefore) <= Backdate+p.Settle
	var renew bool
	switch {
	case err != nil, !InBundle(leaf, cas), now.After(leaf.NotAfter.Add(-p.Margin)):
		renew = true // none, signed by a CA no longer trusted, or about to expire
	case young:
		renew = false // the newest CA signs only once its clients have had time to trust it
	default:
		renew = Due(now, leaf) || !Covers(leaf, hosts) || leaf.CheckSignatureFrom(ca.Cert) != nil
	}
	if renew {
		certPEM, keyPEM, err := ca.Sign(now, p.CertValidity, hosts)
		if err != nil {
			return nil, made, err
		}
		out[KeyCert], out[KeyKey] = certPEM, keyPEM
		made.Certificate = true
	}
	return out, made, nil
}
