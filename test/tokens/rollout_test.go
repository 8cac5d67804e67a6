package tokens

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/test/framework"
)

// TestTokenEndingDuringRolloutReplacesInTime: tokens of 15 s that end a minute after login, and a
// consumer whose new pod counts as available only after 150 s (minReadySeconds), so that a rollout
// is held open for longer than a token lives. A credential whose token is ending is replaced while
// the rollout runs, and the rollout goes on to the replacement. The superseded leases that the
// rollout still holds cannot outlive their tokens (Vault revokes a lease with the token that
// created it); for two and a half minutes:
//   - the current credential's lease is live in Vault at every sample, and the credential in the
//     consumers' Secret logs in on every Redis pod (the current user is never cut off);
//   - every lease that Vault lost while the ledger held it, or that keyroll found gone, was a
//     superseded one, announced (renewalCapped, a SupersededLeaseEnding event) before Vault lost
//     it, and left the ledger within leaveWindow after;
//   - every lease that left the ledger is named by an event that says why;
//   - no consumer command fails: with onRevokedOutside RollOver, the user of a lease that ended
//     stays on the Redis nodes until the rollout is done.
func TestTokenEndingDuringRolloutReplacesInTime(t *testing.T) {
	t.Parallel()
	const (
		hold  = 150 * time.Second
		watch = 150 * time.Second
		// leaveWindow is how long a lease may stay in the ledger once Vault no longer knows it:
		// keyroll revokes a lease before it writes the ledger, and looks again at a superseded
		// lease at its token's end.
		leaveWindow = 5 * time.Second
	)
	ns := fw.Namespace(t, "rollout")
	conn := fw.VaultConnection(t, "vault-rollout", framework.AuthRole(roleBounded), framework.Allow(ns)).Name
	rc := fw.RedisCluster(t, ns, "orders", conn, leasePath, framework.Replicas(2), framework.WithConsumers("app"),
		func(rc *v1beta1.RedisCluster) {
			rc.Spec.Rollout.ReadinessTimeout = &metav1.Duration{Duration: 10 * time.Minute}
			rc.Spec.Credentials.OnRevokedOutside = v1beta1.RevokedOutsideRollOver
		})
	fw.WaitReady(t, rc, readyTimeout)
	app := fw.StartConsumers(t, ns, "app", 1, "orders:6379", "orders-credentials", func(d *appsv1.Deployment) {
		d.Spec.MinReadySeconds = int32(hold.Seconds())
	})

	w := watchLedgers(t, conn, rc)
	r := &rolloutWatch{credentials: map[string]*credentialSeen{}, leases: map[string]*leaseSeen{}}
	start := time.Now()
	var ended int
	framework.ReliabilityRow(t, "rollouts", "Vault tokens of token_ttl 15 s, token_max_ttl 60 s, a rollout held open 150 s by a slow consumer (onRevokedOutside RollOver)",
		"the current lease never dies and its user always logs in everywhere; a superseded lease ending with its token is announced (SupersededLeaseEnding) and leaves the ledger at its end; no consumer command fails",
		func() string {
			ok, _, _ := app.Totals()
			return fmt.Sprintf("%d samples over %s: %d credentials replaced for TokenEnding while the rollout ran, the current lease live and its user accepted on every node at every sample; %d superseded leases ended with their token, each announced before and out of the ledger within %s; %d consumer commands answered, none failed",
				w.samples, watch, r.tokenEndingInRollout, ended, leaveWindow, ok)
		})
	for end := start.Add(watch); time.Now().Before(end); time.Sleep(time.Second) {
		w.sample(leaveWindow)
		r.sample(t, w, rc)
	}
	t.Logf("%d samples over %s; rotations: %s", w.samples, time.Since(start).Round(time.Second), strings.Join(r.rotations(w, rc), "; "))
	ok, failed, failures := app.Totals()
	t.Logf("consumer: %d commands succeeded, %d failed", ok, failed)
	if failed != 0 {
		t.Errorf("%d consumer commands failed (onRevokedOutside RollOver keeps the user of an ended lease until the rollout is done): %s", failed, strings.Join(failures, "; "))
	}

	if r.tokenEndingInRollout == 0 {
		t.Errorf("no credential was replaced for %s while a rollout was in progress: the test does not test the interplay", rotation.ReasonTokenEnding)
	}
	for _, f := range r.failures {
		t.Error(f)
	}
	if ended = r.account(t, w, rc, leaveWindow); ended == 0 {
		t.Errorf("no superseded lease ended with its token: the test does not test how keyroll announces and honours that")
	}
	w.check() // every sample: the ledger's leases live in Vault, the Secret's credential working everywhere
}

// rolloutWatch follows, beside a ledgerWatch, the credentials of one RedisCluster against its
// rollout, and what became of each lease of its ledger.
type rolloutWatch struct {
	credentials map[string]*credentialSeen
	leases      map[string]*leaseSeen
	// tokenEndingInRollout counts the credentials issued for TokenEnding during a rollout.
	tokenEndingInRollout int
	// failures are the samples at which the current credential's lease was not live in Vault.
	failures []string
	// last is when the last sample was taken.
	last time.Time
}

