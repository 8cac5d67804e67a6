package credential

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/controllers/metrics"
)

// Issuer is the VaultLease source: keyroll issues the credential from Vault and holds its lease.
type Issuer struct {
	Client client.Client
	// APIReader reads past the cache, where a lagging cache could make keyroll issue a second
	// credential.
	APIReader client.Reader
	Clock     clock.Clock
	Metrics   *metrics.Metrics
	Ledger    *Ledger
	// Intents, when set, records each issue before it is made (connection.Intents): the
	// orphan-lease sweep revokes only a lease whose issue was recorded and that no ledger holds.
	Intents Intents
}

// Intents records that keyroll is about to issue a credential, and drops the record once the
// lease is in the ledger (or there is none).
type Intents interface {
	Record(ctx context.Context, connection, path string, cluster types.NamespacedName) (string, error)
	Drop(ctx context.Context, connection string, ids ...string) error
}

// Retire has nothing to stop before the leases are revoked.
func (*Issuer) Retire(context.Context, *Cluster) (time.Duration, error) { return 0, nil }
