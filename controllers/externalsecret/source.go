// Package externalsecret is the ExternalSecret credential source of a RedisCluster: External
// Secrets Operator syncs the credential through an ExternalSecret keyroll owns; keyroll adopts each
// credential ESO writes, and, when the generator hands over the raw Vault response, takes the
// lease into the ledger to renew and revoke it (ESO does neither).
package externalsecret

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/controllers/ledger"
	"github.com/keyroll/keyroll/controllers/metrics"
)

// Source is the ExternalSecret source.
type Source struct {
	Client client.Client
	// APIReader reads past the cache, where ESO may have written a moment ago.
	APIReader client.Reader
	Clock     clock.Clock
	Metrics   *metrics.Metrics
	Ledger    *ledger.Ledger
	sightings *sightings
}

// NewSource returns the ExternalSecret source.
func NewSource(c client.Client, apiReader client.Reader, clk clock.Clock, m *metrics.Metrics, l *ledger.Ledger) *Source {
	return &Source{Client: c, APIReader: apiReader, Clock: clk, Metrics: m, Ledger: l, sightings: &sightings{}}
}

// WithClient returns a copy of r that writes through c and shares r's memory.
func (r *Source) WithClient(c client.Client) *Source {
	out := *r
	out.Client = c
	return &out
}

// Forget drops what the source remembers of a deleted cluster.
func (r *Source) Forget(key types.NamespacedName) { r.sightings.forget(key, nil) }

// waitForConnection is how long a cluster whose ExternalSecret cannot be written waits before it
// looks again (a change of the RedisCluster wakes it earlier).
const waitForConnection = time.Minute
