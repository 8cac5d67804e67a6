package upkeep

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func req(name string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "shop", Name: name}}
}

// newQueue is the controller's queue as NewQueue makes it, shut down at the end of the test.
func newQueue(t *testing.T) priorityqueue.PriorityQueue[reconcile.Request] {
	t.Helper()
	q := NewQueue(logr.Discard())(t.Name(), workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Millisecond, time.Second))
	t.Cleanup(q.ShutDown)
	pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
	if !ok {
		t.Fatalf("NewQueue made a %T, not a priority queue", q)
	}
	return pq
}

// started is Timers on a fake clock, started as the controller's source on q.
func started(t *testing.T, q workqueue.TypedRateLimitingInterface[reconcile.Request]) (*Timers, *testclock.FakeClock) {
	t.Helper()
	clk := testclock.NewFakeClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	timers := NewTimers(clk)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := timers.Source().Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	return timers, clk
}

// next takes the next item off q, failing the test if none comes within a second.
func next(t *testing.T, q priorityqueue.PriorityQueue[reconcile.Request]) (string, int) {
	t.Helper()
	got := make(chan struct {
		r reconcile.Request
		p int
	}, 1)
	go func() {
		r, p, _ := q.GetWithPriority()
		got <- struct {
			r reconcile.Request
			p int
		}{r, p}
	}()
	select {
	case g := <-got:
		q.Done(g.r)
		return g.r.Name, g.p
	case <-time.After(time.Second):
		t.Fatal("nothing was queued")
		return "", 0
	}
}

// waitLen waits until q holds n items ready to take, for the timers' goroutines.
func waitLen(t *testing.T, q priorityqueue.PriorityQueue[reconcile.Request], n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); q.Len() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the queue holds %d items ready, want %d", q.Len(), n)
		}
	}
}

// TestDueUpkeepGoesAheadOfABacklog: with a thousand clusters queued for other work, a cluster
// whose upkeep comes due is the next one taken, at Priority; one not due yet stays where it is.
func TestDueUpkeepGoesAheadOfABacklog(t *testing.T) {
	q := newQueue(t)
	timers, clk := started(t, q)
	for i := range 1000 {
		q.Add(req(fmt.Sprintf("backlog-%d", i)))
	}
	timers.Due(req("renew").NamespacedName, clk.Now().Add(80*time.Second))
	timers.Due(req("later").NamespacedName, clk.Now().Add(90*time.Second))
	if at, ok := timers.Next(req("renew").NamespacedName); !ok || !at.Equal(clk.Now().Add(80*time.Second)) {
		t.Fatalf("Next = %v, %v; want the time set", at, ok)
	}
	clk.Step(80 * time.Second)
	waitLen(t, q, 1001)
	if name, prio := next(t, q); name != "renew" || prio != Priority {
		t.Fatalf("took %s at priority %d first, want renew at %d", name, prio, Priority)
	}
	if name, prio := next(t, q); name != "backlog-0" || prio != 0 {
		t.Fatalf("then took %s at priority %d, want backlog-0 at 0 (later is not due)", name, prio)
	}
	if _, ok := timers.Next(req("renew").NamespacedName); ok {
		t.Error("a fired upkeep time is still set")
	}
}

// TestDueReplacesAndForgetClears: a later Due replaces the time set before, and Forget clears it.
func TestDueReplacesAndForgetClears(t *testing.T) {
	q := newQueue(t)
	timers, clk := started(t, q)
	key, gone := req("renew").NamespacedName, req("gone").NamespacedName
	timers.Due(key, clk.Now().Add(10*time.Second))
	timers.Due(key, clk.Now().Add(20*time.Second))
	timers.Due(gone, clk.Now().Add(10*time.Second))
	timers.Forget(gone)
	clk.Step(10 * time.Second)
	time.Sleep(20 * time.Millisecond) // a timer that wrongly fired would have queued by now
	if n := q.Len(); n != 0 {
		t.Fatalf("%d items queued at the replaced or forgotten time, want none", n)
	}
	clk.Step(10 * time.Second)
	waitLen(t, q, 1)
	if name, prio := next(t, q); name != "renew" || prio != Priority {
		t.Fatalf("took %s at %d, want renew at %d", name, prio, Priority)
	}
}

