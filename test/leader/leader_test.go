// Package leader runs two keyroll managers with leader election against one test ground: only the
// leader rotates, and when it stops the other takes over and keeps the lease alive.
package leader

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	ground *testground.Ground
	k8s    client.Client
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	g, c, stop, err := harness.StartPackage(testground.Options{Workloads: true, Redis: true, Vault: true},
		func(ctx context.Context, g *testground.Ground) error {
			return harness.SetupVault(ctx, g, testground.RedisRole{Name: "sched", DefaultTTL: 20 * time.Second, MaxTTL: time.Hour})
		})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	ground, k8s = g, c
	return m.Run()
}

// Leader-election timings, short for the test; the defaults are in main.go's flags.
var electionOptions = harness.Options{LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}

func elected(op *harness.Operator, within time.Duration) bool {
	select {
	case <-op.Elected():
		return true
	case <-time.After(within):
		return false
	}
}

func TestOnlyTheLeaderRotatesAndTheFollowerTakesOver(t *testing.T) {
	ctx := context.Background()
	a, err := harness.Start(ctx, ground, electionOptions)
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
	b, err := harness.Start(ctx, ground, electionOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	if elected(b, 2*time.Second) {
		t.Fatal("two managers lead at once")
	}

	for _, obj := range []client.Object{
		&v1alpha1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault"}, Spec: v1alpha1.VaultConnectionSpec{
			Address: ground.Vault.Addr, AllowedNamespaces: []string{"default"},
			Auth: v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: harness.OperatorRole}},
		}},
		&v1alpha1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sched"}, Spec: v1alpha1.RedisClusterSpec{
			Replicas: 1,
			Credentials: v1alpha1.CredentialsSpec{Source: v1alpha1.SourceVaultLease, VaultLease: &v1alpha1.VaultLeaseSource{
				ConnectionRef: v1alpha1.ConnectionReference{Name: "vault"}, Path: "database/creds/sched",
			}},
			Rotation: v1alpha1.RotationSpec{Schedule: "@every 8s"},
		}},
	} {
		if err := k8s.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	rc := &v1alpha1.RedisCluster{}
	key := client.ObjectKey{Namespace: "default", Name: "sched"}

	// Over 30 s the schedule ticks about four times: each tick is one rotation, never two.
	time.Sleep(30 * time.Second)
	issued := issuedAt(t, "sched")
	if len(issued) < 3 || len(issued) > 6 {
		t.Fatalf("%d credentials issued in 30 s with @every 8s (first issue included): %v", len(issued), issued)
	}
	for i := 1; i < len(issued); i++ {
		if gap := issued[i].Sub(issued[i-1]); gap < 4*time.Second {
			t.Errorf("two rotations %s apart: the schedule fired twice for one tick (%v)", gap, issued)
		}
	}
	t.Logf("credentials issued at %v", issued)

	// Pause rotations, so that only renewals keep the 20 s lease alive, then stop the leader.
	if err := k8s.Get(ctx, key, rc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(rc.DeepCopy())
	rc.Spec.Rotation.Paused = true
	if err := k8s.Patch(ctx, rc, patch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := k8s.Get(ctx, key, rc); err != nil {
		t.Fatal(err)
	}
	lease := rc.Status.Credential.LeaseID
	stopped := time.Now()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	aStopped = true
	if !elected(b, electionOptions.LeaseDuration+3*time.Second) {
		t.Fatal("the follower did not take over within the lease duration")
	}
	t.Logf("the follower leads %s after the leader stopped", time.Since(stopped).Round(time.Millisecond))

	// The new leader renews the lease: its expiry in Vault moves on, past the first TTL.
	_, first := leaseExpiry(t, lease)
	deadline := time.Now().Add(40 * time.Second)
	for {
		exists, exp := leaseExpiry(t, lease)
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

// issuedAt lists when credentials were issued for a RedisCluster, from its CredentialsIssued events.
func issuedAt(t *testing.T, name string) []time.Time {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == v1alpha1.EventCredentialsIssued {
			out = append(out, e.EventTime.Time)
		}
	}
	slicesSortTimes(out)
	return out
}

func leaseExpiry(t *testing.T, id string) (bool, time.Time) {
	t.Helper()
	return ground.Vault.LeaseExpiry(id)
}

func slicesSortTimes(ts []time.Time) {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
}
