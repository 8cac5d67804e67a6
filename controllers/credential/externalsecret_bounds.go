package credential

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
)

// The status holds at most MaxLeases leases and MaxSupersededUsers superseded
// users, as the CRD bounds them. External Secrets Operator mints a credential at each refresh,
// and while a rollout does not end (a consumer that never becomes ready) each one is kept: the
// ledger fills. keyroll never writes a status the schema refuses, and never lets a lease go
// unrecorded: when the ledger is nearly full it pauses External Secrets Operator's refreshes
// (the ExternalSecret's refreshPolicy becomes CreatedOnce, under which ESO does not refresh a
// Secret it synced), says so (SourceHealthy=False, LedgerFull, with an event), and lifts the pause
// once the rollout is done and the superseded leases are revoked. The margin leaves room for the
// credentials ESO may be minting while the pause reaches it.
const (
	pauseLeaseMargin = 8
	pauseUserMargin  = 4
)

// refreshesPaused says whether External Secrets Operator's refreshes are to be paused for rc.
func refreshesPaused(rc *v1beta1.RedisCluster) bool {
	users := 0
	if c := rc.Status.Credential; c != nil {
		users = len(c.SupersededUsers)
	}
	return len(rc.Status.Leases) >= MaxLeases-pauseLeaseMargin || users >= MaxSupersededUsers-pauseUserMargin
}

// pauseRefreshes makes the ExternalSecret as rendered refresh no more while refreshesPaused.
func pauseRefreshes(rc *v1beta1.RedisCluster, es *externalsecrets.ExternalSecret) {
	if refreshesPaused(rc) {
		es.Spec.RefreshPolicy = externalsecrets.RefreshPolicyCreatedOnce
	}
}

// fits says whether the status can take a new credential with the leases sighted: adopting one
// that does not fit would make the status write fail.
func fits(rc *v1beta1.RedisCluster, newLeases int, tracked bool) bool {
	c := rc.Status.Credential
	if !tracked {
		return c == nil || len(c.SupersededUsers) < MaxSupersededUsers
	}
	return len(rc.Status.Leases)+newLeases <= MaxLeases
}

// reportBounds sets SourceHealthy=False, LedgerFull, while refreshes are paused or a credential
// waits for room (waiting), with an event on the transition, and withdraws it once there is room.
func reportBounds(cl *Cluster, waiting bool) bool {
	rc := cl.RC
	users := 0
	if c := rc.Status.Credential; c != nil {
		users = len(c.SupersededUsers)
	}
	if !waiting && !refreshesPaused(rc) {
		if c := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionSourceHealthy); c != nil && c.Reason == v1beta1.ReasonLedgerFull {
			cl.Conds.Set(v1beta1.ConditionSourceHealthy, metav1.ConditionTrue, v1beta1.ReasonAvailable, "The ledger has room again: External Secrets Operator refreshes the credential")
		}
		return false
	}
	msg := fmt.Sprintf("The ledger holds %d of at most %d leases and %d of at most %d superseded users while the rollout is not done: External Secrets Operator's refreshes are paused (ExternalSecret refreshPolicy CreatedOnce) until the rollout is done and the superseded leases are revoked",
		len(rc.Status.Leases), MaxLeases, users, MaxSupersededUsers)
	if waiting {
		msg += "; the credential External Secrets Operator synced last does not fit and is not adopted (nothing is delivered until there is room)"
	}
	if cl.Conds.Set(v1beta1.ConditionSourceHealthy, metav1.ConditionFalse, v1beta1.ReasonLedgerFull, msg) {
		cl.Conds.Announce(true, v1beta1.ReasonLedgerFull, "Adopt", "%s", msg)
	}
	return true
}
