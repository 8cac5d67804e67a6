package controllers

import (
	"context"

	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// RedisClusterReconciler reconciles RedisClusters: credentials from Vault, the Redis StatefulSet and
// the Secrets it mounts, renewals, rotations, rollouts and revocation on delete.
type RedisClusterReconciler struct {
	client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
}

// Reconcile brings one RedisCluster towards its spec.
func (r *RedisClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	rc := &v1alpha1.RedisCluster{}
	if err := r.Get(ctx, req.NamespacedName, rc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// The credential lifecycle (issue, renew, rotate, roll out, revoke) lands with the controller issues.
	return ctrl.Result{}, nil
}

// SetupWithManager registers the reconciler with the manager.
func (r *RedisClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.RedisCluster{}).
		Named("rediscluster").
		Complete(r)
}
