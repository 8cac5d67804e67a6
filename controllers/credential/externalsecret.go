package credential

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault"
)

// ExternalSecret mode: External Secrets Operator (ESO) syncs the credentials Secret through an
// ExternalSecret that keyroll owns. keyroll adopts each credential ESO writes, runs the same
// rollout as in VaultLease mode and, when the generator hands over the raw Vault response, takes
// the lease into its ledger to renew and revoke it (ESO does neither).

// Credential is the credential source of ExternalSecret mode: it keeps the ExternalSecret as
// specified, adopts the credential ESO synced, renews its lease when tracked (vcl is nil when
// externalSecret.connectionRef is not set) and asks ESO for a new credential when one is due.
func (r *Adopter) Credential(ctx context.Context, cl *Cluster, vcl vault.LeaseClient) (*render.Credential, time.Duration, error) {
	rc := cl.RC
	if !mayUseSource(cl, vcl) {
		return nil, waitForConnection, nil
	}
	es, err := r.ensureExternalSecret(ctx, cl)
	if err != nil || es == nil {
		return nil, waitForConnection, err
	}
	sec, err := r.syncedSecret(ctx, rc, es.UID)
	if err != nil {
		return nil, 0, err
	}
	if sec == nil {
		r.notSynced(cl, es, fmt.Sprintf("waiting for External Secrets Operator to sync Secret %s", render.SyncedSecretName(rc)), false)
		return nil, 0, nil
	}
	sc, problem := render.ParseSynced(sec, rc)
	if sc == nil {
		r.notSynced(cl, es, problem, true)
		return nil, 0, nil
	}
	tracked := vcl != nil && sc.LeaseID != "" && r.mayTrack(cl, vcl, sc.LeaseID)
	gone, waiting, err := r.adopt(ctx, cl, sc, vcl, tracked, es.UID)
	if err != nil || waiting {
		reportBounds(cl, waiting)
		return nil, cutOffWait, err
	}
	next, err := r.decideSynced(ctx, cl, vcl, tracked, gone)
	if err != nil {
		return nil, 0, err
	}
	r.Ledger.Planned(cl, next)
	// The superseded leases consumers not yet restarted still use are kept alive, as in VaultLease
	// mode, each through the connection it came through (even once connectionRef is gone).
	keep, err := r.Ledger.KeepSuperseded(ctx, cl, vcl, DefaultRenewalPercent)
	if err != nil {
		return nil, 0, err
	}
	r.Ledger.Due(cl, keep)
	r.reportSynced(cl, es, sc, tracked)
	reportBounds(cl, false)
	if rc.Status.Credential.ExternalSecret.CutOff {
		return nil, cutOffWait, nil // nothing to deliver until External Secrets Operator answers
	}
	if wait := r.settling(rc); wait > 0 {
		return nil, wait, nil
	}
	when := status.RequeueAfter(r.Clock.Now(), Earliest(next.When, keep))
	if next.Action != rotation.ActionNothing {
		when = syncSettle // a refresh is asked for: look again once ESO may have answered
	}
	return &sc.Credential, when, nil
}

// decideSynced lets rotation.Decide say what the synced credential needs and does it: renew or
// look up a tracked lease, through the connection it came through, or ask ESO for a new
// credential, until nothing more is due or a refresh is asked for (ESO answers with a new Secret,
// which starts the next reconcile). A lease tracked through another connection than
// externalSecret.connectionRef names now (or through one when it names none) is replaced, as in
// VaultLease mode. It returns the last decision, which plans what comes next.
func (r *Adopter) decideSynced(ctx context.Context, cl *Cluster, vcl vault.LeaseClient, tracked, gone bool) (rotation.Decision, error) {
	var d rotation.Decision
	lvcl, moved, err := r.Ledger.CurrentClient(ctx, cl, vcl)
	if err != nil {
		return d, err
	}
	tracked = tracked || moved
	if c := cl.RC.Status.Credential; c.ExternalSecret.CutOff {
		// Its lease is gone and its user cut off: a new credential is all it needs (asked for
		// again when the request is left unanswered).
		d = rotation.Decision{Action: rotation.ActionIssue, Reason: rotation.ReasonLeaseGone}
		return d, r.requestRefresh(ctx, cl, d)
	}
	for range MaxSteps {
		in := r.Ledger.Input(cl, lvcl, true, gone)
		in.SourceChanged = moved
		d = rotation.Decide(in)
		switch {
		case d.Action == rotation.ActionNothing:
			return d, nil
		case d.Action == rotation.ActionRenew && tracked:
			gone, err = r.Ledger.Renew(ctx, cl, lvcl)
		case d.Action == rotation.ActionCheck && tracked:
			gone, err = r.Ledger.Check(ctx, cl, lvcl)
		case d.Action == rotation.ActionIssue || d.Action == rotation.ActionRotate:
			if d.Reason == rotation.ReasonLeaseGone {
				// External Secrets Operator's token is not keyroll's to keep alive: a lease that
				// is gone was revoked outside keyroll or died with that token.
				r.leaseGoneExternally(ctx, cl)
			}
			return d, r.requestRefresh(ctx, cl, d)
		default:
			return d, nil
		}
		if err != nil {
			return d, err
		}
	}
	return d, nil
}

