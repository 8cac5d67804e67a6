package rediscluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyroll/keyroll/controllers/metrics"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/vault"
)

// revokeSuperseded revokes the leases that a newer credential has replaced; it is called only once
// that credential runs on every Redis pod and consumer. A failed revocation stays in the ledger as
// Revoking and is retried with backoff.
func (r *deps) revokeSuperseded(ctx context.Context, s *scope, vcl vault.LeaseClient) error {
	var errs []error
	for _, l := range s.RC.Status.Leases {
		if l.State == v1alpha1.LeaseActive {
			continue
		}
		errs = append(errs, r.revoke(ctx, s, vcl, l.LeaseID))
	}
	return r.revocationOutcome(s, errors.Join(errs...))
}

// revoke revokes one lease: on success it leaves the ledger, on failure it is marked Revoking.
func (r *deps) revoke(ctx context.Context, s *scope, vcl vault.LeaseClient, id string) error {
	err := vcl.Revoke(ctx, id)
	r.Metrics.Revocations.WithLabelValues(metrics.Result(err)).Inc()
	if err != nil {
		for i := range s.RC.Status.Leases {
			if s.RC.Status.Leases[i].LeaseID == id {
				s.RC.Status.Leases[i].State = v1alpha1.LeaseRevoking
			}
		}
		return fmt.Errorf("revoking lease %s (%s): %w", id, vault.ClassOf(err), err)
	}
	s.RC.Status.Leases = removeLease(s.RC.Status.Leases, id)
	s.Conds.Event(false, v1alpha1.EventLeaseRevoked, "Revoke", "Revoked lease %s", id)
	log.FromContext(ctx).Info("Lease revoked", "lease", id)
	return nil
}

// revocationOutcome sets Degraded for pending revocations, with an event on the transition.
func (r *deps) revocationOutcome(s *scope, err error) error {
	if err == nil {
		s.Conds.Set(v1alpha1.ConditionLeasesRevoked, metav1.ConditionTrue, v1alpha1.ReasonAvailable, "Every superseded lease is revoked")
		return nil
	}
	msg := fmt.Sprintf("%d lease(s) not revoked yet, retrying: %v", countState(s.RC, v1alpha1.LeaseRevoking), err)
	if s.Conds.Set(v1alpha1.ConditionLeasesRevoked, metav1.ConditionFalse, v1alpha1.ReasonRevocationPending, msg) {
		s.Conds.Event(true, v1alpha1.EventRevocationFailed, "Revoke", "%s", msg)
	}
	return err
}

// reconcileDelete revokes every lease in the ledger, then removes the finalizer. While a lease may
// still be live, the finalizer stays.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	rc := s.RC
	if !controllerutil.ContainsFinalizer(rc, v1alpha1.Finalizer) {
		return ctrl.Result{}, nil
	}
	if rc.Spec.DeletionPolicy == v1alpha1.DeletionRetain {
		if len(rc.Status.Leases) > 0 {
			s.Conds.Event(false, v1alpha1.EventRevocationSkipped, "Delete",
				"deletionPolicy Retain: %d lease(s) left to expire in Vault, not revoked", len(rc.Status.Leases))
		}
		return ctrl.Result{}, r.removeFinalizer(ctx, s)
	}
	r.forget(client.ObjectKeyFromObject(rc))
	if src := r.source(rc); src.writesSecret() || r.ExternalSecrets {
		if wait, err := src.retire(ctx, s); err != nil || wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, err
		}
	}
	if len(rc.Status.Leases) > 0 {
		if res, err := r.revokeAll(ctx, s); err != nil || !res.IsZero() {
			return res, err
		}
	}
	return ctrl.Result{}, r.removeFinalizer(ctx, s)
}

// revokeAll revokes every lease in the ledger, superseded ones included.
func (r *deps) revokeAll(ctx context.Context, s *scope) (ctrl.Result, error) {
	vcl, wait, err := r.connect(ctx, s, true)
	if vcl == nil {
		msg := fmt.Sprintf("%d lease(s) cannot be revoked: %s", len(s.RC.Status.Leases), conditionMessage(s.RC, v1alpha1.ConditionCredentialsReady))
		if s.Conds.Set(v1alpha1.ConditionLeasesRevoked, metav1.ConditionFalse, v1alpha1.ReasonRevocationPending, msg) {
			s.Conds.Event(true, v1alpha1.EventRevocationFailed, "Revoke", "%s", msg)
		}
		return ctrl.Result{RequeueAfter: wait}, err
	}
	var errs []error
	for _, l := range s.RC.Status.Leases {
		errs = append(errs, r.revoke(ctx, s, vcl, l.LeaseID))
	}
	return ctrl.Result{}, r.revocationOutcome(s, errors.Join(errs...))
}

// removeFinalizer writes the (now empty) ledger first, then lets the object go.
func (r *Reconciler) removeFinalizer(ctx context.Context, s *scope) error {
	if err := r.writeStatus(ctx, s); err != nil {
		return err
	}
	patch := client.MergeFrom(s.RC.DeepCopy())
	controllerutil.RemoveFinalizer(s.RC, v1alpha1.Finalizer)
	if err := r.Patch(ctx, s.RC, patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	s.before = s.RC.DeepCopy()
	return nil
}

func conditionMessage(rc *v1alpha1.RedisCluster, t string) string {
	if c := meta.FindStatusCondition(rc.Status.Conditions, t); c != nil {
		return c.Message
	}
	return ""
}

func countState(rc *v1alpha1.RedisCluster, st v1alpha1.LeaseState) int {
	n := 0
	for _, l := range rc.Status.Leases {
		if l.State == st {
			n++
		}
	}
	return n
}
