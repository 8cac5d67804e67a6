package rotation

import "time"

// Action is what Decide asks the controller to do now.
type Action string

const (
	// ActionNothing: nothing to do before Decision.When.
	ActionNothing Action = "Nothing"
	// ActionIssue: there is no live credential; obtain one.
	ActionIssue Action = "Issue"
	// ActionRenew: renew the current lease.
	ActionRenew Action = "Renew"
	// ActionRotate: issue a new credential, roll it out, then revoke the superseded lease.
	ActionRotate Action = "Rotate"
	// ActionCheck: look the lease up in Vault: it may have been revoked outside keyroll.
	ActionCheck Action = "Check"
)

// Reason says why Decide chose its Action; UpperCamelCase, usable as a condition or event reason.
type Reason string

const (
	// ReasonNoCredential: no credential has been issued (Issue).
	ReasonNoCredential Reason = "NoCredential"
	// ReasonLeaseGone: the lease was revoked outside keyroll or Vault no longer knows it (Issue).
	ReasonLeaseGone Reason = "LeaseGone"
	// ReasonLeaseExpired: the lease's expiry has passed (Issue).
	ReasonLeaseExpired Reason = "LeaseExpired"
	// ReasonRenewalCapped: Vault capped the last renewal (max TTL near), so the lease cannot be
	// extended; it is replaced before it lapses (Rotate).
	ReasonRenewalCapped Reason = "RenewalCapped"
	// ReasonNotRenewable: the lease cannot be renewed and is near its expiry (Rotate).
	ReasonNotRenewable Reason = "NotRenewable"
	// ReasonTokenEnding: the Vault token that created the lease ends for good (its max TTL) before
	// the lease would, and Vault revokes the lease with it: it is replaced in time (Rotate).
	ReasonTokenEnding Reason = "TokenEnding"
	// ReasonLeaseCheckDue: the lease is looked up in Vault, to notice a revocation outside
	// keyroll (Check).
	ReasonLeaseCheckDue Reason = "LeaseCheckDue"
	// ReasonSourceChanged: the cluster's credential source (VaultConnection or Vault path)
	// changed; a credential from the new one replaces the current one (Rotate), paused or not.
	ReasonSourceChanged Reason = "SourceChanged"
	// ReasonRotateNowRequested: the rotate-now annotation holds a value not yet acknowledged (Rotate).
	ReasonRotateNowRequested Reason = "RotateNowRequested"
	// ReasonScheduledRotation: the schedule's activation after the last rotation has come (Rotate).
	ReasonScheduledRotation Reason = "ScheduledRotation"
	// ReasonMissedRotation: as ScheduledRotation, but more than one activation has passed since the
	// last rotation (the operator was down or the rotation was held back); it rotates once (Rotate).
	ReasonMissedRotation Reason = "MissedRotation"
	// ReasonRenewalDue: the lease's renewal time has come (Renew).
	ReasonRenewalDue Reason = "RenewalDue"
	// ReasonPaused: rotations are paused; renewals go on (Nothing).
	ReasonPaused Reason = "Paused"
	// ReasonRolloutInProgress: a rollout runs; no rotation starts before it ends (Nothing).
	ReasonRolloutInProgress Reason = "RolloutInProgress"
	// ReasonOutsideMaintenanceWindow: a scheduled rotation is due but waits for the window (Nothing).
	ReasonOutsideMaintenanceWindow Reason = "OutsideMaintenanceWindow"
	// ReasonNotDelivered: the schedule's activation has come, but the current credential has not
	// reached every Redis node and consumer yet; the rotation waits for the first activation after
	// it has (Nothing).
	ReasonNotDelivered Reason = "NotDelivered"
	// ReasonWaitingForTurn: a rotation asked for or scheduled waits for its turn for Vault
	// (RotationsHeldUntil); renewals go on (Nothing).
	ReasonWaitingForTurn Reason = "WaitingForTurn"
	// ReasonUpToDate: nothing is due (Nothing).
	ReasonUpToDate Reason = "UpToDate"
)

