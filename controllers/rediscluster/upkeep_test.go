package rediscluster

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/upkeep"
)

// TestLeaseUpkeepIsQueuedAheadWhenDue: once a cluster has its credential, its next lease upkeep
// (here the lease lookup, before the renewal) is set at the time its ledger plans; at that time
// the cluster is queued at upkeep.Priority, and the reconcile then sets the next one.
func TestLeaseUpkeepIsQueuedAheadWhenDue(t *testing.T) {
	h := newHarness(t, cluster())
	rc := h.settle(t)
	key := client.ObjectKeyFromObject(rc)
	at, ok := h.r.upkeep.Next(key)
	if !ok {
		t.Fatal("no lease upkeep is set for a cluster with a live lease")
	}
	if renewal := rc.Status.Credential.Lease.NextRenewal.Time; !at.After(h.clock.Now()) || at.After(renewal) {
		t.Fatalf("upkeep set at %v; want after now (%v) and no later than the planned renewal (%v)", at, h.clock.Now(), renewal)
	}

	q := upkeep.NewQueue(logr.Discard())(t.Name(), workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]()).(priorityqueue.PriorityQueue[reconcile.Request])
	defer q.ShutDown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := h.r.upkeep.Source().Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	h.clock.SetTime(at)
	for deadline := time.Now().Add(time.Second); q.Len() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the cluster was not queued when its upkeep came due")
		}
	}
	got, prio, _ := q.GetWithPriority()
	if got.NamespacedName != key || prio != upkeep.Priority {
		t.Fatalf("queued %v at %d, want %v at %d", got, prio, key, upkeep.Priority)
	}
	lookups := h.vault.Calls("lookup")
	h.reconcile(t)
	if h.vault.Calls("lookup") != lookups+1 {
		t.Errorf("the reconcile at the upkeep time made %d lease lookups, want 1", h.vault.Calls("lookup")-lookups)
	}
	if next, ok := h.r.upkeep.Next(key); !ok || !next.After(at) {
		t.Errorf("after the upkeep the next is set at %v (%v), want after %v", next, ok, at)
	}
}

// TestARotationAskedForIsUpkeep: the controller queues a cluster ahead of other work (package
// upkeep's Asked) while its rotate-now annotation has a value not yet acted on, unless rotations
// are paused.
func TestARotationAskedForIsUpkeep(t *testing.T) {
	for _, c := range []struct {
		annotation, acknowledged string
		paused, want             bool
	}{
		{"", "", false, false},
		{"1733390000", "", false, true},
		{"1733390000", "1733300000", false, true},
		{"1733390000", "1733390000", false, false},
		{"1733390000", "", true, false},
	} {
		rc := cluster()
		rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: c.annotation}
		rc.Status.RotateNowAcknowledged, rc.Spec.Rotation.Paused = c.acknowledged, c.paused
		if got := rc.RotationAsked(); got != c.want {
			t.Errorf("annotation %q, acknowledged %q, paused %v: asked %v, want %v", c.annotation, c.acknowledged, c.paused, got, c.want)
		}
	}
}
