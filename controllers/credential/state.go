package credential

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/rotation"
)

// Cluster is one reconcile's state of a RedisCluster, the only one: the RedisCluster reconciler
// and the credential sources share it. It holds the object (its status is what they change), the
// object as last written, its conditions, its parsed rotation settings, and how to write the
// status.
type Cluster struct {
	RC *v1beta1.RedisCluster
	// Before is the RedisCluster as last written: the status patch is computed against it.
	Before *v1beta1.RedisCluster
	Conds  status.Setter
	// Schedule and Window are the parsed spec.rotation (nil when unset or invalid).
	Schedule rotation.Schedule
	Window   *rotation.Window
	// Conflict names an owned object that exists and is not keyroll's, when one does.
	Conflict string
	// StatusLater says that the status is left to the next reconcile, which comes at once.
	StatusLater bool
	// Status writes the status now (Persist): a new lease is in the ledger before anything uses it.
	Status StatusWriter
}

// StatusWriter writes a RedisCluster's status at once, its conditions summed up.
type StatusWriter interface {
	WriteStatus(ctx context.Context, c *Cluster) error
}

// Persist writes the status now.
func (c *Cluster) Persist(ctx context.Context) error { return c.Status.WriteStatus(ctx, c) }

// Lease is the ledger's record of lease id (ok false: none).
func (c *Cluster) Lease(id string) (v1beta1.LeaseRecord, bool) {
	for _, l := range c.RC.Status.Leases {
		if l.LeaseID == id {
			return l, true
		}
	}
	return v1beta1.LeaseRecord{}, false
}

// NotReady says that there is no usable credential, for reason; when warn is set, a Warning event
// with eventReason says so too when the condition changes.
func (c *Cluster) NotReady(reason, eventReason, action, msg string, warn bool) {
	if c.Conds.Set(v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, reason, msg) && warn {
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
		c.Conds.Set(v1beta1.ConditionScheduleValid, metav1.ConditionTrue, v1beta1.ReasonAvailable, "spec.rotation is valid")
		return
	}
	c.Schedule, c.Window = nil, nil
	if c.Conds.Set(v1beta1.ConditionScheduleValid, metav1.ConditionFalse, v1beta1.ReasonInvalidSchedule, "spec.rotation: "+err.Error()) {
		c.Conds.Announce(true, v1beta1.ReasonInvalidSchedule, "Schedule", "spec.rotation: %v", err)
	}
}