// Input is everything Decide needs, as plain values translated from a RedisCluster and its lease.
type Input struct {
	// Now is the current time, from the controller's clock.
	Now time.Time

	// HasCredential: a credential has been issued and is in use.
	HasCredential bool
	// LeaseGone: the lease is known to be gone (revoked outside keyroll, unknown to Vault).
	LeaseGone bool
	// ExpiresAt is when the lease expires unless renewed; zero when no lease is tracked (then the
	// credential is neither renewed nor replaced for expiry, only rotated on schedule or request).
	ExpiresAt time.Time
	// Renewable says whether Vault allows renewing the lease.
	Renewable bool
	// IssuedAt is when the lease was issued.
	IssuedAt time.Time
	// RenewedAt is when the lease was issued or last renewed.
	RenewedAt time.Time
	// LeaseDuration is the TTL Vault granted at RenewedAt (capped by ExpiresAt-RenewedAt when both
	// are known).
	LeaseDuration time.Duration
	// RenewalCapped: the last renewal granted less than it asked for, so the lease has reached its
	// max TTL and further renewals cannot extend it.
	RenewalCapped bool
	// CappedTTL is the TTL the capped renewal left.
	CappedTTL time.Duration
	// MinTTL: a renewal leaving less than this is not enough; a new credential is issued instead.
	MinTTL time.Duration
	// RenewalPercent and RenewalKey place the renewal; see NextRenewal.
	RenewalPercent int32
	RenewalKey     string
	// TokenEndsAt is when the Vault token that created the lease ends for good; zero when it has
	// no known end (a periodic token, or one whose max TTL has not shown yet).
	TokenEndsAt time.Time
	// NextLeaseCheck is when the lease is next looked up in Vault; zero for none.
	NextLeaseCheck time.Time

	// Schedule is the rotation schedule; nil for none.
	Schedule Schedule
	// LastRotation is when the credential was last rotated or first issued.
	LastRotation time.Time
	// DeliveredAt is when the current credential had reached every Redis node and the consumers'
	// Secret, and every consumer had rolled out onto it; zero while it has not. Scheduled rotations
	// count from it (see Decide).
	DeliveredAt time.Time
	// Paused stops scheduled and requested rotations; renewals go on.
	Paused bool
	// RotateNow is the value of the rotate-now annotation, RotateNowAcknowledged the last value
	// acted upon; a rotation is requested when RotateNow is set and differs from it.
	RotateNow             string
	RotateNowAcknowledged string
	// Window, when set, holds scheduled rotations until it is open.
	Window *Window
	// RolloutInProgress: a credential is being rolled out; no rotation starts until it is done.
	RolloutInProgress bool
	// SourceChanged: the owner pointed the cluster at another source (a VaultConnection or a
	// Vault path other than the one the current lease came from); a credential from it is due.
	SourceChanged bool
	// RotationsHeldUntil holds the rotations that may wait (Decision.Deferrable) until then: their
	// turn for Vault, whose rate the namespaces share, has not come. Whatever else is due (a
	// renewal, a lookup, a replacement that saves the lease) goes on meanwhile.
	RotationsHeldUntil time.Time
}

// Decision is what the controller should do and when to look again.
type Decision struct {
	// Action to take now.
	Action Action
	// Reason for the Action.
	Reason Reason
	// When is Now for an action. For ActionNothing it is the earliest later time at which the
	// decision can change (renewal, replacement, scheduled rotation, window opening, lease expiry),
	// for RequeueAfter; zero when no timed work is pending.
	When time.Time
	// NextRenewal is when the lease is next renewed; zero when it is not renewed.
	NextRenewal time.Time
	// NextRotation is when the next scheduled rotation falls due (possibly past, while held back);
	// zero without a schedule.
	NextRotation time.Time
	// AcknowledgeRotateNow: the Action issues a new credential while a rotate-now request is
	// pending, so it satisfies the request; the controller records RotateNow as acknowledged.
	AcknowledgeRotateNow bool
}

