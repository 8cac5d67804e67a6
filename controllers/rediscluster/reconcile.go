package rediscluster

import (
	"context"
	"errors"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/vault"
)

// Reconcile brings one RedisCluster towards its spec. Status is written once, at the end, except
// that a newly issued lease is written to the ledger before anything uses it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	ctx = redisnode.Budgeted(ctx) // a cluster whose Redis does not answer yields its worker
	rc := &v1beta1.RedisCluster{}
	if err := r.Get(ctx, req.NamespacedName, rc); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			r.externalSecret.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	s := &credential.Cluster{RC: rc, Before: rc.DeepCopy(),
		Conds:  status.Setter{Obj: rc, Conditions: &rc.Status.Conditions, Recorder: r.Recorder, Announced: &status.Announced{}},
		Status: r.deps}
	defer func() {
		if s.StatusLater && reterr == nil {
			return
		}
		err := r.WriteStatus(ctx, s)
		if apierrors.IsNotFound(err) && !rc.DeletionTimestamp.IsZero() {
			err = nil // deleted meanwhile: its finalizer was removed
		}
		if apierrors.IsConflict(reterr) && err == nil {
			// An owned object changed after the cache saw it (kube-controller-manager writes the
			// StatefulSet's status, for one): the next look uses the newer version.
			log.FromContext(ctx).V(1).Info("An object changed meanwhile; reconciling again", "error", reterr.Error())
			res, reterr = ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if apierrors.IsConflict(err) && reterr == nil {
			// The cache lagged behind a newer version: look again from that one. Nothing is lost:
			// every step is recomputed from the cluster and Vault, and repeating one is harmless.
			log.FromContext(ctx).V(1).Info("Status changed meanwhile; reconciling again")
			res, err = ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if reterr = errors.Join(reterr, err); reterr != nil {
			res = ctrl.Result{} // the error's backoff decides when to look again
		}
	}()
	if !rc.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}
	if added, err := r.ensureFinalizer(ctx, rc); err != nil {
		return ctrl.Result{}, err
	} else if added {
		s.Before = rc.DeepCopy() // the patched object, which the API server has now: go on from it
	}
	return r.reconcileNormal(ctx, s)
}

// ensureFinalizer adds the finalizer before anything is created in Vault.
func (r *Reconciler) ensureFinalizer(ctx context.Context, rc *v1beta1.RedisCluster) (bool, error) {
	if controllerutil.ContainsFinalizer(rc, v1beta1.Finalizer) {
		return false, nil
	}
	patch := client.MergeFrom(rc.DeepCopy())
	controllerutil.AddFinalizer(rc, v1beta1.Finalizer)
	return true, r.Patch(ctx, rc, patch)
}

// reconcileNormal runs the phases in order; each returns early when it cannot go on: the
// credential first (a new cluster holds its lease after a few requests, not after all its
// objects), the Redis objects (written whatever became of it), its users on every node (then the
// consumers' Secret), the rollout to the consumers, and the retirement of what it replaced.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *credential.Cluster) (ctrl.Result, error) {
	rc := s.RC
	if rc.Spec.Credentials.Source == v1beta1.SourceExternalSecret && !r.ExternalSecrets {
		credential.ExternalSecretsNotInstalled(s)
		return ctrl.Result{}, nil
	}
	s.ParseRotation()
	if free, err := r.checkSecretsFree(ctx, s); !free || err != nil {
		return result(waitForConnection, err)
	}
	in, err := r.internalUsers(ctx, s)
	if in == nil || err != nil {
		return result(waitForConnection, err)
	}
	if ok, wait, err := r.reconcileTLS(ctx, s, in); !ok || err != nil {
		return result(wait, err)
	}
	d, err := r.credentialAndObjects(ctx, s, in)
	if err == nil && d.cred == nil && d.pc != nil && credential.CutOff(rc) {
		// A user cut off with no credential to replace it yet leaves every node now.
		_, wait, err := r.reconcileUsers(ctx, s, in, nil)
		return result(status.Soonest(d.next, wait), err)
	}
	if err != nil || d.cred == nil {
		return result(d.next, err)
	}
	return r.deliver(ctx, s, d)
}

