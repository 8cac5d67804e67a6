package controllers

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/vault"
)

// connectionCheckInterval is how often a VaultConnection's login and Vault's health are checked
// when nothing else happens.
const connectionCheckInterval = 5 * time.Minute

// VaultConnectionReconciler reconciles VaultConnections: it logs in to Vault and reports the login,
// the token's expiry and Vault's version and seal state. It never writes the token anywhere.
type VaultConnectionReconciler struct {
	client.Client
	Recorder  events.EventRecorder
	Clock     clock.Clock
	Connector *Connector
	Metrics   *Metrics
}

// Reconcile checks one VaultConnection.
func (r *VaultConnectionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	vc := &v1alpha1.VaultConnection{}
	if err := r.Get(ctx, req.NamespacedName, vc); err != nil {
		if client.IgnoreNotFound(err) == nil {
			r.Connector.Forget(req.Name)
			r.Metrics.setTokenExpiry(req.Name, time.Time{})
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := vc.DeepCopy()
	defer func() {
		reterr = errors.Join(reterr, patchStatus(ctx, r.Client, before, vc, func(o client.Object) any {
			return o.(*v1alpha1.VaultConnection).Status
		}))
	}()
	return r.check(ctx, vc)
}

// check logs in (or reuses the shared login), reads Vault's health and sets the status.
func (r *VaultConnectionReconciler) check(ctx context.Context, vc *v1alpha1.VaultConnection) (ctrl.Result, error) {
	conds := conditionSetter{obj: vc, conditions: &vc.Status.Conditions, recorder: r.Recorder}
	now := metav1.NewTime(r.Clock.Now())
	vc.Status.LastCheckedAt = &now
	vcl, err := r.Connector.Client(ctx, vc)
	if err == nil {
		err = r.observe(ctx, vc, vcl)
	}
	if err != nil {
		reason := v1alpha1.ReasonLoginFailed
		if vault.IsUnavailable(err) {
			reason = v1alpha1.ReasonVaultUnavailable
		}
		var sealed *sealedError
		if vault.IsSealed(err) || errors.As(err, &sealed) {
			reason = v1alpha1.ReasonVaultSealed
		}
		if conds.set(v1alpha1.ConditionReady, metav1.ConditionFalse, reason, err.Error()) {
			conds.event(true, reason, "Login", "Vault connection not ready: %v", err)
		}
		log.FromContext(ctx).V(1).Info("Vault connection not ready", "reason", reason, "error", err.Error())
		return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
	}
	conds.set(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonLoggedIn, "Logged in to Vault "+vc.Status.VaultVersion)
	vc.Status.ObservedGeneration = vc.Generation
	return ctrl.Result{RequeueAfter: r.nextCheck(vcl.TokenInfo())}, nil
}

// observe reads Vault's health and makes sure the client holds a valid token.
func (r *VaultConnectionReconciler) observe(ctx context.Context, vc *v1alpha1.VaultConnection, vcl vault.Client) error {
	h, err := vcl.Health(ctx)
	if err != nil {
		return err
	}
	vc.Status.VaultVersion = h.Version
	vc.Status.Sealed = &h.Sealed
	if h.Sealed {
		return &sealedError{}
	}
	if !vcl.TokenInfo().Valid || !r.Clock.Now().Before(vcl.TokenInfo().RenewAt) {
		if err := vcl.Login(ctx); err != nil {
			return err
		}
	}
	r.Metrics.setTokenExpiry(vc.Name, vcl.TokenInfo().ExpiresAt)
	if exp := vcl.TokenInfo().ExpiresAt; !exp.IsZero() {
		t := metav1.NewTime(exp)
		vc.Status.TokenExpiresAt = &t
	} else {
		vc.Status.TokenExpiresAt = nil
	}
	return nil
}

type sealedError struct{}

func (*sealedError) Error() string { return "Vault is sealed" }

// nextCheck is the next periodic check: before the token must be renewed, at the latest after
// connectionCheckInterval.
func (r *VaultConnectionReconciler) nextCheck(ti vault.TokenInfo) time.Duration {
	next := connectionCheckInterval
	if !ti.RenewAt.IsZero() {
		if d := ti.RenewAt.Sub(r.Clock.Now()); d > time.Second && d < next {
			next = d
		}
	}
	return next
}

// SetupWithManager registers the reconciler. Only spec changes trigger it (its own status writes
// do not); the periodic check comes from RequeueAfter.
func (r *VaultConnectionReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.VaultConnection{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("vaultconnection").
		WithOptions(controller.Options{ReconciliationTimeout: ReconcileTimeout}).
		Complete(r)
}
