// Package leader runs two keyroll managers with leader election against one test ground: only the
// leader rotates, and when it stops the other takes over and keeps the lease alive. Its Redis runs
// in a pod of the real node: a scheduled rotation waits until the current credential reached
// every Redis node and the consumers (status.credential.deliveredAt), which needs a Redis that
// answers.
package leader

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

func TestMain(m *testing.M) {
	fw = framework.New(framework.Config{
		Name:   "leader",
		Ground: testground.Options{Node: true, Redis: true, Vault: true},
		Roles:  []testground.RedisRole{{Name: "sched", DefaultTTL: 20 * time.Second, MaxTTL: time.Hour}},
	})
	os.Exit(fw.Run(m))
}

// elected says whether op leads within the time given (specific to this package: it waits on one
// operator's election, which the framework leaves to the tests).
func elected(op *framework.Operator, within time.Duration) bool {
	select {
	case <-op.Elected():
		return true
	case <-time.After(within):
		return false
	}
}

func TestOnlyTheLeaderRotatesAndTheFollowerTakesOver(t *testing.T) {
	ctx := context.Background()
	// Both managers run with framework.Election's short leader-election timings; the defaults are
	// in main.go's flags.
	a, err := fw.NewOperator(ctx, framework.Election)
	if err != nil {
		t.Fatal(err)
	}
	aStopped := false
	t.Cleanup(func() {
		if !aStopped {
			_ = a.Stop()
		}
	})
	if !elected(a, 20*time.Second) {
		t.Fatal("the first manager did not become leader")
	}
	b, err := fw.NewOperator(ctx, framework.Election)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	if elected(b, 2*time.Second) {
		t.Fatal("two managers lead at once")
	}

	ns := fw.Namespace(t, "sched")
	vc := fw.VaultConnection(t, "vault", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "sched", vc.Name, fw.Path("sched"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rotation.Schedule = "@every 8s"
	})
	key := client.ObjectKeyFromObject(rc)
	fw.WaitReady(t, rc, 3*time.Minute)

	// Over 30 s the schedule, counted from each credential's delivery, ticks two to four times:
	// each tick is one rotation, never two.
	since := time.Now()
	time.Sleep(30 * time.Second)
	issued := slices.DeleteFunc(issuedAt(t, ns, "sched"), func(at time.Time) bool { return at.Before(since) })
	if len(issued) < 2 || len(issued) > 5 {
		t.Fatalf("%d credentials issued in 30 s with @every 8s: %v", len(issued), issued)
	}
	for i := 1; i < len(issued); i++ {
		if gap := issued[i].Sub(issued[i-1]); gap < 4*time.Second {
			t.Errorf("two rotations %s apart: the schedule fired twice for one tick (%v)", gap, issued)
		}
	}
	t.Logf("credentials issued at %v", issued)

	// Pause rotations, so that only renewals keep the 20 s lease alive, then stop the leader.
	if err := fw.Client.Get(ctx, key, rc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(rc.DeepCopy())
	rc.Spec.Rotation.Paused = true
	if err := fw.Client.Patch(ctx, rc, patch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := fw.Client.Get(ctx, key, rc); err != nil {
		t.Fatal(err)
	}
	lease := rc.Status.Credential.Lease.LeaseID
	stopped := time.Now()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	aStopped = true
	if !elected(b, framework.Election.LeaseDuration+3*time.Second) {
		t.Fatal("the follower did not take over within the lease duration")
	}
	t.Logf("the follower leads %s after the leader stopped", time.Since(stopped).Round(time.Millisecond))

	// The new leader renews the lease: its expiry in Vault moves on, past the first TTL.
	_, first := fw.LeaseExists(lease)
	deadline := time.Now().Add(40 * time.Second)
	for {
		exists, exp := fw.LeaseExists(lease)
		if !exists {
			t.Fatal("the lease is gone after the takeover")
		}
		if exp.After(first.Add(3 * time.Second)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new leader did not renew lease %s (expiry still %s)", lease, exp)
		}
		time.Sleep(time.Second)
	}
}

// issuedAt lists when credentials were issued for the RedisCluster ns/name, from its
// CredentialsIssued events, in order.
func issuedAt(t *testing.T, ns, name string) []time.Time {
	t.Helper()
	var out []time.Time
	for _, e := range fw.ClusterEvents(t, ns, name) {
		if e.Reason == v1beta1.EventCredentialsIssued {
			out = append(out, e.EventTime.Time)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}
