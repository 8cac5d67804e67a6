package rotation

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

// armedClock is a fake clock that reports the deadline of every timer the scheduler sets, so a
// test steps the clock only once the scheduler waits for the deadline it expects.
type armedClock struct {
	*testingclock.FakeClock
	armed chan time.Time
}

func newArmedClock(now time.Time) *armedClock {
	return &armedClock{FakeClock: testingclock.NewFakeClock(now), armed: make(chan time.Time, 1024)}
}

// NewTimer implements clock.Clock.
func (c *armedClock) NewTimer(d time.Duration) clock.Timer {
	timer := c.FakeClock.NewTimer(d)
	c.armed <- c.Now().Add(d)
	return timer
}

// waitArmed waits until the scheduler has set a timer for deadline.
func (c *armedClock) waitArmed(t *testing.T, deadline time.Time) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-c.armed:
			if got.Equal(deadline) {
				return
			}
		case <-timeout:
			t.Fatalf("the scheduler never waited for %s", deadline)
		}
	}
}

// start runs s until the test ends, then checks that Start returned.
func start(t *testing.T, s *Scheduler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start returned %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Start did not return after the context ended")
		}
	})
}

// receive returns the key of the next wake-up.
func receive(t *testing.T, s *Scheduler) types.NamespacedName {
	t.Helper()
	select {
	case ev := <-s.Events():
		return types.NamespacedName{Namespace: ev.Object.GetNamespace(), Name: ev.Object.GetName()}
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up")
		return types.NamespacedName{}
	}
}

// noMore fails if a wake-up is waiting in the channel.
func noMore(t *testing.T, s *Scheduler) {
	t.Helper()
	select {
	case ev := <-s.Events():
		t.Errorf("unexpected wake-up for %s/%s", ev.Object.GetNamespace(), ev.Object.GetName())
	default:
	}
}

var (
	keyA = types.NamespacedName{Namespace: "shop", Name: "a"}
	keyB = types.NamespacedName{Namespace: "shop", Name: "b"}
	// schedNow is 01:00; the daily 03:00 schedule last ran yesterday, so it is next due at 03:00.
	schedNow     = time.Date(2025, time.June, 2, 1, 0, 0, 0, time.UTC)
	yesterday3   = time.Date(2025, time.June, 1, 3, 0, 0, 0, time.UTC)
	today3       = time.Date(2025, time.June, 2, 3, 0, 0, 0, time.UTC)
	today5       = time.Date(2025, time.June, 2, 5, 0, 0, 0, time.UTC)
	tomorrow3    = time.Date(2025, time.June, 3, 3, 0, 0, 0, time.UTC)
	longTimeAgo  = time.Date(2025, time.May, 1, 3, 0, 0, 0, time.UTC)
	nothingAfter = time.Time{}
)

