package dataplane

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/framework"
)

const keys = 10000

// writeKeys writes data:0 … data:<n-1> to the primary as the app user.
func writeKeys(t *testing.T, addr, user, pass string, n int) {
	t.Helper()
	c := framework.RedisClient(addr, user, pass)
	defer c.Close()
	ctx := context.Background()
	for start := 0; start < n; start += 1000 {
		pipe := c.Pipeline()
		for i := start; i < min(start+1000, n); i++ {
			pipe.Set(ctx, "data:"+strconv.Itoa(i), i, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("writing keys: %v", err)
		}
	}
}

// countKeys counts how many of data:0 … data:<n-1> the node at addr has.
func countKeys(t *testing.T, addr, user, pass string, n int) int64 {
	t.Helper()
	c := framework.RedisClient(addr, user, pass)
	defer c.Close()
	var total int64
	for start := 0; start < n; start += 1000 {
		var batch []string
		for i := start; i < min(start+1000, n); i++ {
			batch = append(batch, "data:"+strconv.Itoa(i))
		}
		got, err := c.Exists(context.Background(), batch...).Result()
		if err != nil {
			t.Fatalf("counting keys on %s: %v", addr, err)
		}
		total += got
	}
	return total
}

// linkWatch asks every replica for its replication state every 100 ms and records each moment
// its link to the primary was not up.
type linkWatch struct {
	mu      sync.Mutex
	downs   []string
	samples int
	stop    chan struct{}
	done    sync.WaitGroup
}

func watchLinks(addrs []string, adminPassword string) *linkWatch {
	w := &linkWatch{stop: make(chan struct{})}
	for _, addr := range addrs {
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			n := node(addr, adminPassword)
			defer n.Close()
			for {
				select {
				case <-w.stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				st, err := n.Replication(ctx)
				cancel()
				w.mu.Lock()
				w.samples++
				if err != nil || !st.LinkUp || st.SyncInProgress {
					w.downs = append(w.downs, fmt.Sprintf("%s at %s: %+v %v", addr, time.Now().Format(time.StampMilli), st, err))
				}
				w.mu.Unlock()
			}
		}()
	}
	return w
}

func (w *linkWatch) halt() (samples int, downs []string) {
	close(w.stop)
	w.done.Wait()
	return w.samples, w.downs
}

func primaryReplication(t *testing.T, addr, adminPassword string) redisnode.Replication {
	t.Helper()
	n := node(addr, adminPassword)
	defer n.Close()
	st, err := n.Replication(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// internalUsers names keyroll's own users by the Secret key of their password
// (fw.InternalPasswords' keys).
var internalUsers = map[string]string{
	"admin-password": render.AdminUser, "replication-password": render.ReplicationUser, "probe-password": render.ProbeUser,
}

// Three rotations of a 3-pod RedisCluster without storage, under two consumer pods running SET
// and GET non-stop: no command fails, the 10,000 keys written before are on every node after,
// no Redis pod restarts, no replica resyncs (in full or in part), the replication links stay up,
// and keyroll's own users keep their passwords.
func TestRotationDropsNoCommandAndKeepsTheData(t *testing.T) {
	ns := fw.Namespace(t, "data")
	vc := fw.VaultConnection(t, "vault-data", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("app"))
	fw.WaitReady(t, rc, 3*time.Minute)
	pods := fw.RedisPods(t, rc)
	admin := fw.AdminPassword(rc)
	internal := fw.InternalPasswords(t, rc) // fails the test when keyroll's Secrets lack one
	user, pass, _ := fw.Credentials(rc)
	writeKeys(t, framework.PodAddr(&pods[0]), user, pass, keys)
	app := fw.StartConsumers(t, ns, "app", 2, "cache:6379", "cache-credentials")
	before := runs(pods)
	syncs := primaryReplication(t, framework.PodAddr(&pods[0]), admin)
	if syncs.ConnectedReplicas != 2 {
		t.Fatalf("the primary has %d replicas before the rotations", syncs.ConnectedReplicas)
	}
	t.Logf("before the rotations: sync_full %d, sync_partial_ok %d", syncs.FullSyncs, syncs.PartialSyncs)
	links := watchLinks([]string{framework.PodAddr(&pods[1]), framework.PodAddr(&pods[2])}, admin)

	okBefore, _, _ := app.Totals()
	began := time.Now()
	for i := 1; i <= 3; i++ {
		from := fw.Get(t, rc).Status.Credential.Version
		start := time.Now()
		fw.RotateNow(t, rc)
		framework.Eventually(t, 3*time.Minute, func() string { return rotated(t, rc, from) })
		t.Logf("rotation %d done in %s", i, time.Since(start).Round(time.Millisecond))
	}
	time.Sleep(time.Second) // the consumers run on for a moment on the last credential
	samples, downs := links.halt()
	app.Halt()
	took := time.Since(began)
	ok, failed, lastErrors := app.Totals()
	var longest int64
	for _, s := range app.Stats() {
		longest = max(longest, s.LongestOutageMs)
	}

	during := ok - okBefore
	t.Logf("consumers: %d commands ok (%d in the %s of the rotations, %.1f a second), %d failed, longest outage %d ms; replication sampled %d times",
		ok, during, took.Round(time.Millisecond), float64(during)/took.Seconds(), failed, longest, samples)
	if failed != 0 {
		t.Errorf("%d commands failed across the rotations (longest outage %d ms): %v", failed, longest, lastErrors)
	}
	// Two pods run a SET/GET round every 100 ms (a little under 20 commands a second each); a
	// rolled-out pod's successor starts before it stops. A third of that rate over the rotations
	// (and at least 100 commands) tells consumers that ran through them from ones that stalled.
	if floor := max(100, int64(took.Seconds()*2*20/3)); during < floor {
		t.Errorf("only %d commands ran in the %s of the rotations (floor %d): the consumers did not run through them", during, took.Round(time.Millisecond), floor)
	}
	if len(downs) > 0 {
		t.Errorf("a replication link was not up at %d of %d samples: %v", len(downs), samples, downs)
	}
	after := fw.RedisPods(t, rc)
	if got := runs(after); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("Redis pods restarted: before %v, after %v", before, got)
	}
	st := primaryReplication(t, framework.PodAddr(&after[0]), admin)
	t.Logf("after the rotations: sync_full %d, sync_partial_ok %d, %d replicas", st.FullSyncs, st.PartialSyncs, st.ConnectedReplicas)
	if st.FullSyncs != syncs.FullSyncs || st.PartialSyncs != syncs.PartialSyncs || st.ConnectedReplicas != 2 {
		t.Errorf("the primary served %d full and %d partial syncs after the rotations, %d and %d before (replicas %d)",
			st.FullSyncs, st.PartialSyncs, syncs.FullSyncs, syncs.PartialSyncs, st.ConnectedReplicas)
	}
	user, pass, _ = fw.Credentials(rc)
	for _, p := range after {
		n := countKeys(t, framework.PodAddr(&p), user, pass, keys)
		t.Logf("pod %s: %d of the %d keys", p.Name, n, keys)
		if n != keys {
			t.Errorf("pod %s has %d of the %d keys", p.Name, n, keys)
		}
	}
	for k, p := range fw.InternalPasswords(t, rc) {
		u := internalUsers[k]
		if p != internal[k] {
			t.Errorf("the rotations changed the password of %s in keyroll's Secrets", u)
		}
		for _, pod := range after {
			if !accepts(framework.PodAddr(&pod), u, p) {
				t.Errorf("pod %s no longer lets %s log in with its password", pod.Name, u)
			}
		}
	}
}