// delivery is what the credential needs to reach the Redis nodes and the consumers.
type delivery struct {
	in   *internal
	cred *render.Credential
	vcl  vault.LeaseClient // none in ExternalSecret mode without connectionRef
	pc   *primaryView
	next time.Duration
}

// credentialAndObjects brings the credential up to date, then the Redis objects and the primary,
// whatever became of the credential: Redis trouble is reported and looked at again, and does not
// hold up the credential.
func (r *Reconciler) credentialAndObjects(ctx context.Context, s *credential.Cluster, in *internal) (delivery, error) {
	rc := s.RC
	d := delivery{in: in}
	var credErr error
	if rc.VaultConnectionName() != "" {
		d.vcl, d.next, credErr = r.connect(ctx, s, false)
	}
	had := rc.Status.Credential != nil && rc.Status.Credential.Version != ""
	if d.vcl != nil || rc.VaultConnectionName() == "" {
		d.cred, d.next, credErr = r.source(rc).Credential(ctx, s, d.vcl)
	}
	if !had && d.cred != nil && in.acl.Name == "" && rc.Spec.Credentials.Source == v1beta1.SourceVaultLease {
		return r.credentialFirst(ctx, s, in, d)
	}
	if err := r.reconcileObjects(ctx, s, in); err != nil {
		return d, errors.Join(credErr, err)
	}
	pc, err := r.primary.For(ctx, rc, s.Conds, in.Admin)
	if err != nil {
		return d, errors.Join(credErr, err)
	}
	keepWait, err := r.primary.Keep(ctx, pc)
	if err != nil {
		log.FromContext(ctx).Info("Keeping the primary failed; trying again", "error", err.Error())
		keepWait = status.Soonest(keepWait, 5*time.Second)
	}
	servedWait, err := r.certificateServed(ctx, s, in)
	if err != nil {
		log.FromContext(ctx).Info("Loading the renewed certificate failed; trying again", "error", err.Error())
		servedWait = 5 * time.Second
	}
	d.pc, d.next = pc, status.Soonest(d.next, status.Soonest(keepWait, servedWait))
	return d, credErr
}

// credentialFirst ends a new cluster's first reconcile once its first credential is issued,
// recorded in the ledger and kept (the state Secret, with the admin password): its objects, and
// the status beyond the ledger, come in its next reconcile, behind the clusters already queued.
// Of many clusters created at once, each then holds its lease after three writes, not after the
// dozen writes and reads of the objects of every cluster ahead of it.
func (r *deps) credentialFirst(ctx context.Context, s *credential.Cluster, in *internal, d delivery) (delivery, error) {
	err := r.writeState(ctx, s.RC, in, d.cred)
	s.StatusLater = err == nil
	d.cred, d.next = nil, objectsAfterCredential
	return d, err
}

// objectsAfterCredential is when a new cluster is looked at again after credentialFirst.
const objectsAfterCredential = time.Millisecond

// deliver puts the credential on every Redis node, then in the consumers' Secret and rolls the
// consumers out (and records when it got there: delivered.go), then retires the users and leases
// it superseded.
func (r *Reconciler) deliver(ctx context.Context, s *credential.Cluster, d delivery) (ctrl.Result, error) {
	if err := r.stage(ctx, s, d.in, d.cred); err != nil {
		return ctrl.Result{}, err
	}
	before := r.deliveredBefore(ctx, s.RC, d.cred)
	// Users cut off ahead of their replacement's rollout leave the nodes (and status) in the
	// users step: the consumers still need the credential that replaced them.
	pending := credential.Pending(s.RC) || credential.CutOff(s.RC)
	applied, usersWait, err := r.reconcileUsers(ctx, s, d.in, d.cred)
	if d.next = status.Soonest(d.next, usersWait); !applied || err != nil {
		r.readyReplicas(ctx, s)
		return result(d.next, err)
	}
	rolledOut, wait, err := r.rollout.Roll(ctx, d.pc, d.cred.Version, pending, s.Window)
	if err != nil {
		return ctrl.Result{}, err
	}
	if rolledOut {
		d.next = status.Soonest(d.next, r.delivered(s.RC, d.cred, before))
	}
	if rolledOut && credential.Retiring(s.RC) {
		if done, wait, err := r.retireSuperseded(ctx, s, d.in, d.vcl, d.cred); !done || err != nil {
			return result(wait, err)
		}
	}
	r.readyReplicas(ctx, s)
	s.RC.Status.ObservedGeneration = s.RC.Generation
	return result(status.Soonest(d.next, wait), nil)
}