// cutOffWait is how often a cluster whose credential is cut off, or does not fit in the status,
// is looked at while nothing changes (a new Secret from External Secrets Operator, a revocation
// that makes room, wakes it earlier).
const cutOffWait = 30 * time.Second

// syncSettle is how long a new credential from ESO must stay in place before it is rolled out:
// one refresh can make ESO write the Secret twice in quick succession (each time with a new
// lease), and a rollout for the first would restart consumers for nothing.
const syncSettle = 3 * time.Second

// settling says how long to wait before rolling out a credential that ESO wrote a moment ago,
// while Redis pods run an older one. The first credential of a cluster does not wait.
func (r *Adopter) settling(rc *v1beta1.RedisCluster) time.Duration {
	c := rc.Status.Credential
	if rc.Status.ReadyReplicas == 0 || c.IssuedAt == nil {
		return 0
	}
	if left := syncSettle - r.Clock.Since(c.IssuedAt.Time); left > 0 {
		return left
	}
	return 0
}

// ensureExternalSecret creates or repairs the ExternalSecret and returns it as the API has it.
func (r *Adopter) ensureExternalSecret(ctx context.Context, cl *Cluster) (*externalsecrets.ExternalSecret, error) {
	desired := render.ExternalSecret(cl.RC)
	pauseRefreshes(cl.RC, desired)
	err := apply.Owned(ctx, r.Client, r.APIReader, cl.RC, desired)
	var conflict *apply.ConflictError
	if errors.As(err, &conflict) {
		cl.NotReady(v1beta1.ReasonSecretConflict, v1beta1.EventSecretConflict, "WriteExternalSecret", err.Error(), true)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	es := &externalsecrets.ExternalSecret{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(desired), es); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
		return desired, nil // created a moment ago: the cache has not seen it yet
	}
	return es, nil
}

// notSynced reports that there is no usable credential from ESO: none yet, or (invalid) a Secret
// without one. ESO's own reason is added when its Ready condition is False.
func (r *Adopter) notSynced(cl *Cluster, es *externalsecrets.ExternalSecret, problem string, invalid bool) {
	reason, event := v1beta1.ReasonExternalSecretNotReady, v1beta1.ReasonExternalSecretNotReady
	if invalid {
		reason, event = v1beta1.ReasonInvalidCredentialSecret, v1beta1.ReasonInvalidCredentialSecret
	}
	warn := invalid
	if c := es.Ready(); c != nil && c.Status == corev1.ConditionFalse {
		problem = fmt.Sprintf("%s; ExternalSecret %s is not Ready (%s): %s", problem, es.Name, c.Reason, c.Message)
		warn = true
	}
	cl.NotReady(reason, event, "Sync", problem, warn)
}

// refreshRequestTimeout is how long a refresh request that ESO has not answered with a new
// credential stays pending before keyroll asks again.
const refreshRequestTimeout = 10 * time.Minute

