package credential

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/controllers/stoppoint"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault"
)

// credential lets rotation.Decide say what the credential needs, and does it (issue, renew, look
// the lease up), until nothing more is due: each decision is Decide's alone, on the state the
// previous step left. A lease found gone was revoked outside keyroll (its token is kept alive, so
// it did not die with it): it is honoured and replaced at once. It returns the live credential
// and when to look again.
func (r *Issuer) Credential(ctx context.Context, cl *Cluster, vcl vault.LeaseClient) (*render.Credential, time.Duration, error) {
	cur, err := r.currentCredential(ctx, cl.RC)
	if err != nil {
		return nil, 0, err
	}
	gone := false
	var held time.Time // deferrable rotations wait until then for their turn (rotationTurn)
	for range MaxSteps {
		// The current lease is renewed and looked up through the connection it came from; a
		// credential from another source than the spec's is replaced (issued through vcl).
		lvcl, changed, err := r.leaseClient(ctx, cl, vcl)
		if err != nil {
			return nil, 0, err
		}
		in := r.Ledger.Input(cl, lvcl, cur != nil, gone)
		in.SourceChanged, in.RotationsHeldUntil = changed, held
		d := rotation.Decide(in)
		switch d.Action {
		case rotation.ActionNothing:
			return r.upToDate(ctx, cl, vcl, cur, in, d)
		case rotation.ActionRenew:
			gone, err = r.Ledger.Renew(ctx, cl, lvcl)
		case rotation.ActionCheck:
			gone, err = r.Ledger.Check(ctx, cl, lvcl)
		case rotation.ActionIssue, rotation.ActionRotate:
			if len(cl.RC.Status.Leases) >= MaxLeases && d.Reason != rotation.ReasonLeaseGone {
				// No room for another lease: the current credential (if any) goes on, and the
				// revocations that make room are retried.
				r.ledgerFull(cl)
				return cur, time.Minute, nil
			}
			if wait := r.rotationTurn(ctx, cl, vcl, d); wait > 0 {
				// Not its turn at the connection yet: decided again with the rotation held back,
				// so that a renewal or lookup due meanwhile still goes ahead, and the credential
				// in use goes on (a rotate-now request stays unacknowledged until the turn).
				held = r.Clock.Now().Add(wait)
				continue
			}
			if d.Reason == rotation.ReasonLeaseGone {
				err = r.revokedOutside(ctx, cl)
			}
			if err == nil {
				r.tokenEnding(cl, d)
				cur, err = r.issue(ctx, cl, vcl, d)
			}
			if err == nil && cur == nil {
				return nil, 0, nil // refused: the condition says why
			}
			gone = false
		}
		var later *retryLater
		if errors.As(err, &later) {
			r.Ledger.Due(cl, r.Clock.Now().Add(later.after))
			return nil, later.after, nil
		}
		if err != nil {
			return nil, 0, err
		}
	}
	r.Ledger.Due(cl, r.Clock.Now().Add(time.Second))
	return cur, time.Second, nil // more is due: look again in a moment
}

// upToDate ends the steps when nothing more is due now: it records the plan (the next renewal and
// rotation), keeps the superseded leases alive, and says when to look again.
func (r *Issuer) upToDate(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, cur *render.Credential, in rotation.Input, d rotation.Decision) (*render.Credential, time.Duration, error) {
	r.Ledger.Planned(cl, d)
	r.ledgerHasRoom(cl)
	credentialsReady(cl)
	keep, err := r.Ledger.KeepSuperseded(ctx, cl, vcl, in.RenewalPercent)
	r.Ledger.Due(cl, keep)
	return cur, status.RequeueAfter(r.Clock.Now(), Earliest(d.When, keep)), err
}

// turnTaker is a Vault client that rations the rotations which may wait, per namespace, within its
// VaultConnection's rate (connection.Connector.ClientFor's clients).
type turnTaker interface {
	RotationTurn(cluster string) time.Duration
}

// rotationTurn says how long d, when it is a rotation that may wait (rotation.Decision.Deferrable),
// waits for its turn at the VaultConnection: so that one namespace's rotate-now requests cannot
// take the rate other namespaces' renewals need. Zero: it goes ahead now.
func (r *Issuer) rotationTurn(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, d rotation.Decision) time.Duration {
	t, ok := vcl.(turnTaker)
	if !ok || !d.Deferrable() {
		return 0
	}
	wait := t.RotationTurn(cl.RC.Name)
	if wait > 0 {
		log.FromContext(ctx).V(1).Info("Rotation waits for its turn within the VaultConnection's rate", "reason", string(d.Reason), "wait", wait)
	}
	return wait
}