// stage keeps the current credential where only keyroll reads it (VaultLease mode: Vault hands
// it over once), before any node or consumer has it; with rollout.redisPods Restart, the
// StatefulSet's template names it, so that pods restarted for it are told apart.
func (r *deps) stage(ctx context.Context, s *credential.Cluster, in *internal, cred *render.Credential) error {
	rc := s.RC
	if rc.Spec.Credentials.Source == v1beta1.SourceVaultLease {
		if err := r.writeState(ctx, rc, in, cred); err != nil {
			return err
		}
	}
	if render.RestartsPods(rc) {
		return apply.Owned(ctx, r.Client, r.APIReader, rc, render.StatefulSet(rc, cred.Version, r.probeImage))
	}
	return nil
}

// retireSuperseded retires what the current credential replaced, once it runs everywhere, but for
// the users that clients which are not listed consumers still hold (oldclients.go): the users of
// superseded credentials leave every node (confirmed on each) and the aclfile, then their leases
// are revoked. A revocation that fails is retried with backoff; the user stays removed. vcl is nil
// when no lease is tracked.
func (r *deps) retireSuperseded(ctx context.Context, s *credential.Cluster, in *internal, vcl vault.LeaseClient, cred *render.Credential) (bool, time.Duration, error) {
	held, holdWait, err := r.holdForOldUserClients(ctx, s, in)
	if err != nil || (len(held) > 0 && len(held) == len(credential.UsersToRetire(s.RC))) {
		return false, holdWait, err
	}
	credential.Retire(s.RC, held...) // the others retire now, each on its own
	applied, wait, err := r.reconcileUsers(ctx, s, in, cred)
	if !applied || err != nil {
		return false, wait, err
	}
	if credential.ToRevoke(s.RC) { // each through the connection it came through
		if err := r.Ledger.RevokeSuperseded(ctx, s, vcl); err != nil {
			return false, 0, err
		}
	}
	return len(held) == 0, holdWait, nil
}

// forget drops what the reconciler keeps of a deleted cluster: its lease checks, node checks and metrics.
func (r *Reconciler) forget(key types.NamespacedName) {
	for _, f := range []func(types.NamespacedName){r.Ledger.Checks.Forget, r.upkeep.Forget, r.nodes.Forget, r.primary.Forget, r.tls.Forget, r.Metrics.Forget} {
		f(key)
	}
}

// result asks to be called again after after, or returns err alone: never both.
func result(after time.Duration, err error) (ctrl.Result, error) {
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// readyReplicas records how many Redis pods are Ready (the StatefulSet's count).
func (r *Reconciler) readyReplicas(ctx context.Context, s *credential.Cluster) {
	sts := &appsv1.StatefulSet{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: s.RC.Namespace, Name: s.RC.Name}, sts); err == nil {
		s.RC.Status.ReadyReplicas = sts.Status.ReadyReplicas
	}
}

// WriteStatus sums the conditions up (Ready, Degraded), derives the phase and writes the status if
// it changed; then the events announcing its changes are recorded. A reconcile that started from
// a stale cache computes the changes a previous one wrote, and its write conflicts: its events go
// with it, so that each change is announced once.
func (r *deps) WriteStatus(ctx context.Context, s *credential.Cluster) error {
	summarize(s)
	s.RC.Status.Phase = s.RC.SummaryPhase()
	err := apply.PatchStatus(ctx, r.Client, s.Before, s.RC, func(o client.Object) any { return o.(*v1beta1.RedisCluster).Status })
	if err != nil {
		s.Conds.NotWritten()
		return err
	}
	s.Before = s.RC.DeepCopy()
	s.Conds.Written()
	return nil
}
