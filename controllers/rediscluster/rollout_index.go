package rediscluster

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// IndexConsumers registers ConsumerIndex with the manager's cache.
func IndexConsumers(mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(context.Background(), &v1beta1.RedisCluster{}, ConsumerIndex, ConsumerKeys)
}

// ConsumerKeys are the ConsumerIndex values of a RedisCluster: "Kind/name" of each consumer.
func ConsumerKeys(o client.Object) []string {
	var keys []string
	for _, c := range o.(*v1beta1.RedisCluster).Spec.Rollout.Consumers {
		keys = append(keys, c.Kind+"/"+c.Name)
	}
	return keys
}

// ClustersConsuming maps a workload of kind to the RedisClusters that list it as a consumer (by
// ConsumerIndex in c).
func ClustersConsuming(c client.Reader, kind string) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		list := &v1beta1.RedisClusterList{}
		if err := c.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{ConsumerIndex: kind + "/" + o.GetName()}); err != nil {
			return nil
		}
		reqs := make([]ctrl.Request, 0, len(list.Items))
		for _, rc := range list.Items {
			reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&rc)})
		}
		return reqs
	}
}