func TestSchedulerWakesDueEntries(t *testing.T) {
	daily := mustSchedule(t, "0 3 * * *")
	cases := map[string]func(t *testing.T, clk *armedClock, s *Scheduler){
		"a due entry wakes its reconciler, then waits for the next activation": func(t *testing.T, clk *armedClock, s *Scheduler) {
			s.Set(keyA, daily, yesterday3)
			clk.waitArmed(t, today3)
			noMore(t, s)
			clk.SetTime(today3)
			if got := receive(t, s); got != keyA {
				t.Errorf("woke %s, want %s", got, keyA)
			}
			clk.waitArmed(t, tomorrow3)
			noMore(t, s)
		},
		"a missed rotation wakes at once": func(t *testing.T, clk *armedClock, s *Scheduler) {
			s.Set(keyA, daily, longTimeAgo)
			if got := receive(t, s); got != keyA {
				t.Errorf("woke %s, want %s", got, keyA)
			}
			clk.waitArmed(t, today3)
		},
		"setting the same entry again does not wake it again": func(t *testing.T, clk *armedClock, s *Scheduler) {
			s.Set(keyA, daily, longTimeAgo)
			receive(t, s)
			s.Set(keyA, mustSchedule(t, "0 3 * * *"), longTimeAgo) // parsed again, same spec
			s.Set(keyB, daily, longTimeAgo)                        // barrier: a would come first
			if got := receive(t, s); got != keyB {
				t.Errorf("woke %s, want only %s", got, keyB)
			}
		},
		"an updated entry moves its wake-up": func(t *testing.T, clk *armedClock, s *Scheduler) {
			s.Set(keyA, daily, yesterday3)
			clk.waitArmed(t, today3)
			s.Set(keyA, mustSchedule(t, "0 5 * * *"), schedNow)
			clk.waitArmed(t, today5)
			s.Set(keyB, daily, yesterday3)
			clk.waitArmed(t, today3)
			clk.SetTime(today3)
			if got := receive(t, s); got != keyB {
				t.Errorf("woke %s at 03:00, want %s (a moved to 05:00)", got, keyB)
			}
			clk.waitArmed(t, today5)
			clk.SetTime(today5)
			if got := receive(t, s); got != keyA {
				t.Errorf("woke %s at 05:00, want %s", got, keyA)
			}
		},
		"a removed entry is not woken": func(t *testing.T, clk *armedClock, s *Scheduler) {
			s.Set(keyA, daily, yesterday3)
			s.Set(keyB, daily, yesterday3)
			s.Remove(keyA)
			clk.waitArmed(t, today3)
			clk.SetTime(today3)
			if got := receive(t, s); got != keyB {
				t.Errorf("woke %s, want only %s", got, keyB)
			}
			clk.waitArmed(t, tomorrow3)
			noMore(t, s)
		},
		"a nil schedule removes the entry": func(t *testing.T, clk *armedClock, s *Scheduler) {
			s.Set(keyA, daily, longTimeAgo)
			receive(t, s)
			s.Set(keyA, nil, longTimeAgo)
			s.Set(keyB, daily, longTimeAgo)
			if got := receive(t, s); got != keyB {
				t.Errorf("woke %s, want %s", got, keyB)
			}
			if _, ok := nextWake(s, keyA); ok {
				t.Errorf("entry %s still present", keyA)
			}
		},
	}
	for name, run := range cases {
		t.Run(name, func(t *testing.T) {
			clk := newArmedClock(schedNow)
			s := NewScheduler(clk)
			start(t, s)
			run(t, clk, s)
		})
	}
}

func TestSchedulerEntries(t *testing.T) {
	clk := testingclock.NewFakeClock(schedNow)
	s := NewScheduler(clk)
	daily := mustSchedule(t, "0 3 * * *")
	steps := []struct {
		name string
		do   func()
		key  types.NamespacedName
		want time.Time // zero with present false
		ok   bool
	}{
		{name: "added", do: func() { s.Set(keyA, daily, yesterday3) }, key: keyA, want: today3, ok: true},
		{name: "updated", do: func() { s.Set(keyA, daily, today3) }, key: keyA, want: tomorrow3, ok: true},
		{name: "never rotated has no wake-up", do: func() { s.Set(keyB, daily, time.Time{}) }, key: keyB, want: nothingAfter, ok: true},
		{name: "removed", do: func() { s.Remove(keyA) }, key: keyA, ok: false},
		{name: "others kept", do: func() {}, key: keyB, want: nothingAfter, ok: true},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			step.do()
			got, ok := nextWake(s, step.key)
			if ok != step.ok || !got.Equal(step.want) {
				t.Errorf("entry %s: next %s present %v, want %s present %v", step.key, got, ok, step.want, step.ok)
			}
		})
	}
}

func TestSchedulerLifecycle(t *testing.T) {
	cases := map[string]func(t *testing.T){
		"needs leader election": func(t *testing.T) {
			if !NewScheduler(clock.RealClock{}).NeedLeaderElection() {
				t.Error("NeedLeaderElection() = false, want true")
			}
		},
		"starts once": func(t *testing.T) {
			s := NewScheduler(testingclock.NewFakeClock(schedNow))
			start(t, s)
			eventually(t, "the scheduler starts", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.started })
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // a second loop would return nil at once
			if err := s.Start(ctx); err == nil {
				t.Error("second Start returned nil, want an error")
			}
		},
		"stops while nobody reads its events": func(t *testing.T) {
			s := NewScheduler(testingclock.NewFakeClock(schedNow))
			daily := mustSchedule(t, "0 3 * * *")
			for i := range 2 * eventBuffer {
				s.Set(types.NamespacedName{Namespace: "ns", Name: string(rune('a'+i%26)) + string(rune('a'+i/26))}, daily, longTimeAgo)
			}
			start(t, s) // the cleanup fails the test if Start does not return
			eventually(t, "the event buffer fills", func() bool { return len(s.events) == cap(s.events) })
		},
	}
	for name, run := range cases {
		t.Run(name, run)
	}
}

// eventually polls cond until it holds, failing the test after 10 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// nextWake returns when key is next woken and whether it has an entry.
func nextWake(s *Scheduler, key types.NamespacedName) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[key]
	if !ok {
		return time.Time{}, false
	}
	return e.next, true
}