// TestRequeueAfterGoesBackAtTheDefaultPriority: a reconcile taken at Priority that asks to be
// looked at again later goes back at the default priority, behind work queued before it; one
// that failed keeps its priority for its retry.
func TestRequeueAfterGoesBackAtTheDefaultPriority(t *testing.T) {
	q := newQueue(t)
	q.Add(req("backlog"))
	q.AddWithOpts(priorityqueue.AddOpts{After: time.Millisecond, Priority: ptr.To(Priority)}, req("requeued"))
	waitLen(t, q, 2)
	if name, prio := next(t, q); name != "backlog" || prio != 0 {
		t.Fatalf("took %s at %d first, want backlog at 0 (requeued goes back at 0, after it)", name, prio)
	}
	if name, prio := next(t, q); name != "requeued" || prio != 0 {
		t.Fatalf("took %s at %d, want requeued at 0", name, prio)
	}

	q.Add(req("backlog"))
	q.AddWithOpts(priorityqueue.AddOpts{RateLimited: true, Priority: ptr.To(Priority)}, req("failed"))
	waitLen(t, q, 2)
	if name, prio := next(t, q); name != "failed" || prio != Priority {
		t.Fatalf("took %s at %d first, want the failed one's retry at %d", name, prio, Priority)
	}
}

// TestTimersNeedThePriorityQueue: started on a plain queue, the source says what it needs.
func TestTimersNeedThePriorityQueue(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	err := NewTimers(testclock.NewFakeClock(time.Now())).Source().Start(context.Background(), q)
	if err == nil {
		t.Fatal("started on a plain queue")
	}
	t.Log(err)
}

// TestAskedUpkeepGoesAheadOfABacklog: an update that leaves an object asking for upkeep queues it
// ahead of a thousand queued, at Priority, even when it was queued among them already; an update
// that asks for nothing, or changes only the status of one that asks, queues nothing.
func TestAskedUpkeepGoesAheadOfABacklog(t *testing.T) {
	q := newQueue(t)
	for i := range 1000 {
		q.Add(req(fmt.Sprintf("backlog-%d", i)))
	}
	asked := func(o client.Object) bool { return o.GetAnnotations()["rotate"] == "now" }
	obj := func(name string, annotations map[string]string) client.Object {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Annotations: annotations}}
	}
	h := Asked(asked)
	h.Update(context.Background(), event.UpdateEvent{ObjectOld: obj("quiet", nil), ObjectNew: obj("quiet", map[string]string{"other": "x"})}, q)
	now := map[string]string{"rotate": "now"}
	h.Update(context.Background(), event.UpdateEvent{ObjectOld: obj("status-only", now), ObjectNew: obj("status-only", now)}, q)
	h.Update(context.Background(), event.UpdateEvent{ObjectOld: obj("backlog-500", nil), ObjectNew: obj("backlog-500", map[string]string{"rotate": "now"})}, q)
	h.Update(context.Background(), event.UpdateEvent{ObjectOld: obj("rotate", nil), ObjectNew: obj("rotate", map[string]string{"rotate": "now"})}, q)
	waitLen(t, q, 1001)
	for _, want := range []string{"backlog-500", "rotate"} {
		if name, prio := next(t, q); name != want || prio != Priority {
			t.Fatalf("took %s at priority %d, want %s at %d", name, prio, want, Priority)
		}
	}
	if name, prio := next(t, q); name != "backlog-0" || prio != 0 {
		t.Fatalf("then took %s at %d, want backlog-0 at 0", name, prio)
	}
}
