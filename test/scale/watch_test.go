package scale

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// seenWatch notes when each object of one kind in the run's namespace first satisfied a predicate,
// from a watch: waiting costs the API server one stream of changes, not a list of every object
// ten times a second (at N = 1,000 such lists are megabytes each, encoded on the same two cores
// that serve the operator).
type seenWatch struct {
	mu   sync.Mutex
	seen map[string]time.Time
	// last is each object as last seen.
	last map[string]client.Object
}

// watchSeen starts a watch of obj's kind in the run's namespace; it returns once the watch has
// listed what exists.
func watchSeen(b *testing.B, r *run, obj client.Object, want func(client.Object) bool) *seenWatch {
	b.Helper()
	c, err := cache.New(r.fw.Ground.CP.Config, cache.Options{Scheme: framework.Scheme(), DefaultNamespaces: map[string]cache.Config{r.ns: {}}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	w := &seenWatch{seen: map[string]time.Time{}, last: map[string]client.Object{}}
	see := func(o any) {
		obj, ok := o.(client.Object)
		if !ok {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.last[obj.GetName()] = obj
		if _, ok := w.seen[obj.GetName()]; !ok && want(obj) {
			w.seen[obj.GetName()] = time.Now()
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }}); err != nil {
		cancel()
		b.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	r.stop = append(r.stop, cancel)
	if !c.WaitForCacheSync(ctx) {
		b.Fatal("the watch did not sync")
	}
	return w
}

// wait waits until n objects were seen, and returns when the last one was, counted from start.
// dead says why waiting is pointless ("" while the controller runs).
func (w *seenWatch) wait(b *testing.B, start time.Time, n int, timeout time.Duration, dead func() string) time.Duration {
	b.Helper()
	for end := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		w.mu.Lock()
		seen, last := len(w.seen), start
		for _, t := range w.seen {
			if t.After(last) {
				last = t
			}
		}
		w.mu.Unlock()
		switch {
		case seen >= n:
			return last.Sub(start)
		case dead() != "":
			b.Fatalf("%d of %d: %s", seen, n, dead())
		case time.Now().After(end):
			b.Fatalf("%d of %d within %s", seen, n, timeout)
		}
	}
}

// watchReady watches the run's RedisClusters for CredentialsReady.
func watchReady(b *testing.B, r *run) *seenWatch {
	return watchSeen(b, r, &v1beta1.RedisCluster{}, func(o client.Object) bool {
		return meta.IsStatusConditionTrue(o.(*v1beta1.RedisCluster).Status.Conditions, v1beta1.ConditionCredentialsReady)
	})
}

// tally is one look at the clusters of a name prefix: how many are CredentialsReady, and the
// CredentialsReady reasons of the others ("": no such condition yet).
type tally struct {
	ready   int
	reasons map[string]int
}

// tallies tallies the RedisClusters as last seen by the prefix of their name (what precedes the
// number createAll gives them).
func (w *seenWatch) tallies() map[string]tally {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]tally{}
	for name, o := range w.last {
		rc, ok := o.(*v1beta1.RedisCluster)
		if !ok {
			continue
		}
		prefix := strings.TrimRight(name, "0123456789")
		t := out[prefix]
		if t.reasons == nil {
			t.reasons = map[string]int{}
		}
		switch cond := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionCredentialsReady); {
		case cond == nil:
			t.reasons[""]++
		case cond.Status == metav1.ConditionTrue:
			t.ready++
		default:
			t.reasons[cond.Reason]++
		}
		out[prefix] = t
	}
	return out
}
