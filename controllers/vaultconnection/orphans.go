package vaultconnection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/keyroll/keyroll/vault"
)

// leaseLister is what the orphan-lease sweep needs of a Vault connection.
type leaseLister interface {
	ListLeases(ctx context.Context, prefix string) ([]string, error)
	Lookup(ctx context.Context, leaseID string) (*vault.LeaseInfo, error)
}

// findOrphans lists the leases Vault holds under prefixes (the credential paths the connection's
// RedisClusters read) that no ledger holds (known) and that were issued more than grace ago: a
// lease issued just now may be on its way into a ledger (the status write after Vault's answer).
// A lease that is gone by the time it is looked up is no orphan. The result is sorted.
func findOrphans(ctx context.Context, vl leaseLister, prefixes []string, known map[string]bool, grace time.Duration, now time.Time) ([]string, error) {
	var orphans []string
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
				orphans = append(orphans, id)
			}
		}
	}
	slices.Sort(orphans)
	return slices.Compact(orphans), errors.Join(errs...)
}