// Decide decides what a RedisCluster's credential needs, as a pure function of in. Rules, first
// match wins:
//
//  1. No credential, lease gone or lease expired: Issue. Always, even when paused or rolling out.
//  2. Renewal capped with less than MinTTL left: Rotate now. Capped with more left, or a lease that
//     is not renewable: Rotate at the jittered renewal point, or MinTTL before expiry if earlier
//     (never in the first tenth of the lease, so a MinTTL as long as the lease cannot loop). A
//     lease whose token ends first (TokenEndsAt) is replaced the same way, with the token's end as
//     its expiry, counted from the lease's issue.
//     These replacements happen even when paused, outside the maintenance window and during a
//     rollout (which then rolls to the replacement; the lease it replaces is kept alive until
//     the rollout is done): the alternative is a credential that lapses.
//  3. A rollout in progress: no other rotation starts (renewals go on). Otherwise a changed
//     source (VaultConnection or path): Rotate now, even when paused.
//  4. Paused: no scheduled or requested rotation.
//  5. Rotate-now requested: Rotate, maintenance window or not.
//     Like the scheduled rotation below, it waits while RotationsHeldUntil is to come.
//  6. Scheduled rotation due (NextRotation at or before Now): Rotate once, however many
//     activations were missed; outside the maintenance window it waits for the window to open.
//     The schedule counts from the later of LastRotation and DeliveredAt, and waits while the
//     credential is not delivered: a credential is in use for at least one activation of the
//     schedule before it is replaced. Rotating the moment a delivery ends because an activation
//     fell while it went on (a one-minute schedule and a credential issued seconds before the
//     minute; a rollout longer than the schedule's period) would replace a credential no one had
//     used yet, and cost Vault an issue and every consumer a restart for nothing; waiting for the
//     next activation keeps the schedule's rhythm, and a credential delivered long ago (the
//     operator was down) is still rotated at once.
//  7. Renewable lease past its NextRenewal: Renew.
//  8. Lease past its NextLeaseCheck: Check.
//  9. Otherwise Nothing until When.
func Decide(in Input) Decision {
	if reason, ok := issueReason(in); ok {
		return Decision{Action: ActionIssue, Reason: reason, When: in.Now, AcknowledgeRotateNow: rotateNowPending(in)}
	}
	p := makePlan(in)
	d := Decision{NextRenewal: p.renewal, NextRotation: p.rotation}
	rot := decideRotation(in, p)
	switch {
	case rot.rotate:
		d.Action, d.Reason, d.When = ActionRotate, rot.reason, in.Now
		d.AcknowledgeRotateNow = rotateNowPending(in)
	case due(p.renewal, in.Now):
		d.Action, d.Reason, d.When = ActionRenew, ReasonRenewalDue, in.Now
	case due(in.NextLeaseCheck, in.Now) && !in.ExpiresAt.IsZero():
		d.Action, d.Reason, d.When = ActionCheck, ReasonLeaseCheckDue, in.Now
	default:
		rotation := p.rotation
		if in.Paused {
			rotation = time.Time{}
		}
		d.Action, d.Reason = ActionNothing, rot.reason
		d.When = earliestAfter(in.Now, p.renewal, p.replace, p.tokenReplace, rotation, rot.until, in.ExpiresAt, in.NextLeaseCheck)
	}
	return d
}

// issueReason says why a new credential must be issued regardless of anything else, if it must.
func issueReason(in Input) (Reason, bool) {
	switch {
	case !in.HasCredential:
		return ReasonNoCredential, true
	case in.LeaseGone:
		return ReasonLeaseGone, true
	case due(in.ExpiresAt, in.Now):
		return ReasonLeaseExpired, true
	}
	return "", false
}

// plan holds the times Decide weighs.
type plan struct {
	renewal      time.Time // next renewal; zero when the lease is not renewed
	replace      time.Time // when a lease that cannot be extended is replaced; zero when not needed
	tokenReplace time.Time // when a lease whose token ends first is replaced; zero when not needed
	rotation     time.Time // next scheduled rotation; zero without a schedule
}

// makePlan computes the next renewal, replacement and scheduled rotation.
func makePlan(in Input) plan {
	p := plan{rotation: NextRotation(in.Schedule, rotationBasis(in)), tokenReplace: tokenReplacement(in)}
	term := leaseTerm(in)
	if term <= 0 || in.ExpiresAt.IsZero() {
		return p
	}
	at := NextRenewal(in.RenewedAt, term, in.RenewalPercent, in.RenewalKey)
	if in.Renewable && !in.RenewalCapped {
		p.renewal = at
		return p
	}
	if byMinTTL := in.ExpiresAt.Add(-in.MinTTL); byMinTTL.Before(at) {
		at = byMinTTL
	}
	if floor := in.RenewedAt.Add(term / 10); at.Before(floor) {
		at = floor
	}
	p.replace = at
	return p
}

// rotationBasis is the time the schedule's next activation is counted from: the later of the last
// rotation and the credential's delivery, or, while it is not delivered, now at the earliest (the
// first activation after its delivery cannot come sooner than the next one from now).
func rotationBasis(in Input) time.Time {
	if in.LastRotation.IsZero() {
		return time.Time{}
	}
	at := in.DeliveredAt
	if at.IsZero() {
		at = in.Now
	}
	if at.Before(in.LastRotation) {
		return in.LastRotation
	}
	return at
}

// tokenReplacement is when a lease that would outlive the token that created it is replaced: at
// the jittered renewal point of the span from its issue to the token's end, or MinTTL (at most a
// third of the span) before that end if earlier, never in the first tenth of the span. Zero when the token has no known end, or
// the lease expires first anyway.
func tokenReplacement(in Input) time.Time {
	end := in.TokenEndsAt
	if end.IsZero() || in.IssuedAt.IsZero() || !end.After(in.IssuedAt) {
		return time.Time{}
	}
	if !in.ExpiresAt.IsZero() && !in.ExpiresAt.After(end) && (!in.Renewable || in.RenewalCapped) {
		return time.Time{} // the lease ends first; its own replacement covers it
	}
	span := end.Sub(in.IssuedAt)
	at := NextRenewal(in.IssuedAt, span, in.RenewalPercent, in.RenewalKey)
	// MinTTL before the end, but never more than a third of the span: a token that lives a minute
	// with the default minTTL of a minute would otherwise have its leases replaced at once, again
	// and again.
	if byMinTTL := end.Add(-min(in.MinTTL, span/3)); byMinTTL.Before(at) {
		at = byMinTTL
	}
	if floor := in.IssuedAt.Add(span / 10); at.Before(floor) {
		at = floor
	}
	return at
}

