package vaulttest

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"

	"github.com/keyroll/keyroll/vault"
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestLeaseLifecycle(t *testing.T) {
	clk := testclock.NewFakeClock(epoch)
	f := New(clk)
	f.LeaseDuration = time.Minute
	f.MaxTTL = 3 * time.Minute
	ctx := context.Background()

	l, err := f.Issue(ctx, "database/creds/orders")
	if err != nil {
		t.Fatal(err)
	}
	if l.Duration != time.Minute || !l.ExpiresAt.Equal(epoch.Add(time.Minute)) || l.Data["username"] == "" || l.Data["password"] == "" {
		t.Fatalf("lease = %+v", l)
	}
	if !strings.HasPrefix(l.ID, "database/creds/orders/") {
		t.Errorf("lease id %q", l.ID)
	}

	clk.Step(40 * time.Second)
	r, err := f.Renew(ctx, l.ID, time.Minute)
	if err != nil || r.Duration != time.Minute || r.Capped {
		t.Fatalf("Renew() = %+v, %v; want a full minute", r, err)
	}
	clk.Step(50 * time.Second)
	if _, err := f.Renew(ctx, l.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	clk.Step(50 * time.Second) // 2m20s after issue: 40s left of the max TTL
	r, err = f.Renew(ctx, l.ID, time.Minute)
	if err != nil || r.Duration != 40*time.Second || !r.Capped {
		t.Fatalf("Renew() = %+v, %v; want 40s, capped", r, err)
	}
	info, err := f.Lookup(ctx, l.ID)
	if err != nil || !info.Exists || info.TTL != 40*time.Second {
		t.Fatalf("Lookup() = %+v, %v", info, err)
	}

	if err := f.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.Revoke(ctx, l.ID); err != nil {
		t.Errorf("revoking twice: %v", err)
	}
	if info, _ := f.Lookup(ctx, l.ID); info.Exists {
		t.Errorf("lease exists after revoke")
	}
	if _, err := f.Renew(ctx, l.ID, time.Minute); !vault.IsLeaseGone(err) {
		t.Errorf("Renew() of a revoked lease = %v, want LeaseGone", err)
	}
	want := map[string]int{OpIssue: 1, OpRenew: 4, OpLookup: 2, OpRevoke: 2}
	for op, n := range want {
		if got := f.Calls(op); got != n {
			t.Errorf("Calls(%s) = %d, want %d", op, got, n)
		}
	}
}

func TestExpiryAndOutsideRevocation(t *testing.T) {
	clk := testclock.NewFakeClock(epoch)
	f := New(clk)
	ctx := context.Background()
	a, _ := f.Issue(ctx, "database/creds/a")
	b, _ := f.Issue(ctx, "database/creds/b")
	if got := f.Leases(); len(got) != 2 {
		t.Fatalf("Leases() = %q", got)
	}
	f.RevokeOutside(a.ID)
	if info, _ := f.Lookup(ctx, a.ID); info.Exists {
		t.Errorf("a lease revoked outside still exists")
	}
	clk.Step(time.Hour)
	if info, _ := f.Lookup(ctx, b.ID); info.Exists {
		t.Errorf("an expired lease still exists")
	}
	if len(f.Leases()) != 0 {
		t.Errorf("Leases() = %q, want none", f.Leases())
	}
}

func TestInjectedErrors(t *testing.T) {
	f := New(nil)
	ctx := context.Background()
	f.FailNext(OpIssue, Err(OpIssue, vault.ClassUnavailable), Err(OpIssue, vault.ClassPermissionDenied))
	if _, err := f.Issue(ctx, "p"); !vault.IsUnavailable(err) {
		t.Errorf("first Issue() = %v, want Unavailable", err)
	}
	if _, err := f.Issue(ctx, "p"); !vault.IsPermissionDenied(err) {
		t.Errorf("second Issue() = %v, want PermissionDenied", err)
	}
	if _, err := f.Issue(ctx, "p"); err != nil {
		t.Errorf("third Issue() = %v, want success", err)
	}
	f.SetFailure(OpRevoke, Err(OpRevoke, vault.ClassSealed))
	for range 2 {
		if err := f.Revoke(ctx, "x"); !vault.IsSealed(err) {
			t.Errorf("Revoke() = %v, want Sealed", err)
		}
	}
	f.SetFailure(OpRevoke, nil)
	if err := f.Revoke(ctx, "x"); err != nil {
		t.Errorf("Revoke() after clearing = %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.Login(canceled); vault.ClassOf(err) != vault.ClassCanceled {
		t.Errorf("Login(canceled) = %v, want Canceled", err)
	}
	if f.Calls(OpIssue) != 3 || f.Calls(OpRevoke) != 3 || f.Calls(OpLogin) != 1 {
		t.Errorf("calls: issue %d, revoke %d, login %d", f.Calls(OpIssue), f.Calls(OpRevoke), f.Calls(OpLogin))
	}
}

func TestTokenDeadlineAndHealth(t *testing.T) {
	clk := testclock.NewFakeClock(epoch)
	f := New(clk)
	f.TokenDeadline = epoch.Add(30 * time.Minute)
	l, _ := f.Issue(context.Background(), "p")
	if !l.OutlivesToken || !l.TokenDeadline.Equal(f.TokenDeadline) {
		t.Errorf("a 1h lease under a token ending in 30m: %+v", l)
	}
	f.NotRenewable = true
	l2, _ := f.Issue(context.Background(), "p")
	if _, err := f.Renew(context.Background(), l2.ID, 0); !vault.IsBadRequest(err) {
		t.Errorf("renewing a non-renewable lease: %v", err)
	}
	f.HealthStatus = &vault.Health{Initialized: true, Sealed: true}
	if h, _ := f.Health(context.Background()); !h.Sealed {
		t.Errorf("Health() = %+v", h)
	}
}

func TestTokens(t *testing.T) {
	f := New(nil)
	f.TokenDeadline = epoch
	if got := f.Tokens(); len(got) != 1 || got[0].Accessor != "fake-accessor" || !got[0].Current || !got[0].EndsAt.Equal(epoch) {
		t.Errorf("default Tokens() = %+v, want one current token ending at TokenDeadline", got)
	}
	f.Held = []vault.TokenStatus{{Accessor: "a", Current: true}, {Accessor: "b"}}
	needs := map[string]time.Time{"b": epoch}

	held, err := f.KeepTokens(context.Background(), needs)

	if err != nil || !reflect.DeepEqual(held, f.Held) || !reflect.DeepEqual(f.Tokens(), f.Held) || !f.Needs["b"].Equal(epoch) {
		t.Errorf("KeepTokens() = %+v, %v; Tokens() = %+v; Needs = %v", held, err, f.Tokens(), f.Needs)
	}
	if ts, ok := f.Token("b"); !ok || ts.Current {
		t.Errorf("Token(b) = %+v, %v", ts, ok)
	}
	if _, ok := f.Token("c"); ok {
		t.Errorf("Token(c) found a token that is not held")
	}
	got := f.Tokens()
	got[0].Accessor = "changed"
	if f.Held[0].Accessor != "a" {
		t.Errorf("Tokens() returned Held itself, not a copy")
	}
}
