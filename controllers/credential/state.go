package credential

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers/conditions"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault"
)

// Cluster is one reconcile's state of a RedisCluster, the only one: the RedisCluster reconciler
// and the credential sources share it. It holds the object (its status is what they change), the
// object as last written, its conditions, its parsed rotation settings, and how to write the
// status and reach another VaultConnection.
type Cluster struct {
	RC *v1alpha1.RedisCluster
	// Before is the RedisCluster as last written: the status patch is computed against it.
	Before *v1alpha1.RedisCluster
	Conds  conditions.Setter
	// Schedule and Window are the parsed spec.rotation (nil when unset or invalid).
	Schedule rotation.Schedule
	Window   *rotation.Window
	// Conflict names an owned object that exists and is not keyroll's, when one does.
	Conflict string
	// StatusLater says that the status is left to the next reconcile, which comes at once.
	StatusLater bool
	// Status writes the status now (Persist): a new lease is in the ledger before anything uses it.
	Status StatusWriter
	// Connections, read through Reader, reach the VaultConnection of a lease that came through
	// another one than the spec names now, confined to what the cluster's namespace may do there;
	// without them such a lease cannot be reached (ErrNoConnection).
	Connections *connection.Connector
	Reader      client.Reader
}

// StatusWriter writes a RedisCluster's status at once, its conditions summed up.
type StatusWriter interface {
	WriteStatus(ctx context.Context, c *Cluster) error
}

// Persist writes the status now.
func (c *Cluster) Persist(ctx context.Context) error { return c.Status.WriteStatus(ctx, c) }

// ErrNoConnection says that no VaultConnection is known for a lease: keyroll cannot reach it.
var ErrNoConnection = errors.New("no VaultConnection to reach it through")

// ClientFor is the Vault client of the VaultConnection a lease came through: vcl, the spec's, or
// that other connection's.
func (c *Cluster) ClientFor(ctx context.Context, vcl vault.LeaseClient, lease v1alpha1.LeaseRecord) (vault.LeaseClient, error) {
	name := c.RC.LeaseConnection(lease)
	if name == c.RC.VaultConnectionName() || c.Connections == nil {
		if vcl == nil {
			return nil, fmt.Errorf("lease %s records no VaultConnection, and the spec names none: %w", lease.LeaseID, ErrNoConnection)
		}
		return vcl, nil
	}
	other, err := c.Connections.ClientOf(ctx, c.Reader, name, c.RC.Namespace)
	if err != nil {
		return nil, fmt.Errorf("VaultConnection %s, which lease %s came through: %w", name, lease.LeaseID, err)
	}
	return other, nil
}

// CurrentClient is the client of the VaultConnection the current lease came through (vcl, the
// spec's, unless the owner changed the connection since), and whether that is another connection
// than the spec names now (none included).
func (c *Cluster) CurrentClient(ctx context.Context, vcl vault.LeaseClient) (vault.LeaseClient, bool, error) {
	cur := c.RC.Status.Credential
	if cur == nil || cur.LeaseID == "" {
		return vcl, false, nil
	}
	rec, ok := c.Lease(cur.LeaseID)
	if !ok {
		return vcl, false, nil
	}
	lvcl, err := c.ClientFor(ctx, vcl, rec)
	return lvcl, c.RC.LeaseConnection(rec) != c.RC.VaultConnectionName(), err
}

// Lease is the ledger's record of lease id (ok false: none).
func (c *Cluster) Lease(id string) (v1alpha1.LeaseRecord, bool) {
	for _, l := range c.RC.Status.Leases {
		if l.LeaseID == id {
			return l, true
		}
	}
	return v1alpha1.LeaseRecord{}, false
}

// NotReady says that there is no usable credential, for reason; when warn is set, a Warning event
// with eventReason says so too when the condition changes.
func (c *Cluster) NotReady(reason, eventReason, action, msg string, warn bool) {
	if c.Conds.Set(v1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, reason, msg) && warn {
		c.Conds.Announce(true, eventReason, action, "%s", msg)
	}
}

// ParseRotation parses the rotation schedule and window once per reconcile. An invalid one is
// reported (Degraded, InvalidSchedule) and ignored, so that renewals go on; the report is
// withdrawn once the spec is fixed.
func (c *Cluster) ParseRotation() {
	spec := c.RC.Spec.Rotation
	var err error
	if spec.Schedule != "" {
		c.Schedule, err = rotation.ParseSchedule(spec.Schedule)
	}
	if w := spec.MaintenanceWindow; err == nil && w != nil {
		c.Window, err = rotation.ParseWindow(w.Start, w.Duration.Duration, w.TimeZone)
	}
	if err == nil {
		c.Conds.Set(v1alpha1.ConditionScheduleValid, metav1.ConditionTrue, v1alpha1.ReasonAvailable, "spec.rotation is valid")
		return
	}
	c.Schedule, c.Window = nil, nil
	if c.Conds.Set(v1alpha1.ConditionScheduleValid, metav1.ConditionFalse, v1alpha1.ReasonInvalidSchedule, "spec.rotation: "+err.Error()) {
		c.Conds.Announce(true, v1alpha1.ReasonInvalidSchedule, "Schedule", "spec.rotation: %v", err)
	}
}
