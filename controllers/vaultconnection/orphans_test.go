package vaultconnection

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/vault"
)

type listed struct {
	leases map[string][]string
	issued map[string]time.Time
	denied bool
}

func (l listed) ListLeases(_ context.Context, prefix string) ([]string, error) {
	if l.denied {
		return nil, &vault.Error{Op: "list-leases", Class: vault.ClassPermissionDenied}
	}
	return l.leases[prefix], nil
}

func (l listed) Lookup(_ context.Context, id string) (*vault.LeaseInfo, error) {
	at, ok := l.issued[id]
	return &vault.LeaseInfo{Exists: ok, IssuedAt: at}, nil
}

// A lease under a cluster's path that no ledger holds, older than the grace period, is an orphan;
// one in a ledger, one issued within the grace period, and one gone meanwhile are not.
func TestFindOrphans(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	l := listed{
		leases: map[string][]string{"database/creds/orders": {"database/creds/orders/a", "database/creds/orders/b", "database/creds/orders/c", "database/creds/orders/d"}},
		issued: map[string]time.Time{
			"database/creds/orders/a": now.Add(-time.Hour),   // in a ledger
			"database/creds/orders/b": now.Add(-time.Hour),   // orphan
			"database/creds/orders/c": now.Add(-time.Second), // just issued
		}, // d: gone by its lookup
	}
	got, err := findOrphans(context.Background(), l, []string{"database/creds/orders"}, map[string]bool{"database/creds/orders/a": true}, 5*time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"database/creds/orders/b"}; !slices.Equal(ids(got), want) {
		t.Errorf("orphans %v, want %v", got, want)
	}
	l.denied = true
	if _, err := findOrphans(context.Background(), l, []string{"database/creds/orders"}, nil, time.Minute, now); !vault.IsPermissionDenied(err) {
		t.Errorf("without the list policy: %v, want PermissionDenied", err)
	}
}

// An orphan is this install's only when an intent of its own matches it: the same path, issued
// from a little before the intent to intentWindow after it; one intent claims one lease. Intents
// too old to match a lease still to come are dropped.
func TestClaimMatchesOrphansToIntents(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	intents := []connection.Intent{
		{ID: "i1", Path: "database/creds/orders", At: at},
		{ID: "i2", Path: "database/creds/orders", At: at.Add(time.Hour)},
		{ID: "old", Path: "database/creds/orders", At: at.Add(-time.Hour)},
	}
	orphans := []orphan{
		{ID: "database/creds/orders/a", IssuedAt: at.Add(2 * time.Second)},           // i1's
		{ID: "database/creds/orders/b", IssuedAt: at.Add(3 * time.Second)},           // i1 is taken
		{ID: "database/creds/other/c", IssuedAt: at.Add(time.Hour)},                  // another path
		{ID: "database/creds/orders/d", IssuedAt: at.Add(time.Hour + 2*time.Minute)}, // past i2's window
	}
	ours, others, matched, stale := claim(orphans, intents, time.Minute, at.Add(90*time.Minute))
	if got := ids(ours); !slices.Equal(got, []string{"database/creds/orders/a"}) || matched["database/creds/orders/a"] != "i1" {
		t.Errorf("ours %v (matched %v), want a, by i1", got, matched)
	}
	if got := ids(others); !slices.Equal(got, []string{"database/creds/orders/b", "database/creds/orders/d", "database/creds/other/c"}) {
		t.Errorf("others %v", got)
	}
	slices.Sort(stale)
	if !slices.Equal(stale, []string{"i2", "old"}) {
		t.Errorf("stale intents %v, want i2 and old (unmatched, past their window and the grace period)", stale)
	}
}

// A lease obtained by hand a moment before keyroll's issue (within the clock skew allowed) is not
// taken for keyroll's when keyroll's own lease came after the intent.
func TestClaimPrefersTheLeaseIssuedAfterTheIntent(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	intents := []connection.Intent{{ID: "i", Path: "database/creds/orders", At: at}}
	orphans := []orphan{
		{ID: "database/creds/orders/by-hand", IssuedAt: at.Add(-2 * time.Second)},
		{ID: "database/creds/orders/keyroll", IssuedAt: at.Add(300 * time.Millisecond)},
	}
	ours, others, _, _ := claim(orphans, intents, time.Minute, at.Add(time.Hour))
	if !slices.Equal(ids(ours), []string{"database/creds/orders/keyroll"}) || !slices.Equal(ids(others), []string{"database/creds/orders/by-hand"}) {
		t.Errorf("ours %v, others %v", ids(ours), ids(others))
	}
	// With only the lease from just before: while keyroll's own may still turn up (it is younger
	// than the grace period), it is not claimed; once none can, the clock skew allows it.
	if ours, _, _, stale := claim(orphans[:1], intents, time.Minute, at.Add(30*time.Second)); len(ours) != 0 || len(stale) != 0 {
		t.Errorf("the lease from before the intent claimed too early: ours %v, stale %v", ids(ours), stale)
	}
	if ours, _, _, _ := claim(orphans[:1], intents, time.Minute, at.Add(time.Hour)); len(ours) != 1 {
		t.Errorf("a lease issued within the clock skew before the intent is not claimed: %v", ids(ours))
	}
}
