package certs

import (
	"testing"
	"time"
)

var policy = Policy{CAName: "test CA", CAValidity: 90 * time.Hour, CertValidity: 9 * time.Hour, Settle: 6 * time.Hour, Margin: time.Hour}

// state reads what Keep left: the bundle and the certificate it serves.
func state(t *testing.T, data map[string][]byte) (cas []*Authority, leafSigner int) {
	t.Helper()
	bundle, err := ParseBundle(data[KeyCABundle])
	if err != nil {
		t.Fatal(err)
	}
	_, leaf, err := ServingCertificate(data[KeyCert], data[KeyKey])
	if err != nil {
		t.Fatal(err)
	}
	leafSigner = -1
	for i, c := range bundle {
		cas = append(cas, &Authority{Cert: c})
		if leaf.CheckSignatureFrom(c) == nil {
			leafSigner = i
		}
	}
	return cas, leafSigner
}

// From nothing, Keep makes a CA and a certificate for the hosts; it leaves a certificate that is
// not due alone, replaces it at two thirds of its life, replaces a due CA while the old one signs
// on until the new one has settled, and drops the old CA from the bundle once it has expired.
func TestKeepReplacesBeforeExpiryWithoutAGap(t *testing.T) {
	hosts := []string{"orders.shop.svc", "*.orders-headless.shop.svc"}
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	data, made, err := Keep(now, nil, hosts, policy)
	if err != nil || !made.CA || !made.Certificate {
		t.Fatalf("from nothing: %+v, %v", made, err)
	}
	step := func(d time.Duration) Made {
		t.Helper()
		now = now.Add(d)
		var m Made
		if data, m, err = Keep(now, data, hosts, policy); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := step(time.Hour); m.CA || m.Certificate {
		t.Errorf("an hour later: %+v, want nothing made", m)
	}
	if m := step(5*time.Hour + time.Minute); m.CA || !m.Certificate { // 6h: two thirds of 9h
		t.Errorf("at two thirds of the certificate's life: %+v, want a new certificate", m)
	}
	for range 9 { // day 2.5: past two thirds of the CA's 90 hours (60h)
		step(6 * time.Hour)
	}
	cas, signer := state(t, data)
	if len(cas) != 2 || signer != 1 {
		t.Fatalf("the CA due: %d CAs, the certificate signed by CA %d; want a new CA first, the certificate still the old one's", len(cas), signer)
	}
	step(6*time.Hour + time.Minute) // the new CA has settled
	if cas, signer = state(t, data); len(cas) != 2 || signer != 0 {
		t.Fatalf("after the new CA settled: %d CAs, signer %d; want the new CA to sign, the old one kept", len(cas), signer)
	}
	for range 6 {
		step(6 * time.Hour) // past the old CA's end (90h)
	}
	if cas, signer = state(t, data); len(cas) != 1 || signer != 0 {
		t.Fatalf("after the old CA's end: %d CAs, signer %d; want the new CA alone", len(cas), signer)
	}
	data[KeyCert] = []byte("not a certificate")
	if m := step(time.Minute); !m.Certificate || m.CA {
		t.Errorf("an unreadable certificate: %+v, want a new one of the same CA", m)
	}
}