// requestRefresh asks ESO for a new credential: it records the request and its reason in the
// status first, then puts it on the ExternalSecret as an annotation, which makes ESO refresh at
// once. A pending request (no new credential since) is not repeated until refreshRequestTimeout.
func (r *Adopter) requestRefresh(ctx context.Context, cl *Cluster, d rotation.Decision) error {
	rc := cl.RC
	c := rc.Status.Credential
	if d.AcknowledgeRotateNow {
		rc.Status.RotateNowAcknowledged = rc.RotateNowRequest()
	}
	if (c.ExternalSecret.RefreshRequestedAt != nil && r.Clock.Since(c.ExternalSecret.RefreshRequestedAt.Time) < refreshRequestTimeout) || refreshesPaused(rc) {
		return nil // pending, or refreshes are paused (LedgerFull): asked for once there is room
	}
	now := status.At(r.Clock.Now())
	c.ExternalSecret.RefreshRequestedAt, c.RotationReason = now, string(d.Reason)
	if d.Action == rotation.ActionRotate {
		c.LastRotation = now
		r.Metrics.Rotations.WithLabelValues(metrics.Result(nil)).Inc()
	}
	if err := cl.Persist(ctx); err != nil {
		return fmt.Errorf("recording the refresh request: %w", err)
	}
	cl.Conds.Event(false, v1beta1.EventRefreshRequested, "Rotate", "Asked External Secrets Operator for a new credential (%s)", d.Reason)
	log.FromContext(ctx).Info("New credential requested from External Secrets Operator", "reason", string(d.Reason))
	return r.askForRefresh(ctx, rc, now.Time)
}

// askForRefresh puts the time of a refresh request on the ExternalSecret (annotation
// keyroll.dev/refresh-requested): a new value makes External Secrets Operator refresh at once. It
// is a merge patch of its own, not part of the applied spec, so that the annotation stays when
// the request has been answered.
func (r *Adopter) askForRefresh(ctx context.Context, rc *v1beta1.RedisCluster, at time.Time) error {
	es := &externalsecrets.ExternalSecret{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: render.ExternalSecretName(rc)}, es); err != nil {
		return fmt.Errorf("reading ExternalSecret %s: %w", render.ExternalSecretName(rc), err)
	}
	patch := client.MergeFrom(es.DeepCopy())
	if es.Annotations == nil {
		es.Annotations = map[string]string{}
	}
	es.Annotations[v1beta1.AnnotationRefreshRequested] = at.UTC().Format(time.RFC3339)
	if err := r.Client.Patch(ctx, es, patch); err != nil {
		return fmt.Errorf("asking ExternalSecret %s for a refresh: %w", es.Name, err)
	}
	return nil
}

// reportSynced sets CredentialsReady for a synced credential, says whether its lease is tracked,
// and flags ESO trouble and a refresh interval that would leave an expired credential in place.
func (r *Adopter) reportSynced(cl *Cluster, es *externalsecrets.ExternalSecret, sc *render.SyncedCredential, tracked bool) {
	rc := cl.RC
	src := rc.Spec.Credentials.ExternalSecret
	secret := render.SyncedSecretName(rc)
	if tracked {
		cl.Conds.Set(v1beta1.ConditionCredentialsReady, metav1.ConditionTrue, v1beta1.ReasonLeasesTracked,
			fmt.Sprintf("External Secrets Operator synced a credential into Secret %s; keyroll renews and revokes its lease", secret))
	} else {
		why := "set externalSecret.connectionRef so that keyroll can renew and revoke it"
		if sc.LeaseID == "" {
			why = "the generator does not hand over the lease (VaultDynamicSecret resultType Raw does)"
		}
		msg := fmt.Sprintf("External Secrets Operator synced a credential into Secret %s; its lease is not tracked: %s. Nobody renews or revokes it; it lives until its Vault TTL", secret, why)
		if cl.Conds.Set(v1beta1.ConditionCredentialsReady, metav1.ConditionTrue, v1beta1.ReasonLeasesNotTracked, msg) {
			cl.Conds.Announce(false, v1beta1.EventLeasesNotTracked, "Adopt", "%s", msg)
		}
	}
	lifetime := sc.LeaseDuration
	if lifetime == 0 && src.CredentialLifetime != nil {
		lifetime = src.CredentialLifetime.Duration
	}
	interval := src.RefreshInterval
	if !tracked && lifetime > 0 && interval != nil && interval.Duration >= lifetime {
		msg := fmt.Sprintf("externalSecret.refreshInterval (%s) is not shorter than the credential's lifetime (%s): External Secrets Operator will leave an expired credential in place",
			interval.Duration, lifetime)
		if cl.Conds.Set(v1beta1.ConditionSourceHealthy, metav1.ConditionFalse, v1beta1.ReasonRefreshIntervalTooLong, msg) {
			cl.Conds.Announce(true, v1beta1.ReasonRefreshIntervalTooLong, "Adopt", "%s", msg)
		}
		return
	}
	if r.endedEarly(cl, tracked) {
		return
	}
	if c := es.Ready(); c != nil && c.Status == corev1.ConditionFalse {
		msg := fmt.Sprintf("ExternalSecret %s is not Ready (%s): %s", es.Name, c.Reason, c.Message)
		if cl.Conds.Set(v1beta1.ConditionSourceHealthy, metav1.ConditionFalse, v1beta1.ReasonExternalSecretNotReady, msg) {
			cl.Conds.Announce(true, v1beta1.ReasonExternalSecretNotReady, "Sync", "%s", msg)
		}
		return
	}
	cl.Conds.Set(v1beta1.ConditionSourceHealthy, metav1.ConditionTrue, v1beta1.ReasonAvailable, "External Secrets Operator syncs the credential")
}