// ledgerFull reports that no new lease fits in the ledger (status.leases could not be written
// with one more): keyroll issues none rather than lose track of it.
func (r *Issuer) ledgerFull(cl *Cluster) {
	msg := fmt.Sprintf("The ledger holds %d leases, the most it can (status.leases): no new credential is issued until superseded leases are revoked (see LeasesRevoked)", len(cl.RC.Status.Leases))
	if cl.Conds.Set(v1beta1.ConditionSourceHealthy, metav1.ConditionFalse, v1beta1.ReasonLedgerFull, msg) {
		cl.Conds.Announce(true, v1beta1.ReasonLedgerFull, "Issue", "%s", msg)
	}
}

// ledgerHasRoom withdraws a LedgerFull report once the ledger has room again.
func (r *Issuer) ledgerHasRoom(cl *Cluster) {
	if c := meta.FindStatusCondition(cl.RC.Status.Conditions, v1beta1.ConditionSourceHealthy); c != nil && c.Reason == v1beta1.ReasonLedgerFull &&
		len(cl.RC.Status.Leases) < MaxLeases {
		cl.Conds.Set(v1beta1.ConditionSourceHealthy, metav1.ConditionTrue, v1beta1.ReasonAvailable, "The ledger has room for new leases again")
	}
}

// leaseClient is the client of the VaultConnection the current lease came through (vcl, the
// spec's, unless the owner changed connectionRef since), and whether the current credential came
// from another source than the spec names now (connection or path).
func (r *Issuer) leaseClient(ctx context.Context, cl *Cluster, vcl vault.LeaseClient) (vault.LeaseClient, bool, error) {
	c := cl.RC.Status.Credential
	lvcl, moved, err := r.Ledger.CurrentClient(ctx, cl, vcl)
	return lvcl, moved || (c != nil && c.VaultLease.Path != "" && c.VaultLease.Path != cl.RC.Spec.Credentials.VaultLease.Path), err
}

// revokedOutside honours a live lease that was revoked outside keyroll (an administrator's `vault
// lease revoke`, incident response): the lease leaves the ledger, a Warning event and the metric
// say so, and, with onRevokedOutside CutOff (the default), its user is to leave every node at
// once (status.retiringUsers), ahead of the new credential; with RollOver the user stays there
// until the new credential has rolled out. The caller issues a
// new credential next, ahead of any other work.
func (r *Issuer) revokedOutside(ctx context.Context, cl *Cluster) error {
	rc := cl.RC
	c := rc.Status.Credential
	r.Metrics.RevokedOutside.Inc()
	rc.Status.Leases = Remove(rc.Status.Leases, c.Lease.LeaseID)
	if !HonourGone(rc, c.Username) {
		cl.Conds.Announce(true, v1beta1.EventLeaseRevokedOutside, "Revoke",
			"Lease %s of user %s was revoked outside keyroll; issuing a new credential at once (onRevokedOutside RollOver: the user stays on the Redis nodes until the new credential has rolled out)", c.Lease.LeaseID, c.Username)
		log.FromContext(ctx).Info("Lease revoked outside keyroll; rolling over", "lease", c.Lease.LeaseID, "username", c.Username)
		return nil
	}
	cl.Conds.Announce(true, v1beta1.EventLeaseRevokedOutside, "Revoke",
		"Lease %s of user %s was revoked outside keyroll; the user is cut off on every Redis node and a new credential is issued at once (onRevokedOutside CutOff)", c.Lease.LeaseID, c.Username)
	log.FromContext(ctx).Info("Lease revoked outside keyroll; cutting its user off", "lease", c.Lease.LeaseID, "username", c.Username)
	return nil
}

// tokenEnding says, in an event, that a credential is rotated because the token that created its
// lease ends before it.
func (r *Issuer) tokenEnding(cl *Cluster, d rotation.Decision) {
	if d.Reason != rotation.ReasonTokenEnding {
		return
	}
	c := cl.RC.Status.Credential
	cl.Conds.Event(true, v1beta1.EventTokenEnding, "Rotate",
		"The Vault token that created lease %s ends at %s (its max TTL), before the lease: rotating now, so that the new credential is rolled out and this lease revoked before Vault revokes it with its token. A periodic token on the auth role avoids this (see the VaultConnection's Degraded condition)",
		c.Lease.LeaseID, status.Of(c.VaultLease.TokenEndsAt).UTC().Format(time.RFC3339))
}

