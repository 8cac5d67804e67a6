package connection

import (
	"fmt"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"

	"github.com/keyroll/keyroll/vault"
)

var turnsEpoch = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// waiter is one cluster whose rotation asks for its turn whenever it is told to come back, as its
// reconcile would.
type waiter struct {
	namespace, name string
	next            time.Time
	asks            int
	admitted        time.Time
}

// TestRotationTurnsShareTheRateFairly: on a connection of 20 requests a second (burst 20), three
// namespaces ask for rotations at once, one of them for a hundred. No namespace's rotations go
// faster than a quarter of the rate, all of them together not faster than half; the two small
// namespaces are served alongside the big one, not after it; and each rotation asks at most three
// times (its namespace's turn, the shared turn, the go-ahead), so that waiting rotations do not
// come back all at once again and again.
func TestRotationTurnsShareTheRateFairly(t *testing.T) {
	clk := testclock.NewFakeClock(turnsEpoch)
	turns := newRotationTurns(vault.RateLimit{QPS: 20, Burst: 20}, clk)
	var all []*waiter
	for ns, n := range map[string]int{"team-a": 100, "team-b": 20, "team-c": 20} {
		for i := range n {
			all = append(all, &waiter{namespace: ns, name: fmt.Sprintf("redis-%d", i), next: turnsEpoch})
		}
	}
	const step, span = 10 * time.Millisecond, 20 * time.Second
	for clk.Now().Before(turnsEpoch.Add(span)) {
		now := clk.Now()
		for _, w := range all {
			if !w.admitted.IsZero() || now.Before(w.next) {
				continue
			}
			w.asks++
			if wait := turns.take(w.namespace, w.name); wait > 0 {
				w.next = now.Add(wait)
			} else {
				w.admitted = now
			}
		}
		clk.Step(step)
	}

	// Within any time from the start, a token bucket lets through at most its burst and its rate.
	within := func(d time.Duration, ns string) int {
		n := 0
		for _, w := range all {
			if !w.admitted.IsZero() && !w.admitted.After(turnsEpoch.Add(d)) && (ns == "" || w.namespace == ns) {
				n++
			}
		}
		return n
	}
	for d := time.Duration(0); d <= span; d += 500 * time.Millisecond {
		for _, ns := range []string{"team-a", "team-b", "team-c"} {
			if got, most := within(d, ns), 5+int(5*d.Seconds())+1; got > most {
				t.Errorf("%s: %d rotations within %s, more than a quarter of the rate allows (%d)", ns, got, d, most)
			}
		}
		if got, most := within(d, ""), 10+int(10*d.Seconds())+1; got > most {
			t.Errorf("%d rotations within %s, more than half of the rate allows (%d)", got, d, most)
		}
	}
	for _, ns := range []string{"team-b", "team-c"} {
		if got := within(8*time.Second, ns); got != 20 {
			t.Errorf("%s: %d of 20 rotations within 8 s: served after team-a, not alongside it", ns, got)
		}
	}
	if got := within(8*time.Second, "team-a"); got < 25 {
		t.Errorf("team-a: %d rotations within 8 s, want its part of the shared rate meanwhile", got)
	}
	for _, w := range all {
		if w.admitted.IsZero() && w.namespace != "team-a" {
			t.Errorf("%s/%s never went ahead", w.namespace, w.name)
		}
		if w.asks > 3 {
			t.Errorf("%s/%s asked %d times for its turn, want at most 3", w.namespace, w.name, w.asks)
		}
	}
}

// TestRotationTurnsStayBounded: namespaces that rotated once and then went quiet are forgotten,
// turns that no one comes back for are dropped after turnKept, and no more than maxTurns turns
// are held: a rotation beyond them waits without one.
func TestRotationTurnsStayBounded(t *testing.T) {
	clk := testclock.NewFakeClock(turnsEpoch)
	turns := newRotationTurns(vault.RateLimit{QPS: 20, Burst: 20}, clk)
	kept := func() (int, int) {
		turns.mu.Lock()
		defer turns.mu.Unlock()
		return len(turns.namespaces), turns.turns
	}

	most := 0
	for i := range 5000 { // namespaces come and go, each rotating once
		if wait := turns.take(fmt.Sprintf("ns-%d", i), "redis"); wait > 0 {
			t.Fatalf("the first rotation of a new namespace waits %s", wait)
		}
		if n, _ := kept(); n > most {
			most = n
		}
		clk.Step(200 * time.Millisecond) // a rotation every 200 ms: within the shared rate
	}
	if most > 10 {
		t.Errorf("%d namespaces kept at once, though each rotated once and went quiet", most)
	}

	for i := range 50 { // rotations that are never taken up again
		turns.take("team-a", fmt.Sprintf("redis-%d", i))
	}
	if _, held := kept(); held != 45 {
		t.Errorf("%d turns held, want 45: the namespace's burst of 5 went ahead", held)
	}
	clk.Step(turnKept + 10*time.Second + sweepEvery) // the last turn came 9 s on
	turns.take("team-b", "redis")
	if n, held := kept(); n != 1 || held != 0 {
		t.Errorf("after turnKept: %d namespaces, %d turns kept; want team-b's alone, without turns", n, held)
	}

	for i := range maxTurns + 5 + 10 {
		turns.take("team-c", fmt.Sprintf("redis-%d", i))
	}
	if _, held := kept(); held != maxTurns {
		t.Errorf("%d turns held, want at most %d", held, maxTurns)
	}
	if wait := turns.take("team-c", "one-more"); wait != noRoomWait {
		t.Errorf("a rotation with every turn taken waits %s, want %s without a turn", wait, noRoomWait)
	}
}
