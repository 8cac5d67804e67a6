// Package upkeep puts a RedisCluster's lease upkeep ahead of its other work in the controller's
// queue. A renewal, a lease lookup or a scheduled rotation that comes due queues the cluster at
// Priority, in front of the clusters waiting for object writes, node retries or a rollout: a
// backlog of a thousand new clusters' objects delays a renewal by one reconcile, not by all of
// them.
//
// controller-runtime's priority queue takes a reconcile's "look again after" back at the priority
// the reconcile was taken at, so that once a cluster had its upkeep, all its later work would stay
// in front. Queue undoes that: such a requeue goes back at the default priority, and upkeep is
// raised again only when it is due (Timers). A failed reconcile keeps its priority for its retry:
// a renewal that failed is retried ahead of the backlog. A rotation somebody asks for is upkeep
// too (Asked): it is queued at Priority when asked, not behind the backlog.
package upkeep

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Priority is the queue priority of a cluster whose upkeep is due (the default is 0; events
// from the caches' first listing are -100).
const Priority = 100

// NewQueue makes the controller's queue (controller.Options.NewQueue): controller-runtime's
// priority queue, with the requeues of Queue.
func NewQueue(log logr.Logger) func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	return func(name string, rl workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
		return Queue{priorityqueue.New(name, func(o *priorityqueue.Opts[reconcile.Request]) {
			o.Log, o.RateLimiter = log.WithValues("controller", name), rl
		})}
	}
}

// Queue is a priority queue whose delayed adds without a rate limit (a reconcile's RequeueAfter)
// go in at the default priority, whatever priority the caller passes.
type Queue struct {
	priorityqueue.PriorityQueue[reconcile.Request]
}

// AddWithOpts adds items as o says, a RequeueAfter at the default priority.
func (q Queue) AddWithOpts(o priorityqueue.AddOpts, items ...reconcile.Request) {
	if o.After > 0 && !o.RateLimited {
		o.Priority = nil
	}
	q.PriorityQueue.AddWithOpts(o, items...)
}

// Timers queue each cluster at Priority when its upkeep comes due. They are a source of the
// controller (Source); Due sets a cluster's next upkeep.
type Timers struct {
	clock clock.WithDelayedExecution

	mu     sync.Mutex
	queue  priorityqueue.PriorityQueue[reconcile.Request] // nil until the controller starts
	timers map[types.NamespacedName]*timer
}

type timer struct {
	at time.Time
	t  clock.Timer
}

// NewTimers returns Timers on clk.
func NewTimers(clk clock.WithDelayedExecution) *Timers {
	return &Timers{clock: clk, timers: map[types.NamespacedName]*timer{}}
}

// Source is the Timers as a source of the controller, which must use a priority queue (NewQueue).
func (t *Timers) Source() source.Source {
	return source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
		if !ok {
			return errors.New("lease upkeep needs the controller's priority queue (controller.Options.NewQueue: upkeep.NewQueue)")
		}
		t.mu.Lock()
		t.queue = pq
		t.mu.Unlock()
		go func() {
			<-ctx.Done()
			t.mu.Lock()
			defer t.mu.Unlock()
			for key, tm := range t.timers {
				tm.t.Stop()
				delete(t.timers, key)
			}
		}()
		return nil
	})
}

// Due says that the upkeep of the cluster key is next due at at: then the cluster is queued at
// Priority. It replaces the time set before; a zero at clears it. Before the controller starts,
// due upkeep is dropped: the caches' first listing queues every cluster.
func (t *Timers) Due(key types.NamespacedName, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tm, ok := t.timers[key]; ok {
		if tm.at.Equal(at) {
			return
		}
		tm.t.Stop()
		delete(t.timers, key)
	}
	if at.IsZero() {
		return
	}
	tm := &timer{at: at}
	tm.t = t.clock.AfterFunc(at.Sub(t.clock.Now()), func() { t.fire(key, tm) })
	t.timers[key] = tm
}

// fire queues key at Priority, and forgets tm unless Due replaced it meanwhile.
func (t *Timers) fire(key types.NamespacedName, tm *timer) {
	t.mu.Lock()
	if t.timers[key] == tm {
		delete(t.timers, key)
	}
	q := t.queue
	t.mu.Unlock()
	if q != nil {
		q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(Priority)}, reconcile.Request{NamespacedName: key})
	}
}

// Forget drops the cluster key's timer (the cluster is gone).
func (t *Timers) Forget(key types.NamespacedName) { t.Due(key, time.Time{}) }

// Next is when the upkeep of the cluster key is next due, if a time is set.
func (t *Timers) Next(key types.NamespacedName) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tm, ok := t.timers[key]
	if !ok {
		return time.Time{}, false
	}
	return tm.at, true
}

// Asked is an event handler for the controller's own kind that queues an object at Priority when
// an update of its spec or metadata leaves it asking for upkeep (asked). A status-only update
// queues nothing: the reconcile's own status writes would otherwise requeue it at once, past a
// failed reconcile's backoff. Other events are left to the controller's other handlers; in a
// queue that is not a priority queue, it adds the object as any handler would.
func Asked(asked func(client.Object) bool) handler.EventHandler {
	specOrMetadata := predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{})
	return handler.Funcs{UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if e.ObjectNew == nil || !specOrMetadata.Update(e) || !asked(e.ObjectNew) {
			return
		}
		r := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(e.ObjectNew)}
		if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(Priority)}, r)
			return
		}
		q.Add(r)
	}}
}