// currentCredential reads the credential of status.credential from the state Secret, where it is
// kept from its issue on. It returns nil when the Secret does not hold that credential (then a
// new one is issued).
func (r *Issuer) currentCredential(ctx context.Context, rc *v1beta1.RedisCluster) (*render.Credential, error) {
	c := rc.Status.Credential
	if c == nil || c.Version == "" {
		return nil, nil
	}
	key := client.ObjectKey{Namespace: rc.Namespace, Name: render.StateSecretName(rc)}
	cred, err := r.readCredential(ctx, r.Client, key, rc, c.Version)
	if err == nil && cred == nil {
		// The cache may lag behind the Secret written a moment ago: ask the API server before
		// concluding that the credential is lost.
		cred, err = r.readCredential(ctx, r.APIReader, key, rc, c.Version)
	}
	return cred, err
}

func (r *Issuer) readCredential(ctx context.Context, rd client.Reader, key client.ObjectKey, rc *v1beta1.RedisCluster, version string) (*render.Credential, error) {
	sec := &corev1.Secret{}
	if err := rd.Get(ctx, key, sec); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if !apply.OwnedBy(sec, rc) {
		return nil, nil
	}
	u, p := string(sec.Data[render.StateUsernameKey]), string(sec.Data[render.StatePasswordKey])
	if u == "" || p == "" || render.CredentialVersion(u, p) != version {
		return nil, nil
	}
	return &render.Credential{Username: u, Password: p, Version: version}, nil
}

// issue obtains a new credential and records its lease in the ledger before anything uses it.
// The lease it replaces stays in the ledger as Superseded until it is revoked.
func (r *Issuer) issue(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, d rotation.Decision) (*render.Credential, error) {
	rc := cl.RC
	path := rc.Spec.Credentials.VaultLease.Path
	if stale, err := apply.Stale(ctx, r.APIReader, rc); err != nil || stale {
		// A reconcile that started from a lagging cache may see an issuance due that an earlier
		// one has already made (and recorded): look again from the newer version instead.
		log.FromContext(ctx).V(1).Info("The cached RedisCluster is older than the API server's; issuing from the newer one", "error", err)
		return nil, &retryLater{after: time.Second}
	}
	intent, err := r.recordIntent(ctx, rc, path)
	if err != nil {
		return nil, err
	}
	lease, err := vcl.Issue(ctx, path)
	r.countIssue(d, err)
	if err != nil {
		r.dropIntent(ctx, rc, intent)
		return nil, r.issueFailed(cl, err)
	}
	u, p := lease.Data["username"], lease.Data["password"]
	if u == "" || p == "" || !render.ValidUsername(u) {
		if lease.ID == "" || vcl.Revoke(ctx, lease.ID) == nil {
			r.dropIntent(ctx, rc, intent)
		}
		return nil, r.issueFailed(cl, fmt.Errorf("vault path %s returned no usable username and password (keys: %v)", path, lease.Data))
	}
	cred := &render.Credential{Username: u, Password: p, Version: render.CredentialVersion(u, p)}
	stoppoint.Reached(stoppoint.AfterIssue, rc.Namespace)
	r.recordLease(cl, lease, cred, d)
	credentialsReady(cl) // with the ledger write: the lease is live from then on
	if err := cl.Persist(ctx); err != nil {
		// Not recorded, so never used: give it back at once (the intent stays while it may live).
		if vcl.Revoke(ctx, lease.ID) == nil {
			r.dropIntent(ctx, rc, intent)
		}
		return nil, fmt.Errorf("recording lease in the ledger: %w", err)
	}
	r.dropIntent(ctx, rc, intent)
	stoppoint.Reached(stoppoint.AfterLedgerWrite, rc.Namespace)
	cl.Conds.Event(false, v1beta1.EventCredentialsIssued, "Issue", "Issued credential %s for user %s from %s (%s)", cred.Version, u, path, d.Reason)
	log.FromContext(ctx).Info("Credential issued", "version", cred.Version, "username", u, "reason", string(d.Reason), "leaseDuration", lease.Duration)
	return cred, nil
}

// recordIntent records that a credential is about to be issued from path (Intents); "" without
// Intents. Nothing is issued when the record cannot be written.
func (r *Issuer) recordIntent(ctx context.Context, rc *v1beta1.RedisCluster, path string) (string, error) {
	if r.Intents == nil {
		return "", nil
	}
	id, err := r.Intents.Record(ctx, rc.VaultConnectionName(), path, client.ObjectKeyFromObject(rc))
	if err != nil {
		return "", fmt.Errorf("recording the intent to issue from %s: %w", path, err)
	}
	return id, nil
}

// dropIntent drops an intent whose lease is in the ledger, or that issued none. A failure leaves
// the record to the sweep, which drops it once it is older than any lease it could match.
func (r *Issuer) dropIntent(ctx context.Context, rc *v1beta1.RedisCluster, id string) {
	if id == "" {
		return
	}
	if err := r.Intents.Drop(ctx, rc.VaultConnectionName(), id); err != nil {
		log.FromContext(ctx).Info("Dropping an intent record failed; the orphan-lease sweep drops it later", "error", err.Error())
	}
}

