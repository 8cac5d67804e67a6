package credential

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/controllers/stoppoint"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault"
)

// MaxSteps bounds the decide-and-act steps of one reconcile: a renewal or lookup that finds the
// lease gone, the issue that replaces it, and the decision that nothing more is due. Each step's
// decision is rotation.Decide's alone, on what the step before left, and is never changed by
// hand; deciding once per reconcile instead would cost another reconcile, and another status
// write for its plan (status.credential.lease.nextRenewal, nextRotation), after every renewal and issue.
const MaxSteps = 4

// MaxLeases is how many leases the ledger holds at most (status.leases, as the CRD bounds it).
const MaxLeases = 64

// MaxSupersededUsers is how many users of replaced credentials without a tracked lease the status
// holds at most (status.credential.supersededUsers, as the CRD bounds it).
const MaxSupersededUsers = 16

// Ledger works on the lease ledger of RedisClusters through their Vault connections.
type Ledger struct {
	Clock   clock.Clock
	Metrics *metrics.Metrics
	// Checks remembers when each live lease was last confirmed in Vault.
	Checks *LeaseChecks
	// Upkeep, when set, is told when each cluster's lease upkeep (a renewal, a lookup, a
	// rotation) is next due, so that the cluster is then looked at ahead of other work.
	Upkeep interface {
		Due(key types.NamespacedName, at time.Time)
	}
	// Connections, read through Reader, reach the VaultConnection of a lease that came through
	// another one than the spec names now, confined to what the cluster's namespace may do there;
	// without them such a lease cannot be reached (ErrNoConnection).
	Connections *connection.Connector
	Reader      client.Reader
}

// Input translates the RedisCluster's status into rotation's plain input; leaseGone says a
// renewal or lookup found the lease gone from Vault. vcl, when
// set, says when the token that created the lease ends, as far as keyroll knows; that end is kept
// in the status.
func (l *Ledger) Input(cl *Cluster, vcl vault.LeaseClient, hasCredential, leaseGone bool) rotation.Input {
	rc := cl.RC
	in := rotation.Input{
		Now: l.Clock.Now(), HasCredential: hasCredential, LeaseGone: leaseGone, RenewalPercent: DefaultRenewalPercent,
		Paused: rc.Spec.Rotation.Paused, RotateNow: rc.RotateNowRequest(),
		RotateNowAcknowledged: rc.Status.RotateNowAcknowledged, RolloutInProgress: rc.Status.Rollout != nil,
	}
	if vl := rc.Spec.Credentials.VaultLease; vl != nil {
		in.RenewalPercent = vl.RenewalPercent
		if vl.MinTTL != nil {
			in.MinTTL = vl.MinTTL.Duration
		}
	}
	in.Schedule, in.Window = cl.Schedule, cl.Window
	c := rc.Status.Credential
	if c == nil {
		return in
	}
	in.ExpiresAt, in.Renewable, in.RenewalCapped = status.Of(c.Lease.ExpiresAt), c.Lease.Renewable, c.Lease.RenewalCapped
	in.IssuedAt, in.RenewedAt = status.Of(c.IssuedAt), status.Of(c.IssuedAt)
	if c.Lease.LastRenewal != nil {
		in.RenewedAt = c.Lease.LastRenewal.Time
	}
	in.LeaseDuration = in.ExpiresAt.Sub(in.RenewedAt)
	in.CappedTTL = in.LeaseDuration
	in.LastRotation, in.DeliveredAt = status.Of(c.LastRotation), status.Of(c.DeliveredAt)
	in.RenewalKey = string(rc.UID) + "/" + c.Lease.LeaseID
	if vcl != nil && c.VaultLease.TokenAccessor != "" {
		if t, ok := vcl.Token(c.VaultLease.TokenAccessor); ok && !t.EndsAt.IsZero() {
			c.VaultLease.TokenEndsAt = status.At(t.EndsAt)
		}
	}
	in.TokenEndsAt = status.Of(c.VaultLease.TokenEndsAt)
	if c.Lease.LeaseID != "" {
		in.NextLeaseCheck = l.Checks.Next(client.ObjectKeyFromObject(rc), c.Lease.LeaseID, in.RenewedAt)
	}
	return in
}

// Check looks the live lease up in Vault. gone says Vault no longer knows it.
func (l *Ledger) Check(ctx context.Context, cl *Cluster, vcl vault.LeaseClient) (gone bool, err error) {
	gone, _, err = l.lookUp(ctx, cl, vcl, cl.RC.Status.Credential.Lease.LeaseID)
	return gone, err
}

