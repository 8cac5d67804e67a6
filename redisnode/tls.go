package redisnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
)

// ServedCertificate is the certificate the node at addr serves to a new TLS connection, checked
// with tlsConf (its CA and name); the connection ends after the handshake.
func ServedCertificate(ctx context.Context, addr string, tlsConf *tls.Config) (*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: tlsConf}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	defer func() { _ = c.Close() }()
	certs := c.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, errors.New("TLS handshake with " + addr + ": no certificate served")
	}
	return certs[0], nil
}
