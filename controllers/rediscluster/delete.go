package rediscluster

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/vault"
)

// reconcileDelete revokes every lease in the ledger, then removes the finalizer. While a lease may
// still be live, the finalizer stays.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *credential.Cluster) (ctrl.Result, error) {
	rc := s.RC
	if !controllerutil.ContainsFinalizer(rc, v1beta1.Finalizer) {
		return ctrl.Result{}, nil
	}
	if rc.Spec.DeletionPolicy == v1beta1.DeletionRetain {
		if len(rc.Status.Leases) > 0 {
			s.Conds.Event(false, v1beta1.EventRevocationSkipped, "Delete",
				"deletionPolicy Retain: %d lease(s) left to expire in Vault, not revoked", len(rc.Status.Leases))
		}
		return ctrl.Result{}, r.removeFinalizer(ctx, s)
	}
	r.forget(client.ObjectKeyFromObject(rc))
	if src := r.source(rc); rc.Spec.Credentials.Source != v1beta1.SourceExternalSecret || r.ExternalSecrets {
		if wait, err := src.Retire(ctx, s); err != nil || wait > 0 {
			return result(wait, err)
		}
	}
	if len(rc.Status.Leases) > 0 {
		if res, err := r.revokeAll(ctx, s); err != nil || !res.IsZero() {
			return res, err
		}
	}
	return ctrl.Result{}, r.removeFinalizer(ctx, s)
}

// revokeAll revokes every lease in the ledger, superseded ones included, each through the
// VaultConnection it came through: the spec's, or, when the spec names none any more (ExternalSecret
// mode without connectionRef), the one its record names.
func (r *deps) revokeAll(ctx context.Context, s *credential.Cluster) (ctrl.Result, error) {
	var vcl vault.LeaseClient
	if s.RC.VaultConnectionName() != "" {
		c, wait, err := r.connect(ctx, s, true)
		if vcl = c; vcl == nil {
			msg := fmt.Sprintf("%d lease(s) cannot be revoked: %s", len(s.RC.Status.Leases), conditionMessage(s.RC, v1beta1.ConditionCredentialsReady))
			if s.Conds.Set(v1beta1.ConditionLeasesRevoked, metav1.ConditionFalse, v1beta1.ReasonRevocationPending, msg) {
				s.Conds.Announce(true, v1beta1.EventRevocationFailed, "Revoke", "%s", msg)
			}
			return result(wait, err)
		}
	}
	return ctrl.Result{}, r.Ledger.RevokeAll(ctx, s, vcl)
}

// removeFinalizer writes the (now empty) ledger first, then lets the object go.
func (r *Reconciler) removeFinalizer(ctx context.Context, s *credential.Cluster) error {
	if err := r.WriteStatus(ctx, s); err != nil {
		return err
	}
	patch := client.MergeFrom(s.RC.DeepCopy())
	controllerutil.RemoveFinalizer(s.RC, v1beta1.Finalizer)
	if err := r.Patch(ctx, s.RC, patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	s.Before = s.RC.DeepCopy()
	return nil
}

func conditionMessage(rc *v1beta1.RedisCluster, t string) string {
	if c := meta.FindStatusCondition(rc.Status.Conditions, t); c != nil {
		return c.Message
	}
	return ""
}
