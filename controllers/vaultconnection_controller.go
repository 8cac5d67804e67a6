package controllers

import (
	"context"

	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// VaultConnectionReconciler reconciles VaultConnections: it logs in to Vault and reports the login,
// the token's expiry and Vault's version and seal state.
type VaultConnectionReconciler struct {
	client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
}

// Reconcile checks one VaultConnection.
func (r *VaultConnectionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vc := &v1alpha1.VaultConnection{}
	if err := r.Get(ctx, req.NamespacedName, vc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// Logging in and reporting lands with the controller issues.
	return ctrl.Result{}, nil
}

// SetupWithManager registers the reconciler with the manager.
func (r *VaultConnectionReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.VaultConnection{}).
		Named("vaultconnection").
		Complete(r)
}
