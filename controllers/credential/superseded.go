package credential

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/vault"
)

// KeepSuperseded keeps the superseded leases alive that the rollout still needs: consumers not
// yet restarted log in with their credentials until the rollout ends, and then they are revoked.
// Each is renewed at percent of its term (from its last renewal, or its issue, to its expiry),
// through the connection it came through, for as long again. A lease Vault cannot extend any
// further (its max TTL) is marked renewalCapped, with a Warning event that says by when the
// rollout must be done; a lease Vault no longer knows, or past its expiry, was revoked outside
// keyroll (or ended) and is honoured as onRevokedOutside says. It returns when the next renewal is due (zero: none).
func (l *Ledger) KeepSuperseded(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, percent int32) (time.Time, error) {
	now := l.Clock.Now()
	var next time.Time
	var errs []error
	defer l.retainChecks(cl)
	for _, rec := range slices.Clone(cl.RC.Status.Leases) {
		if rec.State != v1beta1.LeaseSuperseded {
			continue
		}
		ends := l.supersededEnd(ctx, cl, vcl, rec)
		if !ends.IsZero() && !now.Before(ends) {
			l.supersededEnded(ctx, cl, rec) // Vault has let it go, or does with its token
			continue
		}
		next = Earliest(next, ends)
		check, gone, err := l.checkSuperseded(ctx, cl, vcl, rec, now)
		if errs = append(errs, err); gone {
			continue
		}
		next = Earliest(next, check)
		rec, _ = cl.Lease(rec.LeaseID) // as supersededEnd left it
		from, end, ok := renewalSpan(rec)
		if !ok {
			continue
		}
		due := from.Add(time.Duration(float64(end.Sub(from)) * float64(percent) / 100))
		if now.Before(due) {
			next = Earliest(next, due)
			continue
		}
		renewed, err := l.renewSuperseded(ctx, cl, vcl, rec, end.Sub(from))
		errs = append(errs, err)
		if f, e, ok := renewalSpan(renewed); ok && err == nil {
			next = Earliest(next, f.Add(time.Duration(float64(e.Sub(f))*float64(percent)/100)))
		}
	}
	return next, errors.Join(errs...)
}

// checkSuperseded looks a superseded lease up in Vault when its lease check is due, as the current
// lease's is, so that one revoked outside keyroll is noticed within about --lease-check-interval,
// not at its next renewal. gone says it left the ledger; check is when it is next due.
func (l *Ledger) checkSuperseded(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, rec v1beta1.LeaseRecord, now time.Time) (check time.Time, gone bool, err error) {
	key := client.ObjectKeyFromObject(cl.RC)
	confirmed := status.Of(rec.LastRenewal)
	if confirmed.IsZero() {
		confirmed = status.Of(rec.IssuedAt)
	}
	if due := l.Checks.Next(key, rec.LeaseID, confirmed); due.IsZero() || now.Before(due) {
		return due, false, nil
	}
	lvcl, err := l.ClientFor(ctx, cl, vcl, rec)
	if errors.Is(err, ErrNoConnection) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	gone, disowned, err := l.lookUp(ctx, cl, lvcl, rec.LeaseID)
	if err != nil || gone {
		if gone && !disowned {
			l.supersededGone(ctx, cl, rec)
		}
		return time.Time{}, gone, err
	}
	return l.Checks.Next(key, rec.LeaseID, confirmed), false, nil
}

// retainChecks forgets the lease checks of leases that are no longer live in the ledger.
func (l *Ledger) retainChecks(cl *Cluster) {
	var live []string
	for _, rec := range cl.RC.Status.Leases {
		if rec.State != v1beta1.LeaseRevoking {
			live = append(live, rec.LeaseID)
		}
	}
	l.Checks.Retain(client.ObjectKeyFromObject(cl.RC), live)
}

// supersededEnd is when a superseded lease ends at the latest: its expiry, or the end of the Vault
// token that created it when that comes first (Vault revokes a lease with its token, and no
// renewal saves it). The first time the token's end is found to come first, the lease is marked
// renewalCapped and a Warning event says by when the rollout must be done.
func (l *Ledger) supersededEnd(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, rec v1beta1.LeaseRecord) time.Time {
	expiry := status.Of(rec.ExpiresAt)
	if rec.TokenAccessor == "" {
		return expiry
	}
	lvcl, err := l.ClientFor(ctx, cl, vcl, rec)
	if err != nil {
		return expiry
	}
	t, ok := lvcl.Token(rec.TokenAccessor)
	if !ok || t.EndsAt.IsZero() || (!expiry.IsZero() && !t.EndsAt.Before(expiry)) {
		return expiry
	}
	for i := range cl.RC.Status.Leases {
		if r := &cl.RC.Status.Leases[i]; r.LeaseID == rec.LeaseID && !r.RenewalCapped {
			r.RenewalCapped = true
			cl.Conds.Announce(true, v1beta1.EventSupersededLeaseEnding, "Renew",
				"Superseded lease %s (user %s) ends at %s with the Vault token that created it (its max TTL): the rollout must be done by then; after it, its user is treated as onRevokedOutside says",
				rec.LeaseID, rec.Username, t.EndsAt.UTC().Format(time.RFC3339))
		}
	}
	return t.EndsAt
}

