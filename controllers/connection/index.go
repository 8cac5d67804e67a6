package connection

// The index of RedisClusters by the VaultConnections they use, and the watch that wakes them when
// one of those changes: the RedisCluster controller's view of connections, kept here, below both
// controllers, so that neither imports the other.

import (
	"context"
	"maps"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// ClusterIndex indexes RedisClusters by the VaultConnections they use or hold leases from.
const ClusterIndex = "keyroll.connections"

// IndexClusters registers ClusterIndex with the manager's cache.
func IndexClusters(mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(context.Background(), &v1beta1.RedisCluster{}, ClusterIndex,
		func(o client.Object) []string { return o.(*v1beta1.RedisCluster).VaultConnections() })
}

// ClustersUsing maps a VaultConnection to the RedisClusters that use it (by ClusterIndex in c).
func ClustersUsing(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		list := &v1beta1.RedisClusterList{}
		if err := c.List(ctx, list, client.MatchingFields{ClusterIndex: o.GetName()}); err != nil {
			return nil
		}
		reqs := make([]ctrl.Request, 0, len(list.Items))
		for _, rc := range list.Items {
			reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&rc)})
		}
		return reqs
	}
}

// Changed passes the VaultConnection events that can matter to a RedisCluster: a new spec, a
// change of its Ready condition, or a token whose end became known (its leases may have to be
// replaced before it).
func Changed() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() {
			return true
		}
		o, n := e.ObjectOld.(*v1beta1.VaultConnection), e.ObjectNew.(*v1beta1.VaultConnection)
		return readyStatus(o.Status.Conditions) != readyStatus(n.Status.Conditions) ||
			!maps.Equal(o.Status.TokenEnds(), n.Status.TokenEnds())
	}}
}

func readyStatus(c []metav1.Condition) metav1.ConditionStatus {
	if cond := meta.FindStatusCondition(c, v1beta1.ConditionReady); cond != nil {
		return cond.Status
	}
	return metav1.ConditionUnknown
}
