package credential

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/vault"
)

// Adopter is the ExternalSecret source: ESO syncs the credential, keyroll adopts it.
type Adopter struct {
	Client client.Client
	// APIReader reads past the cache, where ESO may have written a moment ago.
	APIReader client.Reader
	Clock     clock.Clock
	Metrics   *metrics.Metrics
	Ledger    *Ledger
	sightings *sightings
}

// NewAdopter returns the ExternalSecret source.
func NewAdopter(c client.Client, apiReader client.Reader, clk clock.Clock, m *metrics.Metrics, l *Ledger) *Adopter {
	return &Adopter{Client: c, APIReader: apiReader, Clock: clk, Metrics: m, Ledger: l, sightings: &sightings{}}
}

// WithClient returns a copy of r that writes through c and shares r's memory.
func (r *Adopter) WithClient(c client.Client) *Adopter {
	out := *r
	out.Client = c
	return &out
}

// Forget drops what the source remembers of a deleted cluster.
func (r *Adopter) Forget(key types.NamespacedName) { r.sightings.forget(key, nil) }

// waitForConnection is how long a cluster whose ExternalSecret cannot be written waits before it
// looks again (a change of the RedisCluster wakes it earlier).
const waitForConnection = time.Minute

// mayUseSource says whether the RedisCluster may use the store or generator it names: one of its
// own namespace always; a ClusterSecretStore or ClusterGenerator only through a VaultConnection
// (externalSecret.connectionRef, whose client is vcl) that lists it in spec.externalSecrets.
// Otherwise the condition says so, and no ExternalSecret is written for it.
func mayUseSource(cl *Cluster, vcl vault.LeaseClient) bool {
	kind, name, field := cl.RC.ClusterScopedSource()
	if kind == "" {
		return true
	}
	err := fmt.Errorf("%s: %s %q may be used only through a VaultConnection that lists it in spec.externalSecrets (credentials.externalSecret.connectionRef)", field, kind, name)
	if g, ok := vcl.(interface {
		AllowsClusterScoped(kind, name, field string) error
	}); ok {
		err = g.AllowsClusterScoped(kind, name, field)
	}
	if err != nil {
		cl.NotReady(v1beta1.ReasonSourceNotAllowed, v1beta1.EventAccessDenied, "WriteExternalSecret", err.Error(), true)
		return false
	}
	return true
}

// ExternalSecretsNotInstalled reports that ExternalSecret mode cannot work in this operator: External Secrets
// Operator's API was missing when it started.
func ExternalSecretsNotInstalled(cl *Cluster) {
	msg := "credentials.source is ExternalSecret, but External Secrets Operator's API (external-secrets.io/v1 ExternalSecret) was not installed when keyroll started: install External Secrets Operator, then restart keyroll"
	cl.NotReady(v1beta1.ReasonExternalSecretsNotInstalled, v1beta1.ReasonExternalSecretsNotInstalled, "Sync", msg, true)
}
