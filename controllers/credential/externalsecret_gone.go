package credential

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/status"
)

// A tracked lease of External Secrets Operator's that is gone from Vault before its expiry.

// endedEarly reports, as Degraded=LeaseEndedEarly, that a tracked lease ended before its expiry
// (status.credential.externalSecret.leaseEndedEarlyAfter), until the current lease has outlived that age. It says
// whether it did.
func (r *Adopter) endedEarly(cl *Cluster, tracked bool) bool {
	c := cl.RC.Status.Credential
	if c.ExternalSecret.LeaseEndedEarlyAfter == nil {
		return false
	}
	alive := c.Lease.LeaseID != "" && Has(cl.RC.Status.Leases, c.Lease.LeaseID) // not the lease that ended
	if !tracked || (alive && r.Clock.Since(status.Of(c.IssuedAt)) > c.ExternalSecret.LeaseEndedEarlyAfter.Duration) {
		c.ExternalSecret.LeaseEndedEarlyAfter = nil // the current lease lives longer: it was a one-off
		return false
	}
	msg := fmt.Sprintf("A lease External Secrets Operator obtained was gone from Vault %s after it was issued, before its expiry: most likely External Secrets Operator's own Vault token ended, and Vault revoked the lease with it (keyroll cannot keep that token alive; it replaced the credential as soon as it noticed, within --lease-check-interval). Give External Secrets Operator's auth role a token TTL well above externalSecret.refreshInterval (%s), so that each credential is refreshed before its token ends",
		c.ExternalSecret.LeaseEndedEarlyAfter.Duration, durationOr(cl.RC.Spec.Credentials.ExternalSecret.RefreshInterval))
	if cl.Conds.Set(v1beta1.ConditionSourceHealthy, metav1.ConditionFalse, v1beta1.ReasonLeaseEndedEarly, msg) {
		cl.Conds.Announce(true, v1beta1.ReasonLeaseEndedEarly, "Adopt", "%s", msg)
	}
	return true
}

func durationOr(d *metav1.Duration) string {
	if d == nil {
		return "not set"
	}
	return d.Duration.String()
}

// leaseGoneExternally honours the tracked lease of the credential External Secrets Operator synced
// when it is gone from Vault before its expiry: revoked outside keyroll, or ended with External
// Secrets Operator's own Vault token, which keyroll cannot keep alive. The lease leaves the ledger
// and its user is treated as onRevokedOutside says, as in VaultLease mode: with CutOff the
// credential is delivered no more (status.credential.externalSecret.cutOff) and its user leaves every node at
// once, before External Secrets Operator has answered; with RollOver it stays until the new
// credential has rolled out. The caller asks External Secrets Operator for a new credential.
func (r *Adopter) leaseGoneExternally(ctx context.Context, cl *Cluster) {
	c := cl.RC.Status.Credential
	if c == nil || c.Lease.LeaseID == "" || c.ExternalSecret.CutOff {
		return
	}
	r.Metrics.RevokedOutside.Inc()
	cl.RC.Status.Leases = Remove(cl.RC.Status.Leases, c.Lease.LeaseID)
	if now := r.Clock.Now(); c.IssuedAt != nil && c.Lease.ExpiresAt != nil && now.Before(c.Lease.ExpiresAt.Time) {
		c.ExternalSecret.LeaseEndedEarlyAfter = &metav1.Duration{Duration: now.Sub(c.IssuedAt.Time).Truncate(time.Second)}
	}
	c.ExternalSecret.CutOff = HonourGone(cl.RC, c.Username)
	what := "its user stays on the Redis nodes until the new credential has rolled out (onRevokedOutside RollOver)"
	if c.ExternalSecret.CutOff {
		what = "its user is cut off on every Redis node (onRevokedOutside CutOff)"
	}
	cl.Conds.Announce(true, v1beta1.EventLeaseRevokedOutside, "Revoke",
		"Lease %s of user %s that External Secrets Operator obtained is gone from Vault before its expiry (revoked outside keyroll, or ended with External Secrets Operator's own Vault token): %s; asking for a new credential at once",
		c.Lease.LeaseID, c.Username, what)
	log.FromContext(ctx).Info("Tracked lease gone from Vault; asking External Secrets Operator for a new credential", "lease", c.Lease.LeaseID, "username", c.Username, "cutOff", c.ExternalSecret.CutOff)
}
