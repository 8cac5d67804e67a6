package connection

import (
	"sync"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	"github.com/keyroll/keyroll/vault"
)

// sharedLimits keeps, per VaultConnection, the keys of its clients in the cache (the connection's
// own, and one per namespace with identity Namespace), the rate limiter its namespaces' clients
// share, so that spec.rateLimit bounds the connection as a whole, and the turns its namespaces'
// deferrable rotations take within that rate (turns.go).
type sharedLimits struct {
	mu       sync.Mutex
	keys     map[string]map[string]bool
	limiters map[string]limiterEntry
	turns    map[string]*rotationTurns
}

type limiterEntry struct {
	settings vault.RateLimit
	limiter  *rate.Limiter
}

// key is the cache key of the client of connection for namespace ("": the connection's own).
func (s *sharedLimits) key(connection, namespace string) string {
	key := connection
	if namespace != "" {
		key += "/" + namespace
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]map[string]bool{}
	}
	if s.keys[connection] == nil {
		s.keys[connection] = map[string]bool{}
	}
	s.keys[connection][key] = true
	return key
}

// limiter is the limiter that connection's namespaces share, new when its settings change.
func (s *sharedLimits) limiter(connection string, settings vault.RateLimit) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.limiters[connection]; ok && e.settings == settings {
		return e.limiter
	}
	if s.limiters == nil {
		s.limiters = map[string]limiterEntry{}
	}
	qps, burst := settings.QPS, settings.Burst
	if qps <= 0 || burst <= 0 {
		qps, burst = vault.DefaultQPS, vault.DefaultBurst
	}
	l := rate.NewLimiter(rate.Limit(qps), burst)
	s.limiters[connection] = limiterEntry{settings: settings, limiter: l}
	return l
}

// rotationTurns are the turns of connection's deferrable rotations, new when its settings change.
func (s *sharedLimits) rotationTurns(connection string, settings vault.RateLimit, clk clock.PassiveClock) *rotationTurns {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.turns[connection]; ok && t.settings == settings {
		return t
	}
	if s.turns == nil {
		s.turns = map[string]*rotationTurns{}
	}
	t := newRotationTurns(settings, clk)
	s.turns[connection] = t
	return t
}

// forget drops what is kept of connection and returns the cache keys of its clients.
func (s *sharedLimits) forget(connection string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := []string{connection}
	for k := range s.keys[connection] {
		if k != connection {
			keys = append(keys, k)
		}
	}
	delete(s.keys, connection)
	delete(s.limiters, connection)
	delete(s.turns, connection)
	return keys
}
