package externalsecret

import (
	"context"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers/render"
)

// sightings remembers the leases seen in each version of the Secrets ESO writes, until they are in
// a ledger: when ESO writes twice in quick succession, a reconcile sees only the last version, and
// the lease of the first would otherwise be lost.
type sightings struct {
	mu sync.Mutex
	m  map[types.NamespacedName]map[string]bool
}

func (s *sightings) record(key types.NamespacedName, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[types.NamespacedName]map[string]bool{}
	}
	if s.m[key] == nil {
		s.m[key] = map[string]bool{}
	}
	s.m[key][id] = true
}

// peek returns the leases seen for a cluster, sorted.
func (s *sightings) peek(key types.NamespacedName) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.m[key]))
}

// forget drops leases that are in the ledger now, or all of a cluster's when ids is nil.
func (s *sightings) forget(key types.NamespacedName, ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ids == nil {
		delete(s.m, key)
		return
	}
	for _, id := range ids {
		delete(s.m[key], id)
	}
	if len(s.m[key]) == 0 {
		delete(s.m, key)
	}
}

// SecretEvents enqueues the RedisCluster of a Secret that ESO writes for it, and records the
// lease of every version of that Secret it sees.
func (r *Source) SecretEvents() handler.EventHandler {
	see := func(o client.Object) []ctrl.Request {
		sec, ok := o.(*corev1.Secret)
		cluster := o.GetLabels()[v1alpha1.LabelCluster]
		if !ok || cluster == "" {
			return nil
		}
		if ref := metav1.GetControllerOf(sec); ref == nil || ref.Kind != "ExternalSecret" {
			return nil
		}
		key := types.NamespacedName{Namespace: sec.Namespace, Name: cluster}
		if id := string(sec.Data[render.RawLeaseIDKey]); id != "" {
			r.sightings.record(key, id)
		}
		return []ctrl.Request{{NamespacedName: key}}
	}
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request { return see(o) })
}
