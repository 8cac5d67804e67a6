package rediscluster

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// seenPods are the look-alike pods already reported, by cluster: only the current ones are kept.
type seenPods struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]map[types.UID]bool
}

// fresh are the pods of now not reported before; now becomes what was reported.
func (s *seenPods) fresh(cluster types.NamespacedName, now []*corev1.Pod) []*corev1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*corev1.Pod
	for _, p := range now {
		if !s.seen[cluster][p.UID] {
			out = append(out, p)
		}
	}
	s.setLocked(cluster, now)
	return out
}

func (s *seenPods) set(cluster types.NamespacedName, now []*corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(cluster, now)
}

func (s *seenPods) setLocked(cluster types.NamespacedName, now []*corev1.Pod) {
	if s.seen == nil {
		s.seen = map[types.NamespacedName]map[types.UID]bool{}
	}
	if len(now) == 0 {
		delete(s.seen, cluster)
		return
	}
	m := map[types.UID]bool{}
	for _, p := range now {
		m[p.UID] = true
	}
	s.seen[cluster] = m
}