// lookUp looks lease id up in Vault through vcl and records the confirmation (LeaseChecks). gone
// says it is no longer live; disowned, that keyroll refused to send it (it left the ledger).
func (l *Ledger) lookUp(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, id string) (gone, disowned bool, err error) {
	info, err := vcl.Lookup(ctx, id)
	if vault.IsRefused(err) {
		l.disown(ctx, cl, id, err)
		return true, true, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("looking up lease %s: %w", id, err)
	}
	if info.Exists {
		l.Checks.Checked(client.ObjectKeyFromObject(cl.RC), id, l.Clock.Now())
	}
	return !info.Exists, false, nil
}

// Renew extends the current lease. gone says the lease no longer exists in Vault.
func (l *Ledger) Renew(ctx context.Context, cl *Cluster, vcl vault.LeaseClient) (gone bool, err error) {
	c := cl.RC.Status.Credential
	increment := time.Duration(0)
	if c.Lease.Duration != nil {
		increment = c.Lease.Duration.Duration
	}
	ren, err := vcl.Renew(ctx, c.Lease.LeaseID, increment)
	l.Metrics.Renewals.WithLabelValues(metrics.Result(err)).Inc()
	if vault.IsLeaseGone(err) {
		return true, nil
	}
	if vault.IsRefused(err) {
		l.disown(ctx, cl, c.Lease.LeaseID, err)
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("renewing lease: %w", err)
	}
	expires := status.At(ren.ExpiresAt)
	c.Lease.LastRenewal, c.Lease.ExpiresAt, c.Lease.Renewable, c.Lease.RenewalCapped = status.At(l.Clock.Now()), expires, ren.Renewable, ren.Capped
	for i := range cl.RC.Status.Leases {
		if cl.RC.Status.Leases[i].LeaseID == c.Lease.LeaseID {
			cl.RC.Status.Leases[i].ExpiresAt, cl.RC.Status.Leases[i].LastRenewal = expires, c.Lease.LastRenewal
		}
	}
	l.Checks.Checked(client.ObjectKeyFromObject(cl.RC), c.Lease.LeaseID, l.Clock.Now())
	log.FromContext(ctx).V(1).Info("Lease renewed", "lease", c.Lease.LeaseID, "granted", ren.Duration, "capped", ren.Capped)
	return false, nil
}

// Planned records what the decision plans next: the renewal and rotation times, the lease's
// expiry for the metric.
func (l *Ledger) Planned(cl *Cluster, d rotation.Decision) {
	c := cl.RC.Status.Credential
	l.Metrics.SetLeaseExpiry(client.ObjectKeyFromObject(cl.RC), status.Of(c.Lease.ExpiresAt))
	c.Lease.NextRenewal, c.NextRotation = status.At(d.NextRenewal), status.At(d.NextRotation)
	l.Due(cl, d.When)
}

// Due says that the cluster's lease upkeep is next due at at (Upkeep).
func (l *Ledger) Due(cl *Cluster, at time.Time) {
	if l.Upkeep != nil && !at.IsZero() {
		l.Upkeep.Due(client.ObjectKeyFromObject(cl.RC), at)
	}
}

func Remove(leases []v1beta1.LeaseRecord, id string) []v1beta1.LeaseRecord {
	out := leases[:0:0]
	for _, l := range leases {
		if l.LeaseID != id {
			out = append(out, l)
		}
	}
	return out
}

// RevokeSuperseded revokes the leases that a newer credential has replaced and Retire has let go
// (Revoking); it is called only once that credential runs on every Redis pod and consumer. A failed revocation stays in the ledger as
// Revoking and is retried with backoff.
func (l *Ledger) RevokeSuperseded(ctx context.Context, cl *Cluster, vcl vault.LeaseClient) error {
	var errs []error
	for _, lease := range cl.RC.Status.Leases {
		if lease.State != v1beta1.LeaseRevoking {
			continue // the current lease, or a superseded one whose user is still held (Retire)
		}
		errs = append(errs, l.Revoke(ctx, cl, vcl, lease.LeaseID))
	}
	return l.Outcome(cl, errors.Join(errs...))
}