// renewalSpan is the span of a superseded lease's current term: from its last renewal (or issue)
// to its expiry; ok false for a lease that is not renewed (current, being revoked, capped, or
// without the times).
func renewalSpan(rec v1beta1.LeaseRecord) (from, end time.Time, ok bool) {
	if rec.State != v1beta1.LeaseSuperseded || rec.RenewalCapped || rec.ExpiresAt == nil {
		return time.Time{}, time.Time{}, false
	}
	from, end = status.Of(rec.LastRenewal), rec.ExpiresAt.Time
	if from.IsZero() {
		from = status.Of(rec.IssuedAt)
	}
	return from, end, !from.IsZero() && end.After(from)
}

// renewSuperseded renews one superseded lease by term and records the outcome in the ledger; it
// returns the record as it is now (zero when the lease left the ledger).
func (l *Ledger) renewSuperseded(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, rec v1beta1.LeaseRecord, term time.Duration) (v1beta1.LeaseRecord, error) {
	lvcl, err := l.ClientFor(ctx, cl, vcl, rec)
	if errors.Is(err, ErrNoConnection) {
		return rec, nil // recorded before leases carried their connection: it lives until its TTL
	}
	if err != nil {
		return rec, err
	}
	ren, err := lvcl.Renew(ctx, rec.LeaseID, term)
	l.Metrics.Renewals.WithLabelValues(metrics.Result(err)).Inc()
	switch {
	case vault.IsLeaseGone(err):
		l.supersededGone(ctx, cl, rec)
		return v1beta1.LeaseRecord{}, nil
	case vault.IsRefused(err):
		l.disown(ctx, cl, rec.LeaseID, err)
		return v1beta1.LeaseRecord{}, nil
	case err != nil:
		return rec, fmt.Errorf("renewing superseded lease %s: %w", rec.LeaseID, err)
	}
	l.Checks.Checked(client.ObjectKeyFromObject(cl.RC), rec.LeaseID, l.Clock.Now())
	for i := range cl.RC.Status.Leases {
		r := &cl.RC.Status.Leases[i]
		if r.LeaseID != rec.LeaseID {
			continue
		}
		r.LastRenewal, r.ExpiresAt = status.At(l.Clock.Now()), status.At(ren.ExpiresAt)
		if ren.Capped || !ren.Renewable {
			r.RenewalCapped = true
			cl.Conds.Announce(true, v1beta1.EventSupersededLeaseEnding, "Renew",
				"Superseded lease %s (user %s) cannot be renewed past %s (its max TTL): the rollout must be done by then, or the consumers not yet restarted lose that credential when Vault ends the lease",
				rec.LeaseID, rec.Username, ren.ExpiresAt.UTC().Format(time.RFC3339))
		}
		rec = *r
	}
	log.FromContext(ctx).V(1).Info("Superseded lease renewed", "lease", rec.LeaseID, "granted", ren.Duration, "capped", ren.Capped)
	return rec, nil
}

// supersededGone honours a superseded lease that Vault no longer knows (revoked outside keyroll):
// it leaves the ledger, and its user leaves the Redis nodes at once (onRevokedOutside CutOff, the
// default) or when the rollout is done (RollOver).
func (l *Ledger) supersededGone(ctx context.Context, cl *Cluster, rec v1beta1.LeaseRecord) {
	l.Metrics.RevokedOutside.Inc()
	l.supersededOut(ctx, cl, rec, v1beta1.EventLeaseRevokedOutside, "is gone from Vault (revoked outside keyroll)")
}

// supersededEnded honours, as supersededGone does, a superseded lease that reached its end (its
// expiry, or its token's end) before the rollout was done, as announced. Nobody revoked it: it is
// not counted as revoked outside keyroll.
func (l *Ledger) supersededEnded(ctx context.Context, cl *Cluster, rec v1beta1.LeaseRecord) {
	l.supersededOut(ctx, cl, rec, v1beta1.EventSupersededLeaseEnded,
		"has ended (its max TTL, or the end of the Vault token that created it) before the rollout was done")
}

// supersededOut takes a superseded lease out of the ledger and treats its user as
// onRevokedOutside says, with a Warning event of reason that says why (what happened).
func (l *Ledger) supersededOut(ctx context.Context, cl *Cluster, rec v1beta1.LeaseRecord, reason, what string) {
	rc := cl.RC
	rc.Status.Leases = Remove(rc.Status.Leases, rec.LeaseID)
	user := "its user is cut off on every Redis node (onRevokedOutside CutOff)"
	if !HonourGone(rc, rec.Username) {
		user = "its user stays on the Redis nodes until the rollout is done (onRevokedOutside RollOver)"
	}
	cl.Conds.Announce(true, reason, "Renew", "Superseded lease %s of user %s %s: %s", rec.LeaseID, rec.Username, what, user)
	log.FromContext(ctx).Info("Superseded lease out of the ledger", "lease", rec.LeaseID, "username", rec.Username, "reason", reason)
}

// Earliest is the earlier of two times, zero standing for none.
func Earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
