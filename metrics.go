package main

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The metrics endpoint is served over HTTPS to authorised scrapers only: the manager checks each
// request's bearer token with a TokenReview and its permission to get /metrics (the
// keyroll-metrics-reader ClusterRole) with a SubjectAccessReview, so it may create both.
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Neither the metrics endpoint nor the health probes (--health-probe-bind-address) read a
// request's body, so neither needs a bound on it: in controller-runtime v0.22 the metrics filter
// reads the bearer token, promhttp and healthz.Handler the path and query, and net/http discards at
// most 256 KiB of a body left unread before it closes the connection. Both servers are
// controller-runtime's, with its ReadHeaderTimeout (32 s) and MaxHeaderBytes (1 MiB).

// metricsOptions configures the metrics endpoint on addr ("0" turns it off). Secure, it serves
// HTTPS with the tls.crt and tls.key of certDir (reloaded when they change) or, without them, a
// self-signed certificate made in memory; HTTP/2 is off (CVE-2023-44487, CVE-2023-39325), as in
// the kubebuilder scaffold. Not secure, it serves plain HTTP to anyone: for local use only.
func metricsOptions(addr string, secure bool, certDir string) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr}
	if !secure {
		return o
	}
	o.SecureServing = true
	o.FilterProvider = filters.WithAuthenticationAndAuthorization
	o.CertDir = certDir
	o.TLSOpts = []func(*tls.Config){http1Only}
	return o
}

// http1Only turns HTTP/2 off on a TLS listener (CVE-2023-44487, CVE-2023-39325), as the
// kubebuilder scaffold does for the metrics and webhook servers.
func http1Only(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }
