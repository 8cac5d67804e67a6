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
	o.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	return o
}