// RevokeAll revokes every lease in the ledger, superseded ones included (a RedisCluster being
// deleted), each through the VaultConnection it came through; vcl, the spec's, may be nil when the
// spec names none.
func (l *Ledger) RevokeAll(ctx context.Context, cl *Cluster, vcl vault.LeaseClient) error {
	var errs []error
	for _, lease := range slices.Clone(cl.RC.Status.Leases) {
		errs = append(errs, l.Revoke(ctx, cl, vcl, lease.LeaseID))
	}
	return l.Outcome(cl, errors.Join(errs...))
}

// Revoke revokes one lease, through the VaultConnection it came through: on success it leaves
// the ledger, on failure it is marked Revoking.
func (l *Ledger) Revoke(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, id string) error {
	rec, ok := cl.Lease(id)
	if !ok {
		rec = v1beta1.LeaseRecord{LeaseID: id}
	}
	vcl, err := l.ClientFor(ctx, cl, vcl, rec)
	if err != nil {
		return err
	}
	stoppoint.Reached(stoppoint.BeforeRevoke, cl.RC.Namespace)
	err = vcl.Revoke(ctx, id)
	if vault.IsRefused(err) {
		l.disown(ctx, cl, id, err)
		return nil
	}
	if err == nil {
		stoppoint.Reached(stoppoint.AfterRevoke, cl.RC.Namespace)
	}
	l.Metrics.Revocations.WithLabelValues(metrics.Result(err)).Inc()
	if err != nil {
		for i := range cl.RC.Status.Leases {
			if cl.RC.Status.Leases[i].LeaseID == id {
				cl.RC.Status.Leases[i].State = v1beta1.LeaseRevoking
			}
		}
		return fmt.Errorf("revoking lease %s (%s): %w", id, vault.ClassOf(err), err)
	}
	cl.RC.Status.Leases = Remove(cl.RC.Status.Leases, id)
	cl.Conds.Announce(false, v1beta1.EventLeaseRevoked, "Revoke", "Revoked lease %s", id) // it leaves the ledger
	log.FromContext(ctx).Info("Lease revoked", "lease", id)
	return nil
}

// disown drops a lease that keyroll refused to send to Vault (vault.IsRefused): its ID does not lie
// under a path the cluster's namespace may use, so keyroll did not obtain it for this cluster (a
// hand-written ledger, a Secret another party wrote) or may no longer touch it. keyroll never
// renews, looks up or revokes it, and a Warning event names it; a live one ends at its TTL, or by
// a Vault administrator's hand.
func (l *Ledger) disown(ctx context.Context, cl *Cluster, id string, err error) {
	cl.RC.Status.Leases = Remove(cl.RC.Status.Leases, id)
	cl.Conds.Announce(true, v1beta1.EventLeaseDisowned, "Disown", "Lease %s left the ledger without a Vault call: %v", id, err)
	log.FromContext(ctx).Info("Lease disowned: outside what the namespace may use", "lease", id, "error", err.Error())
}

// Outcome sets Degraded for pending revocations, with an event on the transition.
func (l *Ledger) Outcome(cl *Cluster, err error) error {
	if err == nil {
		cl.Conds.Set(v1beta1.ConditionLeasesRevoked, metav1.ConditionTrue, v1beta1.ReasonAvailable, "Every superseded lease is revoked")
		return nil
	}
	msg := fmt.Sprintf("%d lease(s) not revoked yet, retrying: %v", Count(cl.RC, v1beta1.LeaseRevoking), err)
	if cl.Conds.Set(v1beta1.ConditionLeasesRevoked, metav1.ConditionFalse, v1beta1.ReasonRevocationPending, msg) {
		cl.Conds.Announce(true, v1beta1.EventRevocationFailed, "Revoke", "%s", msg)
	}
	return err
}

func Count(rc *v1beta1.RedisCluster, st v1beta1.LeaseState) int {
	n := 0
	for _, l := range rc.Status.Leases {
		if l.State == st {
			n++
		}
	}
	return n
}

// Supersede marks the active lease superseded: credential version by replaces it.
func Supersede(rc *v1beta1.RedisCluster, by string) {
	for i := range rc.Status.Leases {
		if rc.Status.Leases[i].State == v1beta1.LeaseActive {
			rc.Status.Leases[i].State, rc.Status.Leases[i].SupersededBy = v1beta1.LeaseSuperseded, by
		}
	}
}

