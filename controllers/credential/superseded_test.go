package credential

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	testclock "k8s.io/utils/clock/testing"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

// A superseded lease whose Vault token ends before the lease does cannot be saved by renewing it:
// keyroll says at once, with a Warning event, by when the rollout must be done, stops renewing it,
// plans to look at it again at the token's end, and then takes it out of the ledger and treats
// its user as onRevokedOutside says, without waiting for its expiry or for Vault.
func TestSupersededLeaseEndingWithItsTokenIsAnnouncedAndHonoured(t *testing.T) {
	ctx := context.Background()
	clk := testclock.NewFakeClock(time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC))
	fake := vaulttest.New(clk)
	fake.LeaseDuration, fake.TokenDeadline = 10*time.Minute, clk.Now().Add(40*time.Second)
	old, err := fake.Issue(ctx, "database/creds/orders")
	if err != nil {
		t.Fatal(err)
	}
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	rc.Status.Credential = &v1beta1.CredentialStatus{Version: "v2", Username: "v2-user"}
	rc.Status.Leases = []v1beta1.LeaseRecord{{
		LeaseID: old.ID, State: v1beta1.LeaseSuperseded, Username: "v1-user", TokenAccessor: old.TokenAccessor,
		IssuedAt: &metav1.Time{Time: clk.Now()}, ExpiresAt: &metav1.Time{Time: old.ExpiresAt},
	}}
	rec := events.NewFakeRecorder(10)
	cl := &Cluster{RC: rc, Conds: status.Setter{Obj: rc, Conditions: &rc.Status.Conditions, Recorder: rec}}
	l := &Ledger{Clock: clk, Metrics: metrics.For(clk), Checks: NewLeaseChecks(time.Minute)}

	next, err := l.KeepSuperseded(ctx, cl, fake, DefaultRenewalPercent)
	if err != nil {
		t.Fatal(err)
	}
	if !next.Equal(fake.TokenDeadline) {
		t.Errorf("next look at %s, want the token's end %s", next, fake.TokenDeadline)
	}
	if r, _ := cl.Lease(old.ID); !r.RenewalCapped {
		t.Errorf("record %+v: want renewalCapped once the token's end is known to come first", r)
	}
	if got := drain(rec); !slices.ContainsFunc(got, func(e string) bool {
		return strings.Contains(e, v1beta1.EventSupersededLeaseEnding) && strings.Contains(e, fake.TokenDeadline.Format(time.RFC3339))
	}) {
		t.Errorf("events %q: want %s naming the token's end", got, v1beta1.EventSupersededLeaseEnding)
	}

	clk.Step(41 * time.Second)
	if _, err := l.KeepSuperseded(ctx, cl, fake, DefaultRenewalPercent); err != nil {
		t.Fatal(err)
	}
	if _, ok := cl.Lease(old.ID); ok || !slices.Contains(rc.Status.RetiringUsers, "v1-user") {
		t.Errorf("past the token's end: ledger %+v, retiring users %q; want the lease out and its user cut off (onRevokedOutside CutOff)", rc.Status.Leases, rc.Status.RetiringUsers)
	}
}

func drain(r *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A superseded lease revoked outside keyroll is noticed by its lease check, within about the
// check interval, not at its next renewal minutes later; a live one is confirmed and looked up
// again an interval on.
func TestSupersededLeaseIsLookedUpBetweenRenewals(t *testing.T) {
	ctx := context.Background()
	clk := testclock.NewFakeClock(time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC))
	fake := vaulttest.New(clk)
	fake.LeaseDuration = 10 * time.Minute
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	rc.Status.Credential = &v1beta1.CredentialStatus{Version: "v3", Username: "v3-user"}
	var ids []string
	for i, user := range []string{"v1-user", "v2-user"} {
		l, err := fake.Issue(ctx, "database/creds/orders")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
		rc.Status.Leases = append(rc.Status.Leases, v1beta1.LeaseRecord{LeaseID: l.ID, State: v1beta1.LeaseSuperseded, Username: user,
			IssuedAt: &metav1.Time{Time: clk.Now()}, ExpiresAt: &metav1.Time{Time: l.ExpiresAt}, Version: fmt.Sprintf("v%d", i+1)})
	}
	cl := &Cluster{RC: rc, Conds: status.Setter{Obj: rc, Conditions: &rc.Status.Conditions, Recorder: events.NewFakeRecorder(10)}}
	l := &Ledger{Clock: clk, Metrics: metrics.For(clk), Checks: NewLeaseChecks(time.Minute)}

	next, err := l.KeepSuperseded(ctx, cl, fake, DefaultRenewalPercent)
	if err != nil || next.After(clk.Now().Add(time.Minute)) {
		t.Fatalf("next look %s (%v): want the lease checks, within a minute, ahead of the renewals", next, err)
	}
	fake.RevokeOutside(ids[0])
	clk.Step(61 * time.Second)
	if _, err := l.KeepSuperseded(ctx, cl, fake, DefaultRenewalPercent); err != nil {
		t.Fatal(err)
	}
	if _, ok := cl.Lease(ids[0]); ok || !slices.Contains(rc.Status.RetiringUsers, "v1-user") {
		t.Errorf("a minute after the revocation: ledger %+v, retiring %q; want the revoked lease out and its user cut off", rc.Status.Leases, rc.Status.RetiringUsers)
	}
	if _, ok := cl.Lease(ids[1]); !ok || fake.Calls(vaulttest.OpRenew) != 0 {
		t.Errorf("the live superseded lease: in the ledger %v, %d renewals; want it kept, looked up, not renewed yet", ok, fake.Calls(vaulttest.OpRenew))
	}
}