// credentialSeen is what the samples saw of one credential version.
type credentialSeen struct {
	reason              string
	issuedAt, tokenEnds time.Time
	// rolloutStarted is the start of the rollout of an earlier credential that was in progress
	// when this one was issued (a rollout that goes on to a newer credential keeps its start);
	// zero when none was.
	rolloutStarted time.Time
}

// leaseSeen is what the samples saw of one lease while the ledger held it.
type leaseSeen struct {
	user string
	// state is its state at the last sample that found it in the ledger; inRollout whether a
	// rollout was in progress then.
	state     v1beta1.LeaseState
	inRollout bool
	// capped is the first sample that found it renewalCapped.
	capped time.Time
	// vanished is when Vault was first found not to know it while the ledger held it, not being
	// revoked by keyroll (state Revoking); zero when never.
	vanished time.Time
}

// sample reads the RedisCluster once, after the ledgerWatch's sample: what became of each lease
// in its ledger, whether the current credential's lease is live in Vault, and the credential and
// the rollout it was issued during.
func (r *rolloutWatch) sample(t *testing.T, w *ledgerWatch, rc *v1beta1.RedisCluster) {
	cur := fw.Get(t, rc)
	r.last = time.Now()
	ro := cur.Status.Rollout
	for _, l := range cur.Status.Leases {
		s := r.leases[l.LeaseID]
		if s == nil {
			s = &leaseSeen{user: l.Username}
			r.leases[l.LeaseID] = s
		}
		s.state, s.inRollout = l.State, ro != nil
		if l.RenewalCapped && s.capped.IsZero() {
			s.capped = time.Now()
		}
		if life := w.leases[l.LeaseID]; life != nil && !life.missingSince.IsZero() && l.State != v1beta1.LeaseRevoking && s.vanished.IsZero() {
			s.vanished = life.missingSince
		}
	}
	c := cur.Status.Credential
	if c == nil || c.IssuedAt == nil {
		return
	}
	if live, _ := fw.LeaseExists(c.Lease.LeaseID); !live {
		r.failures = append(r.failures, fmt.Sprintf("%s: the current credential's (%s) lease %s is not live in Vault",
			time.Now().Format("15:04:05.000"), c.Version, c.Lease.LeaseID))
	}
	s := r.credentials[c.Version]
	if s == nil {
		s = &credentialSeen{reason: c.RotationReason, issuedAt: c.IssuedAt.Time}
		r.credentials[c.Version] = s
	}
	if c.VaultLease.TokenEndsAt != nil {
		s.tokenEnds = c.VaultLease.TokenEndsAt.Time
	}
	if ro != nil && ro.StartedAt != nil && c.IssuedAt.After(ro.StartedAt.Time) && s.rolloutStarted.IsZero() {
		s.rolloutStarted = ro.StartedAt.Time
		if c.RotationReason == string(rotation.ReasonTokenEnding) {
			r.tokenEndingInRollout++
		}
	}
}

