// A connection's rate (spec.rateLimit) is shared by every namespace that uses it, and not all of
// its work is equally urgent. Renewals and lookups keep leases alive: one that misses its deadline
// can cost a live credential. A rotation that replaces a credential still good (rotate-now, a
// scheduled rotation: rotation.Decision.Deferrable) can wait a few seconds without harm. Without a
// bound, one namespace that asks a hundred clusters to rotate at once puts a hundred issues on the
// connection's rate limiter ahead of every other namespace's renewals, which then miss their
// deadlines. So such a rotation first takes its turn here: within its namespace's share of the
// connection's rate, and within the share that all namespaces' rotations have together. The rest
// of the rate, at least half, is left to what keeps leases alive, which never waits here.

package connection

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	"github.com/keyroll/keyroll/vault"
)

const (
	// namespaceShare and rotationsShare divide a connection's qps and burst: one namespace's
	// deferrable rotations may take a quarter of them, those of all namespaces together a half.
	namespaceShare = 4
	rotationsShare = 2
	// maxTurns bounds the turns one connection holds for rotations waiting, and maxNamespaces the
	// namespaces it keeps a bucket for; a rotation that finds them full waits noRoomWait without a
	// turn and asks again.
	maxTurns      = 8192
	maxNamespaces = 4096
	noRoomWait    = time.Minute
	// turnKept is how long a turn waits for its cluster to come back for it (a deleted cluster, or
	// one whose rotation was made for another reason meanwhile, never does).
	turnKept = time.Minute
	// sweepEvery is how often idle namespaces and abandoned turns are dropped.
	sweepEvery = time.Second
)

// rotationTurns rations one connection's deferrable rotations. Each namespace has a token bucket
// at its share of the connection's rate, and all namespaces have one together; a rotation goes
// ahead with a token of both. One that cannot have its token now is given a turn: the token is
// reserved for it from the bucket's future and it is told when to come back, so that a namespace's
// waiting rotations come back one by one at its rate rather than all at once, again and again.
// The namespace's token comes first and the shared one only once that turn has come, so that the
// shared bucket serves the namespaces in the order their turns come: one with a thousand
// rotations cannot reserve it ahead of the others.
type rotationTurns struct {
	clock clock.PassiveClock
	// settings are the connection's rate limit the shares were made from.
	settings vault.RateLimit
	// qps and burst of a namespace's bucket (the shared one's are made at once).
	qps   rate.Limit
	burst int

	mu         sync.Mutex
	all        *rate.Limiter
	namespaces map[string]*namespaceTurns
	turns      int // held, over all namespaces
	swept      time.Time
}

// namespaceTurns are one namespace's bucket and the turns of its clusters, by name.
type namespaceTurns struct {
	limiter *rate.Limiter
	turns   map[string]turn
}

// turn is a waiting rotation's place: when it may go ahead, and whether the shared token is
// reserved for it too (else the namespace's alone).
type turn struct {
	at  time.Time
	all bool
}

func newRotationTurns(settings vault.RateLimit, clk clock.PassiveClock) *rotationTurns {
	qps, burst := settings.QPS, settings.Burst
	if qps <= 0 || burst <= 0 {
		qps, burst = vault.DefaultQPS, vault.DefaultBurst
	}
	return &rotationTurns{
		clock: clk, settings: settings, qps: rate.Limit(qps / namespaceShare), burst: max(1, burst/namespaceShare),
		all:        rate.NewLimiter(rate.Limit(qps/rotationsShare), max(1, burst/rotationsShare)),
		namespaces: map[string]*namespaceTurns{},
	}
}

// take says how long the rotation of cluster, of namespace, waits for its turn; zero: it goes
// ahead now, and its tokens are spent.
func (r *rotationTurns) take(namespace, cluster string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.sweep(now)
	ns := r.namespaces[namespace]
	if ns == nil {
		if len(r.namespaces) >= maxNamespaces {
			return noRoomWait
		}
		ns = &namespaceTurns{limiter: rate.NewLimiter(r.qps, r.burst), turns: map[string]turn{}}
		r.namespaces[namespace] = ns
	}
	t, held := ns.turns[cluster]
	if held && now.Before(t.at) {
		return t.at.Sub(now) // it came back early (another event woke it)
	}
	if !held {
		if r.turns >= maxTurns {
			return noRoomWait
		}
		if wait := ns.limiter.ReserveN(now, 1).DelayFrom(now); wait > 0 {
			r.hold(ns, cluster, turn{at: now.Add(wait)})
			return wait
		}
	}
	if !t.all {
		if wait := r.all.ReserveN(now, 1).DelayFrom(now); wait > 0 {
			r.hold(ns, cluster, turn{at: now.Add(wait), all: true})
			return wait
		}
	}
	if held {
		delete(ns.turns, cluster)
		r.turns--
	}
	return 0
}

func (r *rotationTurns) hold(ns *namespaceTurns, cluster string, t turn) {
	if _, ok := ns.turns[cluster]; !ok {
		r.turns++
	}
	ns.turns[cluster] = t
}

// sweep drops, at most once per sweepEvery, the turns no one came back for within turnKept, and
// the namespaces that hold no turn and whose bucket is full again: a new bucket would be the same,
// so nothing is lost, and the namespaces kept are only those that rotated lately.
func (r *rotationTurns) sweep(now time.Time) {
	if now.Sub(r.swept) < sweepEvery {
		return
	}
	r.swept = now
	for name, ns := range r.namespaces {
		for cluster, t := range ns.turns {
			if now.Sub(t.at) > turnKept {
				delete(ns.turns, cluster)
				r.turns--
			}
		}
		if len(ns.turns) == 0 && ns.limiter.TokensAt(now) >= float64(ns.limiter.Burst()) {
			delete(r.namespaces, name)
		}
	}
}
