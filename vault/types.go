package vault

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// LeaseClient is what the RedisCluster controller needs of a Vault connection: the leases of
// dynamic credentials, and the state of the token that created one. Every call ends by
// Config.Timeout at the latest, makes one request (see Client), and returns errors that the Is*
// predicates and ClassOf classify.
type LeaseClient interface {
	// Issue reads a path that issues a dynamic credential, e.g. database/creds/orders.
	Issue(ctx context.Context, path string) (*Lease, error)
	// Renew extends a lease by increment (0: the role's default); Vault may grant less.
	Renew(ctx context.Context, leaseID string, increment time.Duration) (*Renewal, error)
	// Revoke revokes a lease and returns once Vault has revoked it. Revoking a lease that is
	// already gone succeeds.
	Revoke(ctx context.Context, leaseID string) error
	// Lookup says whether a lease still exists and when it expires.
	Lookup(ctx context.Context, leaseID string) (*LeaseInfo, error)
	// ListLeases lists the leases Vault holds under a credential path (it needs list and sudo
	// on sys/leases/lookup/<path>/).
	ListLeases(ctx context.Context, prefix string) ([]string, error)
	// Token describes a held token by its accessor (Lease.TokenAccessor): when it ends, and with
	// it the leases it created.
	Token(accessor string) (TokenStatus, bool)
}

// ConnectionClient is what the VaultConnection controller needs of a Vault connection: the
// server's health, the login, and the tokens that keep leases alive. Its calls end, fail and
// classify their errors as LeaseClient's do.
type ConnectionClient interface {
	// Health reports the server's version and seal state; a sealed or standby server is not
	// an error here.
	Health(ctx context.Context) (*Health, error)
	// Login logs in now (for a static token: looks it up), replacing the current token; the
	// replaced token is kept alive while leases it created may be live.
	Login(ctx context.Context) error
	// KeepTokens renews, before they expire, the tokens that own live leases (needs: accessor to
	// the latest expiry of its leases), and gives up the others but the current one.
	KeepTokens(ctx context.Context, needs map[string]time.Time) ([]TokenStatus, error)
	// Tokens describes every held token, the current one first.
	Tokens() []TokenStatus
	// TokenInfo describes the client's current Vault token, never the token itself.
	TokenInfo() TokenInfo
}

// The Vault client is both what RedisClusters and what VaultConnections need of it.
var (
	_ LeaseClient      = (*Client)(nil)
	_ ConnectionClient = (*Client)(nil)
)

// Lease is a credential issued by Vault.
type Lease struct {
	ID        string
	Duration  time.Duration
	Renewable bool
	// Data is the credential (username, password, ...). It prints as its keys only.
	Data      SecretData
	IssuedAt  time.Time
	ExpiresAt time.Time
	Warnings  []string
	// TokenAccessor identifies the token that created the lease: Vault revokes the lease with it.
	TokenAccessor string
	// TokenDeadline is when the client token that issued the lease ends for good, as far as the
	// client knows (zero: unknown or never). Vault revokes a token's leases with the token.
	TokenDeadline time.Time
	// OutlivesToken says the lease would outlive TokenDeadline: it will be revoked early, when
	// the token ends, unless it is replaced before.
	OutlivesToken bool
}

// Renewal is the outcome of a lease renewal.
type Renewal struct {
	// Duration is what Vault granted, counted from the renewal.
	Duration  time.Duration
	ExpiresAt time.Time
	Renewable bool
	// Capped says Vault granted less than asked for: the lease is near its max TTL.
	Capped   bool
	Warnings []string
}

// LeaseInfo is what Vault knows of a lease.
type LeaseInfo struct {
	// Exists is false when Vault does not know the lease (revoked, expired, never issued).
	Exists      bool
	IssuedAt    time.Time
	ExpiresAt   time.Time
	LastRenewal time.Time
	TTL         time.Duration
	Renewable   bool
}

// Health is the server's state as sys/health reports it.
type Health struct {
	Initialized        bool
	Sealed             bool
	Standby            bool
	PerformanceStandby bool
	Version            string
	ClusterName        string
	Enterprise         bool
	ServerTime         time.Time
}

// TokenInfo describes the client's Vault token without revealing it.
type TokenInfo struct {
	// Method is the auth method: "kubernetes", "approle" or "token".
	Method string
	// Accessor identifies the token without revealing it.
	Accessor string
	// Valid says the client holds a token that has not expired, as far as it knows.
	Valid bool
	// IssuedAt is when the token was obtained (or first looked up, for a static token).
	IssuedAt time.Time
	// ExpiresAt is when the token expires unless renewed; zero if it never expires.
	ExpiresAt time.Time
	// MaxExpiresAt is when the token ends for good, if known.
	MaxExpiresAt time.Time
	// RenewAt is when the client will renew the token or log in again, at the next call.
	RenewAt     time.Time
	TTL         time.Duration
	Renewable   bool
	Policies    []string
	Logins      int
	Renewals    int
	LastRenewal time.Time
	// MaxTTL is how long the auth role's tokens live at most, once a capped renewal has shown it;
	// zero while unknown (or for periodic tokens, which have none).
	MaxTTL time.Duration
}

// SecretData holds credential values. It formats and logs as its sorted keys only.
type SecretData map[string]string

// String lists the keys, never the values.
func (d SecretData) String() string {
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return fmt.Sprintf("SecretData{%s}", strings.Join(keys, ", "))
}

// GoString keeps %#v from printing the values.
func (d SecretData) GoString() string { return d.String() }

// MarshalLog keeps logr from printing the values.
func (d SecretData) MarshalLog() any { return d.String() }