// AddSighted puts leases seen in earlier versions of the Secret (ESO may mint more than one, on a
// first sync for instance) into the ledger as superseded, to be revoked after the rollout through
// connection, the VaultConnection they are tracked through.
func AddSighted(leases []v1beta1.LeaseRecord, sighted []string, now *metav1.Time, connection string) []v1beta1.LeaseRecord {
	for _, id := range sighted {
		if !Has(leases, id) {
			leases = append(leases, v1beta1.LeaseRecord{LeaseID: id, State: v1beta1.LeaseSuperseded, IssuedAt: now, Connection: connection})
		}
	}
	return leases
}

func Has(leases []v1beta1.LeaseRecord, id string) bool {
	for _, l := range leases {
		if l.LeaseID == id {
			return true
		}
	}
	return false
}

// Superseded are the leases of the ledger that a newer credential replaced.
func Superseded(rc *v1beta1.RedisCluster) []v1beta1.LeaseRecord {
	var out []v1beta1.LeaseRecord
	for _, l := range rc.Status.Leases {
		if l.State != v1beta1.LeaseActive {
			out = append(out, l)
		}
	}
	return out
}

// ToRevoke says that a lease is to be revoked (Revoking).
func ToRevoke(rc *v1beta1.RedisCluster) bool {
	return slices.ContainsFunc(rc.Status.Leases, func(l v1beta1.LeaseRecord) bool { return l.State == v1beta1.LeaseRevoking })
}

// Pending says that a replaced credential may still be in use: a superseded lease whose user
// is not retired yet, or the user of a replaced credential whose lease is not tracked. The
// rollout runs until the consumers have the current one.
func Pending(rc *v1beta1.RedisCluster) bool {
	for _, l := range rc.Status.Leases {
		if l.State == v1beta1.LeaseSuperseded {
			return true
		}
	}
	return rc.Status.Credential != nil && len(rc.Status.Credential.SupersededUsers) > 0
}

// Retiring says that something replaced is on its way out: a pending credential, a lease not
// revoked yet, or a user not yet removed from every node.
func Retiring(rc *v1beta1.RedisCluster) bool {
	return Pending(rc) || len(Superseded(rc)) > 0 || len(rc.Status.RetiringUsers) > 0
}

// DefaultRenewalPercent is how far into a lease ESO obtained keyroll renews it.
const DefaultRenewalPercent = 67

// HonourGone applies onRevokedOutside to the user of a lease that is gone from Vault before keyroll
// revoked it (revoked outside keyroll, or ended): with CutOff, the default, the user is to leave
// every node at once (status.retiringUsers); with RollOver it stays there until the credential
// that replaces it has rolled out (status.credential.supersededUsers). It says whether the user
// is cut off.
func HonourGone(rc *v1beta1.RedisCluster, username string) bool {
	if username == "" {
		return rc.Spec.Credentials.OnRevokedOutside != v1beta1.RevokedOutsideRollOver
	}
	if c := rc.Status.Credential; rc.Spec.Credentials.OnRevokedOutside == v1beta1.RevokedOutsideRollOver &&
		(c == nil || len(c.SupersededUsers) < MaxSupersededUsers) { // a full list cuts off
		if c != nil && !slices.Contains(c.SupersededUsers, username) {
			c.SupersededUsers = append(c.SupersededUsers, username)
		}
		return false
	}
	if !slices.Contains(rc.Status.RetiringUsers, username) {
		rc.Status.RetiringUsers = append(rc.Status.RetiringUsers, username)
	}
	return true
}

// CutOff says that a user leaves the nodes whose lease is not being revoked by keyroll: a lease
// revoked outside keyroll left the ledger at once (onRevokedOutside CutOff), ahead of the rollout
// of the credential that replaced it. (The users of superseded leases retire only after their
// rollout, their leases Revoking.)
func CutOff(rc *v1beta1.RedisCluster) bool { return len(CutOffUsers(rc)) > 0 }

// CutOffUsers are the retiring users that leave the nodes at once, ahead of any rollout: those of
// leases revoked outside keyroll, under onRevokedOutside CutOff (no lease of theirs is Revoking).
func CutOffUsers(rc *v1beta1.RedisCluster) []string {
	var out []string
	for _, name := range rc.Status.RetiringUsers {
		if !slices.ContainsFunc(rc.Status.Leases, func(l v1beta1.LeaseRecord) bool {
			return l.Username == name && l.State == v1beta1.LeaseRevoking
		}) {
			out = append(out, name)
		}
	}
	return out
}