// leaseTerm is the lease's duration as of RenewedAt: the capped TTL after a capped renewal, and
// never more than is left until ExpiresAt.
func leaseTerm(in Input) time.Duration {
	d := in.LeaseDuration
	if in.RenewalCapped && in.CappedTTL > 0 {
		d = in.CappedTTL
	}
	if in.ExpiresAt.IsZero() || in.RenewedAt.IsZero() {
		return d
	}
	if left := in.ExpiresAt.Sub(in.RenewedAt); left > 0 && (d <= 0 || left < d) {
		d = left
	}
	return d
}

// rotationOutcome is whether a rotation starts now, and why (or why not).
type rotationOutcome struct {
	rotate bool
	reason Reason    // why it rotates, or why nothing happens
	until  time.Time // when a held-back scheduled rotation may go ahead
}

// decideRotation applies rules 2 to 6 of Decide.
func decideRotation(in Input, p plan) rotationOutcome {
	switch {
	case in.RenewalCapped && in.CappedTTL < in.MinTTL, in.RenewalCapped && due(p.replace, in.Now):
		return rotationOutcome{rotate: true, reason: ReasonRenewalCapped}
	case due(p.replace, in.Now):
		return rotationOutcome{rotate: true, reason: ReasonNotRenewable}
	case due(p.tokenReplace, in.Now):
		return rotationOutcome{rotate: true, reason: ReasonTokenEnding}
	case in.RolloutInProgress:
		return rotationOutcome{reason: ReasonRolloutInProgress}
	case in.SourceChanged:
		return rotationOutcome{rotate: true, reason: ReasonSourceChanged}
	case in.Paused:
		return rotationOutcome{reason: ReasonPaused}
	case rotateNowPending(in):
		return heldBack(in, ReasonRotateNowRequested)
	case in.DeliveredAt.IsZero() && due(NextRotation(in.Schedule, in.LastRotation), in.Now):
		return rotationOutcome{reason: ReasonNotDelivered}
	case !due(p.rotation, in.Now):
		return rotationOutcome{reason: ReasonUpToDate}
	case in.Window != nil && !in.Window.Contains(in.Now):
		return rotationOutcome{reason: ReasonOutsideMaintenanceWindow, until: in.Window.NextOpen(in.Now)}
	}
	reason := ReasonScheduledRotation
	if due(in.Schedule.Next(p.rotation), in.Now) {
		reason = ReasonMissedRotation
	}
	return heldBack(in, reason)
}

// heldBack is a rotation for reason, one that may wait, unless RotationsHeldUntil holds it back.
func heldBack(in Input, reason Reason) rotationOutcome {
	if in.RotationsHeldUntil.After(in.Now) {
		return rotationOutcome{reason: ReasonWaitingForTurn, until: in.RotationsHeldUntil}
	}
	return rotationOutcome{rotate: true, reason: reason}
}

// Deferrable says whether the decision replaces a credential that stays good meanwhile: a rotation
// asked for (rotate-now) or scheduled. Such a rotation may wait its turn for Vault (a share of the
// connection's rate) without harm; an issue for a missing, gone or ending credential, a
// replacement that saves a lease, and one for a changed source (the old one may be on its way
// out) may not.
func (d Decision) Deferrable() bool {
	if d.Action != ActionRotate {
		return false
	}
	switch d.Reason {
	case ReasonRotateNowRequested, ReasonScheduledRotation, ReasonMissedRotation:
		return true
	}
	return false
}

// rotateNowPending reports whether the rotate-now annotation asks for a rotation not yet acted on.
func rotateNowPending(in Input) bool {
	return in.RotateNow != "" && in.RotateNow != in.RotateNowAcknowledged
}

// due reports whether t is set and has come.
func due(t, now time.Time) bool {
	return !t.IsZero() && !now.Before(t)
}

// earliestAfter returns the earliest of times strictly after now, or zero if there is none.
func earliestAfter(now time.Time, times ...time.Time) time.Time {
	var earliest time.Time
	for _, t := range times {
		if t.After(now) && (earliest.IsZero() || t.Before(earliest)) {
			earliest = t
		}
	}
	return earliest
}