// esDeletionGrace is how long a RedisCluster being deleted waits for its ExternalSecret to go
// (External Secrets Operator removes its finalizer) before it revokes the leases regardless.
const esDeletionGrace = 30 * time.Second

// retireExternalSecret stops ESO before the leases are revoked: it takes the lease ESO wrote last
// (and any seen before) into the ledger, deletes the ExternalSecret and waits until it is gone,
// so that no lease is minted after the revocation. It returns how long to wait.
//
// Leases are taken from the Secret only while the connection allows the namespace: the Secret,
// the ExternalSecret and its owner reference are all a tenant's to write, and at deletion a
// revocation of a namespace the connection no longer allows is let through for the leases the
// ledger recorded while it was allowed (connection.Use's Delete). A lease ID read there at that
// point would be one nobody checked, and could be another team's under a path the connection
// shares with every namespace it allows.
func (r *Adopter) Retire(ctx context.Context, cl *Cluster) (time.Duration, error) {
	rc := cl.RC
	key := client.ObjectKeyFromObject(rc)
	es := &externalsecrets.ExternalSecret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: render.ExternalSecretName(rc)}, es)
	if client.IgnoreNotFound(err) != nil {
		return 0, err
	}
	owned := err == nil && apply.OwnedBy(es, rc)
	allowed, err := r.allowsNamespace(ctx, rc)
	if err != nil {
		return 0, err
	}
	if rc.VaultConnectionName() == "" || !owned || !allowed {
		r.sightings.forget(key, nil)
	} else {
		sec, err := r.syncedSecret(ctx, rc, es.UID)
		if err != nil {
			return 0, err
		}
		sighted := r.sightings.peek(key, es.UID)
		if sec != nil {
			if sc, _ := render.ParseSynced(sec, rc); sc != nil && sc.LeaseID != "" {
				sighted = append(sighted, sc.LeaseID)
			}
		}
		rc.Status.Leases = AddSighted(rc.Status.Leases, sighted, status.At(r.Clock.Now()), rc.VaultConnectionName())
		if err := cl.Persist(ctx); err != nil {
			return 0, err
		}
		r.sightings.forget(key, sighted)
	}
	if !owned {
		return 0, nil
	}
	if es.DeletionTimestamp.IsZero() {
		if err := r.Client.Delete(ctx, es); client.IgnoreNotFound(err) != nil {
			return 0, fmt.Errorf("deleting ExternalSecret %s: %w", es.Name, err)
		}
		if c := rc.Status.Credential; rc.VaultConnectionName() == "" || (c != nil && c.ExternalSecret.LeasesTracked != nil && !*c.ExternalSecret.LeasesTracked) {
			cl.Conds.Event(false, v1beta1.EventRevocationSkipped, "Delete",
				"Leases are not tracked (no credentials.externalSecret.connectionRef, or no lease in what External Secrets Operator synced): the leases it obtained live until their Vault TTL")
		}
		return time.Second, nil
	}
	if r.Clock.Since(es.DeletionTimestamp.Time) < esDeletionGrace {
		return time.Second, nil
	}
	return 0, nil
}

// allowsNamespace says whether the VaultConnection rc names allows rc's namespace now; a
// connection that is gone allows nothing.
func (r *Adopter) allowsNamespace(ctx context.Context, rc *v1beta1.RedisCluster) (bool, error) {
	name := rc.VaultConnectionName()
	if name == "" {
		return false, nil
	}
	vc := &v1beta1.VaultConnection{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, vc); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return vc.AllowsNamespace(rc.Namespace), nil
}
