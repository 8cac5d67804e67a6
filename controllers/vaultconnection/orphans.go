package vaultconnection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/vault"
)

// leaseLister is what the orphan-lease sweep needs of a Vault connection.
type leaseLister interface {
	ListLeases(ctx context.Context, prefix string) ([]string, error)
	Lookup(ctx context.Context, leaseID string) (*vault.LeaseInfo, error)
}

// orphan is a lease Vault holds under a swept path that no ledger holds.
type orphan struct {
	ID       string
	IssuedAt time.Time
}

// findOrphans lists the leases Vault holds under prefixes (the credential paths the connection's
// RedisClusters read) that no ledger holds (known) and that were issued more than grace ago: a
// lease issued just now may be on its way into a ledger (the status write after Vault's answer).
// A lease that is gone by the time it is looked up is no orphan. The result is sorted by ID.
func findOrphans(ctx context.Context, vl leaseLister, prefixes []string, known map[string]bool, grace time.Duration, now time.Time) ([]orphan, error) {
	var orphans []orphan
	var errs []error
	for _, prefix := range prefixes {
		ids, err := vl.ListLeases(ctx, prefix)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing the leases under %s: %w", prefix, err))
			continue
		}
		for _, id := range ids {
			if known[id] {
				continue
			}
			info, err := vl.Lookup(ctx, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if info.Exists && now.Sub(info.IssuedAt) > grace {
				orphans = append(orphans, orphan{ID: id, IssuedAt: info.IssuedAt})
			}
		}
	}
	slices.SortFunc(orphans, func(a, b orphan) int { return strings.Compare(a.ID, b.ID) })
	return slices.CompactFunc(orphans, func(a, b orphan) bool { return a.ID == b.ID }), errors.Join(errs...)
}

// intentWindow is how long after its intent an issue's lease may have been issued: an issue ends
// within the Vault client's timeout (10 s) after the intent is written. intentSkew allows for the
// clocks of keyroll and Vault.
const (
	intentWindow = time.Minute
	intentSkew   = 5 * time.Second
)

// claim splits the orphans into those this install issued (each matches an intent of its own: the
// same path, issued within intentWindow after the intent) and the others, which it never revokes.
// Each intent claims one lease, the first issued after it. A lease issued up to intentSkew before
// the intent (Vault's clock behind keyroll's) is claimed only once no lease after the intent can
// still turn up (intentWindow and the grace period have passed), so that a lease someone obtained
// by hand a moment before keyroll's issue is never taken for keyroll's while keyroll's own is
// still too young to count. It also returns the intents to drop: those matched, and those too old
// to match any lease still to be found (the lease reached a ledger, or was never issued).
func claim(orphans []orphan, intents []connection.Intent, grace time.Duration, now time.Time) (ours, others []orphan, matched map[string]string, stale []string) {
	matched = map[string]string{} // lease ID to intent ID
	byTime := slices.Clone(intents)
	slices.SortFunc(byTime, func(a, b connection.Intent) int { return a.At.Compare(b.At) })
	for _, in := range byTime {
		settled := now.Sub(in.At) > intentWindow+grace
		after, before := -1, -1
		for i, o := range orphans {
			if _, taken := matched[o.ID]; taken || strings.Trim(in.Path, "/") != leasePath(o.ID) {
				continue
			}
			switch {
			case !o.IssuedAt.Before(in.At) && !o.IssuedAt.After(in.At.Add(intentWindow)):
				if after < 0 || o.IssuedAt.Before(orphans[after].IssuedAt) {
					after = i
				}
			case settled && !o.IssuedAt.Before(in.At.Add(-intentSkew)) && o.IssuedAt.Before(in.At):
				if before < 0 || o.IssuedAt.After(orphans[before].IssuedAt) {
					before = i
				}
			}
		}
		switch {
		case after >= 0:
			matched[orphans[after].ID] = in.ID
		case before >= 0:
			matched[orphans[before].ID] = in.ID
		case settled:
			stale = append(stale, in.ID)
		}
	}
	for _, o := range orphans {
		if _, ok := matched[o.ID]; ok {
			ours = append(ours, o)
		} else {
			others = append(others, o)
		}
	}
	slices.SortFunc(ours, func(a, b orphan) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(others, func(a, b orphan) int { return strings.Compare(a.ID, b.ID) })
	return ours, others, matched, stale
}

func ids(orphans []orphan) []string {
	out := make([]string, 0, len(orphans))
	for _, o := range orphans {
		out = append(out, o.ID)
	}
	return out
}