// credentialsReady says that a live credential from Vault is issued.
func credentialsReady(cl *Cluster) {
	cl.Conds.Set(v1beta1.ConditionCredentialsReady, metav1.ConditionTrue, v1beta1.ReasonIssued, "A live credential from Vault is issued; it is written to Secret "+render.CredentialsSecretName(cl.RC)+" once every Redis node accepts it")
}

// countIssue counts an issue, and a rotation when the issue replaces a live credential.
func (r *Issuer) countIssue(d rotation.Decision, err error) {
	r.Metrics.Issues.WithLabelValues(metrics.Result(err)).Inc()
	if d.Action == rotation.ActionRotate {
		r.Metrics.Rotations.WithLabelValues(metrics.Result(err)).Inc()
	}
}

// recordLease puts a new lease into the ledger and the credential status, with the reason it was
// issued for (status.credential.rotationReason).
func (r *Issuer) recordLease(cl *Cluster, lease *vault.Lease, cred *render.Credential, d rotation.Decision) {
	rc := cl.RC
	now := status.At(r.Clock.Now())
	Supersede(rc, cred.Version)
	expires := status.At(lease.ExpiresAt)
	if lease.ID != "" {
		rc.Status.Leases = append(rc.Status.Leases, v1beta1.LeaseRecord{
			LeaseID: lease.ID, State: v1beta1.LeaseActive, Version: cred.Version, Username: cred.Username,
			Connection: rc.VaultConnectionName(), TokenAccessor: lease.TokenAccessor, IssuedAt: now, ExpiresAt: expires,
		})
	}
	var superseded []string
	if prev := rc.Status.Credential; prev != nil {
		superseded = prev.SupersededUsers // users kept until the rollout is done (RollOver)
	}
	rc.Status.Credential = &v1beta1.CredentialStatus{
		Version: cred.Version, Source: v1beta1.SourceVaultLease, Username: cred.Username,
		IssuedAt: now, LastRotation: now, RotationReason: string(d.Reason), SupersededUsers: superseded,
		Lease: v1beta1.CredentialLease{
			LeaseID: lease.ID, ExpiresAt: expires, Renewable: lease.Renewable,
			Duration: &metav1.Duration{Duration: lease.Duration},
		},
		VaultLease: v1beta1.VaultLeaseCredential{
			Path: rc.Spec.Credentials.VaultLease.Path, TokenAccessor: lease.TokenAccessor, TokenEndsAt: status.At(lease.TokenDeadline),
		},
	}
	if d.AcknowledgeRotateNow {
		rc.Status.RotateNowAcknowledged = rc.RotateNowRequest()
	}
}

// issueFailed reports a failed issue; a denied or invalid request waits for a human, anything
// else is retried with backoff.
func (r *Issuer) issueFailed(cl *Cluster, err error) error {
	reason, event := v1beta1.ReasonIssueFailed, v1beta1.ReasonIssueFailed
	switch {
	case vault.IsPermissionDenied(err):
		reason, event = v1beta1.ReasonPermissionDenied, v1beta1.ReasonPermissionDenied
	case vault.IsSealed(err):
		reason, event = v1beta1.ReasonVaultSealed, v1beta1.ReasonVaultSealed
	case vault.IsUnavailable(err):
		reason, event = v1beta1.ReasonVaultUnavailable, v1beta1.ReasonVaultUnavailable
	}
	msg := fmt.Sprintf("issuing a credential from %s: %v", cl.RC.Spec.Credentials.VaultLease.Path, err)
	refused := vault.IsPermissionDenied(err) || vault.IsBadRequest(err) || vault.IsNotFound(err)
	if refused {
		// Waits for a fix in Vault, which no event here announces: tried again after a while.
		msg += fmt.Sprintf("; tried again in %s, or at once when the RedisCluster or its VaultConnection changes", RefusedRetry)
	}
	cl.NotReady(reason, event, "Issue", msg, true)
	if refused {
		return &retryLater{after: RefusedRetry}
	}
	return fmt.Errorf("issuing credential: %w", err)
}

// RefusedRetry is how long a credential request that Vault refused (a policy, a role or path that
// does not exist) waits before it is tried again: long enough not to hammer Vault, short enough
// that a fix made in Vault is seen.
const RefusedRetry = 5 * time.Minute

// retryLater says that a step cannot succeed now and is tried again after a while; its condition
// already says why.
type retryLater struct{ after time.Duration }

func (e *retryLater) Error() string { return fmt.Sprintf("tried again in %s", e.after) }