// account checks, against the RedisCluster's events, what became of each lease: every lease that
// left the ledger is named by an event that says why (LeaseRevoked: keyroll revoked it;
// SupersededLeaseEnded: it ended with its token, as announced; none was revoked outside keyroll),
// and every lease that Vault lost while the ledger held it, or that keyroll found gone, ended as
// ended wants. It logs each ended lease and returns how many there were.
func (r *rolloutWatch) account(t *testing.T, w *ledgerWatch, rc *v1beta1.RedisCluster, leaveWindow time.Duration) int {
	t.Helper()
	var events []eventsv1.Event
	// The recorder sends events asynchronously, after the status write that carries their change.
	msg := framework.Poll(15*time.Second, func() string {
		events = fw.ClusterEvents(t, rc.Namespace, rc.Name)
		var unaccounted []string
		for id, life := range w.leases {
			if !life.leftLedger.IsZero() && firstNaming(events, v1beta1.EventLeaseRevoked, id) == nil &&
				firstNaming(events, v1beta1.EventSupersededLeaseEnded, id) == nil {
				unaccounted = append(unaccounted, id)
			}
		}
		if len(unaccounted) > 0 {
			return fmt.Sprintf("leases %q left the ledger, but no %s or %s event names them", unaccounted, v1beta1.EventLeaseRevoked, v1beta1.EventSupersededLeaseEnded)
		}
		return ""
	})
	if msg != "" {
		t.Error(msg)
	}
	t.Logf("events: %s", strings.Join(framework.Reasons(events), ", "))
	ids := make([]string, 0, len(w.leases))
	for id := range w.leases {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, e := range events {
		if e.Reason == v1beta1.EventLeaseRevokedOutside {
			t.Errorf("a %s event, although nobody revoked a lease: a lease that ends with its token is no revocation: %q", e.Reason, e.Note)
		}
		if e.Reason == v1beta1.EventSupersededLeaseEnded && len(framework.Naming([]eventsv1.Event{e}, ids...)) == 0 {
			t.Errorf("a %s event names no lease the samples found in the ledger: %q", e.Reason, e.Note)
		}
	}
	ended := 0
	for _, id := range ids {
		s := r.leases[id]
		if s == nil || firstNaming(events, v1beta1.EventLeaseRevoked, id) != nil ||
			(s.vanished.IsZero() && firstNaming(events, v1beta1.EventSupersededLeaseEnded, id) == nil) {
			continue // keyroll revoked it (the ledger watch saw it no longer than leaveWindow gone), or it lives
		}
		ended++
		r.ended(t, w, events, id, leaveWindow)
	}
	return ended
}

// ended checks one lease that Vault lost while the ledger held it, or that keyroll found gone: it
// was superseded (the current lease never dies), announced before Vault lost it, and out of the
// ledger within leaveWindow after; it logs when it was announced and left, against its token's end.
func (r *rolloutWatch) ended(t *testing.T, w *ledgerWatch, events []eventsv1.Event, id string, leaveWindow time.Duration) {
	t.Helper()
	s, life := r.leases[id], w.leases[id]
	tokenEnds, ok := w.tokenEnds[life.accessor]
	if !ok {
		t.Errorf("lease %s: the end of its token %s was never reported", id, life.accessor)
		return
	}
	if s.state != v1beta1.LeaseSuperseded {
		t.Errorf("lease %s (user %s) ended as %s, not as a superseded lease: the current lease died", id, s.user, s.state)
	}
	// Vault loses a lease with its token (the watch sees it gone a moment later, if keyroll has
	// not taken it out of the ledger by then), or when it is revoked outside keyroll.
	lost, how := credential.Earliest(tokenEnds, s.vanished), "not seen gone from Vault while in the ledger"
	if !s.vanished.IsZero() {
		how = "seen gone from Vault at " + s.vanished.Format(time.TimeOnly)
	}
	announced := s.capped
	if e := firstNaming(events, v1beta1.EventSupersededLeaseEnding, id); e != nil {
		announced = credential.Earliest(announced, e.EventTime.Time)
		if end := tokenEnds.UTC().Format(time.RFC3339); !strings.Contains(e.Note, end) {
			t.Errorf("lease %s: the %s event does not name its token's end %s: %q", id, e.Reason, end, e.Note)
		}
	}
	switch {
	case announced.IsZero():
		t.Errorf("lease %s (user %s) ended at %s (%s) unannounced: never renewalCapped, no %s event names it",
			id, s.user, lost.Format(time.TimeOnly), how, v1beta1.EventSupersededLeaseEnding)
	case !announced.Before(lost):
		t.Errorf("lease %s (user %s) was announced at %s, not before it ended at %s (%s)",
			id, s.user, announced.Format(time.TimeOnly), lost.Format(time.TimeOnly), how)
	}
	left, where := life.leftLedger, "left the ledger"
	if left.IsZero() {
		left, where = r.last, "was still in the ledger at the last sample"
	}
	if left.Sub(lost) > leaveWindow {
		t.Errorf("lease %s (user %s) ended at %s (%s) but %s %s after, more than %s",
			id, s.user, lost.Format(time.TimeOnly), how, where, left.Sub(lost).Round(100*time.Millisecond), leaveWindow)
	}
	ahead := "never announced"
	if !announced.IsZero() {
		ahead = fmt.Sprintf("announced %s before", tokenEnds.Sub(announced).Round(100*time.Millisecond))
	}
	t.Logf("superseded lease %s (user %s, rollout in progress: %t): token ended at %s; %s, %s %s after (%s)",
		id, s.user, s.inRollout, tokenEnds.Format(time.TimeOnly), ahead, where, left.Sub(tokenEnds).Round(100*time.Millisecond), how)
}

// firstNaming is the first event of reason that names id (nil: none).
func firstNaming(events []eventsv1.Event, reason, id string) *eventsv1.Event {
	var first *eventsv1.Event
	for _, e := range framework.Naming(events, id) {
		if e.Reason == reason && (first == nil || e.EventTime.Before(&first.EventTime)) {
			first = &e
		}
	}
	return first
}

// rotations describes each credential after the first: its reason, how long before the end of the
// replaced lease's token it was issued, and the rollout it was issued during.
func (r *rolloutWatch) rotations(w *ledgerWatch, rc *v1beta1.RedisCluster) []string {
	var out []string
	versions := w.versions[rc.Name]
	for i := 1; i < len(versions); i++ {
		c, prev := r.credentials[versions[i]], r.credentials[versions[i-1]]
		if c == nil {
			continue
		}
		s := fmt.Sprintf("%s %s at %s", versions[i], c.reason, c.issuedAt.Format(time.TimeOnly))
		if prev != nil && !prev.tokenEnds.IsZero() {
			s += fmt.Sprintf(", %s before the replaced lease's token ended", prev.tokenEnds.Sub(c.issuedAt).Round(time.Second))
		}
		if !c.rolloutStarted.IsZero() {
			s += ", during the rollout started at " + c.rolloutStarted.Format(time.TimeOnly)
		}
		out = append(out, s)
	}
	return out
}
