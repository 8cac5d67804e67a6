package rotation

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// eventBuffer is how many wake-ups may wait in the channel before the scheduler blocks on it.
const eventBuffer = 128

var (
	_ manager.Runnable               = (*Scheduler)(nil)
	_ manager.LeaderElectionRunnable = (*Scheduler)(nil)
)

// Scheduler wakes the reconciler of each RedisCluster when its scheduled rotation falls due, by
// sending a GenericEvent that carries only the object's namespace and name. It writes nothing:
// whether to rotate is for Decide to say, in the reconciler. Controllers feed it with Set and
// Remove and watch Events with WatchesRawSource(source.Channel(s.Events(), ...)).
//
// It runs as a manager.Runnable in the elected leader only. It is driven by the injected clock with
// one goroutine and one timer set to the earliest due entry, rather than by robfig/cron's Cron
// runner: that runner reads the wall clock (untestable with a fake clock, against the rule of no
// time.Now in rotation logic), and its entries know nothing of the last rotation, so it could not
// fire at once for a rotation missed while the operator was down. robfig/cron still parses and
// computes the schedules (ParseSchedule).
type Scheduler struct {
	clock  clock.Clock
	events chan event.GenericEvent
	wake   chan struct{} // capacity 1: Set and Remove never block

	mu      sync.Mutex
	entries map[types.NamespacedName]*entry
	started bool
}

// entry is one RedisCluster's schedule.
type entry struct {
	spec string
	sch  Schedule
	last time.Time
	next time.Time // when the reconciler is next woken; zero when never
}

// NewScheduler returns a Scheduler that reads time from clk.
func NewScheduler(clk clock.Clock) *Scheduler {
	return &Scheduler{
		clock:   clk,
		events:  make(chan event.GenericEvent, eventBuffer),
		wake:    make(chan struct{}, 1),
		entries: map[types.NamespacedName]*entry{},
	}
}

// Events is the channel the reconciler watches. It is never closed.
func (s *Scheduler) Events() <-chan event.GenericEvent { return s.events }

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the leader wakes reconcilers.
func (s *Scheduler) NeedLeaderElection() bool { return true }

// Set schedules key's rotations: it is woken at NextRotation(sch, last), at once if that has
// passed. Setting the same schedule (by String) and last again changes nothing, so a reconciler
// may call Set on every reconcile without being woken again for a rotation it chose not to start
// (paused, outside the maintenance window). After a wake-up the entry moves to the schedule's next
// activation. A nil schedule removes the entry.
func (s *Scheduler) Set(key types.NamespacedName, sch Schedule, last time.Time) {
	if sch == nil {
		s.Remove(key)
		return
	}
	s.mu.Lock()
	old, ok := s.entries[key]
	if ok && old.spec == sch.String() && old.last.Equal(last) {
		s.mu.Unlock()
		return
	}
	s.entries[key] = &entry{spec: sch.String(), sch: sch, last: last, next: NextRotation(sch, last)}
	s.mu.Unlock()
	s.poke()
}

// Remove forgets key; it is not woken any more.
func (s *Scheduler) Remove(key types.NamespacedName) {
	s.mu.Lock()
	delete(s.entries, key)
	s.mu.Unlock()
	s.poke()
}

// Start implements manager.Runnable: it wakes due entries until ctx ends, then returns nil with
// no goroutine left behind. It may be called once.
func (s *Scheduler) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("rotation scheduler: already started")
	}
	s.started = true
	s.mu.Unlock()
	for {
		if !s.send(ctx, s.takeDue()) || !s.wait(ctx) {
			return nil
		}
	}
}

// poke tells the loop that the entries changed.
func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// takeDue returns the keys due now, in order, and moves each to its next activation.
func (s *Scheduler) takeDue() []types.NamespacedName {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var keys []types.NamespacedName
	for key, e := range s.entries {
		if due(e.next, now) {
			keys = append(keys, key)
			e.next = e.sch.Next(now)
		}
	}
	slices.SortFunc(keys, func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return keys
}

// send delivers one wake-up per key; false when ctx ended first.
func (s *Scheduler) send(ctx context.Context, keys []types.NamespacedName) bool {
	for _, key := range keys {
		obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		select {
		case s.events <- event.GenericEvent{Object: obj}:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// wait blocks until the earliest entry is due, the entries change or ctx ends (then false).
func (s *Scheduler) wait(ctx context.Context) bool {
	var fire <-chan time.Time
	if next := s.earliest(); !next.IsZero() {
		d := next.Sub(s.clock.Now())
		if d <= 0 {
			return ctx.Err() == nil
		}
		timer := s.clock.NewTimer(d)
		defer timer.Stop()
		fire = timer.C()
	}
	select {
	case <-ctx.Done():
		return false
	case <-s.wake:
	case <-fire:
	}
	return true
}

// earliest returns the earliest time an entry is due, or zero when none is.
func (s *Scheduler) earliest() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var earliest time.Time
	for _, e := range s.entries {
		if !e.next.IsZero() && (earliest.IsZero() || e.next.Before(earliest)) {
			earliest = e.next
		}
	}
	return earliest
}
