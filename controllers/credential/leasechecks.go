package credential

import (
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// DefaultLeaseCheckInterval is how often a live lease is looked up in Vault, besides its renewals,
// so that a lease revoked outside keyroll is noticed within about that long.
const DefaultLeaseCheckInterval = time.Minute

// LeaseChecks remembers, in memory, when each cluster's live leases (the current one, and the
// superseded ones a rollout still needs) were last confirmed in Vault (looked up or renewed), so
// that each is looked up again one interval later. After a restart the last renewal (or issue) in
// the status stands in for it. Intervals are jittered per cluster by up
// to a tenth, so that a thousand clusters do not look up in the same second.
type LeaseChecks struct {
	interval time.Duration

	mu sync.Mutex
	// last is when each lease of each cluster was last confirmed.
	last map[types.NamespacedName]map[string]time.Time
	// now are the clusters whose lease is looked up at their next reconcile (Now).
	now map[types.NamespacedName]bool
}

// NewLeaseChecks looks each live lease up every interval (zero or less: never).
func NewLeaseChecks(interval time.Duration) *LeaseChecks {
	return &LeaseChecks{interval: interval, last: map[types.NamespacedName]map[string]time.Time{}, now: map[types.NamespacedName]bool{}}
}

// Next is when the lease of key is next looked up; confirmed is when the status last saw it
// alive (its last renewal or issue). Zero when lease checks are off.
func (l *LeaseChecks) Next(key types.NamespacedName, lease string, confirmed time.Time) time.Time {
	if l == nil || l.interval <= 0 {
		return time.Time{}
	}
	l.mu.Lock()
	checked := l.last[key][lease]
	now := l.now[key]
	l.mu.Unlock()
	if now {
		return time.Unix(0, 0) // long due
	}
	at := confirmed
	if checked.After(at) {
		at = checked
	}
	if at.IsZero() {
		return time.Time{}
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key.String()))
	jitter := time.Duration(float64(l.interval/10) * float64(h.Sum32()%1000) / 1000)
	return at.Add(l.interval - jitter)
}

// Checked records that the lease of key was confirmed alive at at.
func (l *LeaseChecks) Checked(key types.NamespacedName, lease string, at time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last[key] == nil {
		l.last[key] = map[string]time.Time{}
	}
	l.last[key][lease] = at
	delete(l.now, key)
}

// Retain forgets the confirmations of the cluster's leases other than leases (those no longer
// live: revoked, or gone from the ledger).
func (l *LeaseChecks) Retain(key types.NamespacedName, leases []string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.last[key] {
		if !slices.Contains(leases, id) {
			delete(l.last[key], id)
		}
	}
}

// Now has the lease of key looked up at the cluster's next reconcile, before anything else is
// done with it: a user of its credential has gone from a Redis node, as Vault's plugin deletes it
// when the lease is revoked (lease checks on).
func (l *LeaseChecks) Now(key types.NamespacedName) {
	if l == nil || l.interval <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.now[key] = true
}

// Forget drops what is kept of a deleted cluster.
func (l *LeaseChecks) Forget(key types.NamespacedName) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.last, key)
	delete(l.now, key)
}
