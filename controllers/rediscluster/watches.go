package rediscluster

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/upkeep"
)

// SetupWithManager registers the reconciler: it watches RedisClusters, what they own, and the
// VaultConnections they use.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := IndexConsumers(mgr); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1beta1.RedisCluster{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Secret{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&networkingv1.NetworkPolicy{}).
		Watches(&v1beta1.VaultConnection{}, handler.EnqueueRequestsFromMapFunc(connection.ClustersUsing(r.Client)),
			builder.WithPredicates(connection.Changed())).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(clusterOfPod)).
		// Consumers are other teams' workloads: only their metadata is watched (and cached), to
		// wake the cluster that rolls them; the rollout reads them past the cache. Consumer
		// StatefulSets are not seen at all (the StatefulSet cache holds keyroll's own only): the
		// rollout looks at them again on a timer.
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(ClustersConsuming(r.Client, "Deployment")), builder.OnlyMetadata).
		Watches(&appsv1.DaemonSet{}, handler.EnqueueRequestsFromMapFunc(ClustersConsuming(r.Client, "DaemonSet")), builder.OnlyMetadata).
		// Lease upkeep that comes due, or a rotation asked for, is queued ahead of other work.
		WatchesRawSource(r.upkeep.Source()).
		Watches(&v1beta1.RedisCluster{}, upkeep.Asked(func(o client.Object) bool { return o.(*v1beta1.RedisCluster).RotationAsked() })).
		Named("rediscluster").
		WithOptions(controller.Options{ReconciliationTimeout: reconcileTimeout, MaxConcurrentReconciles: r.Workers,
			RateLimiter: failureBackoff(), NewQueue: upkeep.NewQueue(mgr.GetLogger())})
	if r.ExternalSecrets {
		// The ExternalSecret keyroll owns, and the Secret External Secrets Operator writes for it
		// (controlled by the ExternalSecret, so it is watched by its label).
		b = b.Owns(&externalsecrets.ExternalSecret{}).
			Watches(&corev1.Secret{}, r.externalSecret.SecretEvents())
	}
	return b.Complete(r)
}

// clusterOfPod maps a Redis pod to its RedisCluster, named by its label.
func clusterOfPod(_ context.Context, o client.Object) []ctrl.Request {
	name := o.GetLabels()[v1beta1.LabelCluster]
	if name == "" {
		return nil
	}
	return []ctrl.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
}

// reconcileTimeout bounds one reconcile, Vault calls and API requests included.
const reconcileTimeout = 2 * time.Minute

// A failed reconcile's backoff doubles from backoffBase to backoffCap, per cluster, so that a lease
// is renewed within backoffCap of Vault's return after any outage (controller-runtime's default
// grows to 1000 s, longer than many leases live). No bucket is shared by all clusters: with one,
// a thousand failing clusters would hold every other cluster's retry back for minutes; each
// VaultConnection's rate limit bounds the calls to Vault instead.
const (
	backoffBase = 500 * time.Millisecond
	backoffCap  = 30 * time.Second
)

func failureBackoff() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](backoffBase, backoffCap)
}
