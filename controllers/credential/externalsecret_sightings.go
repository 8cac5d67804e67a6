package credential

import (
	"context"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
)

// sightings remembers the leases seen in each version of the Secrets ESO writes, until they are in
// a ledger: when ESO writes twice in quick succession, a reconcile sees only the last version, and
// the lease of the first would otherwise be lost. Each lease is kept with the UID of the
// ExternalSecret that controls the Secret it was seen in: only those of keyroll's own
// ExternalSecret are ever taken.
type sightings struct {
	mu sync.Mutex
	m  map[types.NamespacedName]map[string]types.UID
}

func (s *sightings) record(key types.NamespacedName, id string, owner types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[types.NamespacedName]map[string]types.UID{}
	}
	if s.m[key] == nil {
		s.m[key] = map[string]types.UID{}
	}
	s.m[key][id] = owner
}

// peek returns the leases seen for a cluster in Secrets that the ExternalSecret owner controls,
// sorted; none when owner is empty.
func (s *sightings) peek(key types.NamespacedName, owner types.UID) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if owner == "" {
		return nil
	}
	var ids []string
	for id, uid := range s.m[key] {
		if uid == owner {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
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
func (r *Adopter) SecretEvents() handler.EventHandler {
	see := func(o client.Object) []ctrl.Request {
		sec, ok := o.(*corev1.Secret)
		cluster := o.GetLabels()[v1beta1.LabelCluster]
		if !ok || cluster == "" {
			return nil
		}
		ref := metav1.GetControllerOf(sec)
		if ref == nil || ref.Kind != "ExternalSecret" {
			return nil
		}
		key := types.NamespacedName{Namespace: sec.Namespace, Name: cluster}
		if id := string(sec.Data[render.RawLeaseIDKey]); id != "" {
			r.sightings.record(key, id, ref.UID)
		}
		return []ctrl.Request{{NamespacedName: key}}
	}
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request { return see(o) })
}
