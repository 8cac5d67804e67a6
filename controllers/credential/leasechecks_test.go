package credential

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Now makes the lease due at once, whatever its last confirmation, until it is checked again;
// with lease checks off it does nothing.
func TestNowMakesTheLeaseCheckDue(t *testing.T) {
	key := types.NamespacedName{Namespace: "shop", Name: "orders"}
	at := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	l := NewLeaseChecks(time.Minute)
	l.Checked(key, "lease-1", at)
	if next := l.Next(key, "lease-1", at); !next.After(at) {
		t.Fatalf("next check %s, want after %s", next, at)
	}
	l.Now(key)
	if next := l.Next(key, "lease-1", at); next.After(at) || next.IsZero() {
		t.Fatalf("after Now, next check %s: want one long due", next)
	}
	l.Checked(key, "lease-1", at.Add(time.Second))
	if next := l.Next(key, "lease-1", at); !next.After(at) {
		t.Fatalf("after the check, next check %s", next)
	}
	off := NewLeaseChecks(-1)
	off.Now(key)
	if next := off.Next(key, "lease-1", at); !next.IsZero() {
		t.Fatalf("lease checks off: next %s", next)
	}
}
