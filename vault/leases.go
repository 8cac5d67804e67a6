package vault

import (
	"context"
	"strings"

	vaultapi "github.com/hashicorp/vault/api"
)

// The lease calls besides Issue and Renew: Revoke, ListLeases (the orphan sweep) and Lookup.

// Revoke revokes a lease. Vault revokes synchronously unless asked not to: the call returns once
// the credential is gone. The lease ID goes in the URL, so that a policy on
// sys/leases/revoke/<prefix>* limits which leases the token may revoke.
func (c *Client) Revoke(ctx context.Context, leaseID string) error {
	if leaseID == "" {
		return &Error{Op: opRevoke, Class: ClassBadRequest, detail: "empty lease ID"}
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	_, err := c.call(ctx, opRevoke, leaseID, currentToken, func(ctx context.Context, h *heldToken) error {
		_, err := h.api.Logical().WriteWithContext(ctx, "sys/leases/revoke/"+leaseID, nil)
		return err
	})
	if err != nil {
		return err
	}
	c.log.V(1).Info("Revoked lease", "leaseID", leaseID)
	return nil
}

// ListLeases lists the IDs of the leases Vault holds under prefix (a path that issues
// credentials, such as database/creds/orders): LIST sys/leases/lookup/<prefix>/, which needs a
// policy with list and sudo on that path. A prefix with no leases is an empty list.
func (c *Client) ListLeases(ctx context.Context, prefix string) ([]string, error) {
	prefix = strings.Trim(prefix, "/")
	if prefix == "" {
		return nil, &Error{Op: opListLeases, Class: ClassBadRequest, detail: "empty prefix"}
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	var s *vaultapi.Secret
	_, err := c.call(ctx, opListLeases, prefix, currentToken, func(ctx context.Context, h *heldToken) (err error) {
		s, err = h.api.Logical().ListWithContext(ctx, "sys/leases/lookup/"+prefix+"/")
		return err
	})
	if err != nil {
		return nil, err
	}
	var ids []string
	if s != nil {
		keys, _ := s.Data["keys"].([]any)
		for _, k := range keys {
			if key, ok := k.(string); ok && !strings.HasSuffix(key, "/") {
				ids = append(ids, prefix+"/"+key)
			}
		}
	}
	return ids, nil
}

// Lookup reports whether a lease exists and when it expires. A lease Vault does not know is
// reported as not existing, not as an error.
func (c *Client) Lookup(ctx context.Context, leaseID string) (*LeaseInfo, error) {
	if leaseID == "" {
		return nil, &Error{Op: opLookup, Class: ClassBadRequest, detail: "empty lease ID"}
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	var s *vaultapi.Secret
	_, err := c.call(ctx, opLookup, leaseID, currentToken, func(ctx context.Context, h *heldToken) (err error) {
		s, err = h.api.Sys().LookupWithContext(ctx, leaseID)
		return err
	})
	if IsLeaseGone(err) {
		return &LeaseInfo{Exists: false}, nil
	}
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &Error{Op: opLookup, Path: leaseID, Class: ClassUnknown, detail: "empty response"}
	}
	return &LeaseInfo{
		Exists:      true,
		IssuedAt:    timeValue(s.Data["issue_time"]),
		ExpiresAt:   timeValue(s.Data["expire_time"]),
		LastRenewal: timeValue(s.Data["last_renewal"]),
		TTL:         durationValue(s.Data["ttl"]),
		Renewable:   s.Data["renewable"] == true,
	}, nil
}
