package vaultconnection

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// ClusterIndex indexes RedisClusters by the VaultConnections they use or hold leases from.
const ClusterIndex = "keyroll.connections"

// reconcileTimeout bounds one reconcile, Vault calls and API requests included.
const reconcileTimeout = 2 * time.Minute

// IndexClusters registers ClusterIndex with the manager's cache.
func IndexClusters(mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.RedisCluster{}, ClusterIndex,
		func(o client.Object) []string { return o.(*v1alpha1.RedisCluster).VaultConnections() })
}
