// Package ledger keeps a RedisCluster's lease ledger: it renews, looks up and revokes the leases
// recorded in the status, tells rotation.Decide what the ledger says, and remembers when each
// live lease was last confirmed in Vault. The credential sources and the RedisCluster reconciler
// share it.
package ledger

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers/conditions"
	"github.com/keyroll/keyroll/rotation"
)

// Cluster is one reconcile's view of a RedisCluster, as the credential sources see it: the object
// (its status is what they change), its conditions, its parsed rotation settings, and the write
// a source may need before it goes on.
type Cluster struct {
	RC    *v1alpha1.RedisCluster
	Conds conditions.Setter
	// Schedule and Window are the parsed spec.rotation (nil when unset or invalid).
	Schedule rotation.Schedule
	Window   *rotation.Window
	// Persist writes the status now: a new lease is in the ledger before anything uses it.
	Persist func(ctx context.Context) error
}

// NotReady says that there is no usable credential, for reason; when warn is set, a Warning event
// with eventReason says so too when the condition changes.
func (c *Cluster) NotReady(reason, eventReason, action, msg string, warn bool) {
	if c.Conds.Set(v1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, reason, msg) && warn {
		c.Conds.Announce(true, eventReason, action, "%s", msg)
	}
}
