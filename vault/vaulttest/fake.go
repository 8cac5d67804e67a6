// Package vaulttest provides an in-memory fake of the Vault client for controller unit tests: it
// implements vault.LeaseClient and vault.ConnectionClient, issues, renews, looks up and revokes
// leases against a clock, counts the calls, and fails them on demand with classified errors.
package vaulttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/keyroll/keyroll/vault"
)

// Operations, for Calls, FailNext and SetFailure.
const (
	OpIssue  = "issue"
	OpRenew  = "renew"
	OpRevoke = "revoke"
	// OpListLeases lists the leases under a path.
	OpListLeases = "list-leases"
	OpLookup     = "lookup"
	OpHealth     = "health"
	OpLogin      = "login"
	OpKeep       = "keep-tokens"
)

var (
	_ vault.LeaseClient      = (*Fake)(nil)
	_ vault.ConnectionClient = (*Fake)(nil)
)

// Fake is an in-memory Vault client, for the callers of vault.LeaseClient and
// vault.ConnectionClient. Set its exported fields before the first call; they are read
// under its lock, so a test may also change them between calls.
type Fake struct {
	mu sync.Mutex

	// LeaseDuration is the TTL of issued leases and the default renewal increment. Default 1h.
	LeaseDuration time.Duration
	// MaxTTL caps a lease's life from its issue; zero means no cap.
	MaxTTL time.Duration
	// NotRenewable issues leases that cannot be renewed.
	NotRenewable bool
	// TokenDeadline is reported on issued leases (OutlivesToken is computed from it).
	TokenDeadline time.Time
	// HealthStatus is what Health returns. Default: initialized, unsealed, version 1.21.0.
	HealthStatus *vault.Health
	// Current is what TokenInfo returns. Its Accessor names the token that issues leases
	// (default "fake-accessor").
	Current vault.TokenInfo
	// Held is what KeepTokens and Tokens return and Token looks up (default: one current token).
	Held []vault.TokenStatus
	// Needs is what KeepTokens was last told.
	Needs map[string]time.Time

	clock    clock.Clock
	seq      int
	leases   map[string]*fakeLease
	calls    map[string]int
	failNext map[string][]error
	failures map[string]error
}

type fakeLease struct {
	path       string
	data       vault.SecretData
	issuedAt   time.Time
	expiresAt  time.Time
	maxExpires time.Time
	renewable  bool
}

// New returns an empty fake on clk (nil: the real clock).
func New(clk clock.Clock) *Fake {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Fake{
		clock:    clk,
		leases:   make(map[string]*fakeLease),
		calls:    make(map[string]int),
		failNext: make(map[string][]error),
		failures: make(map[string]error),
	}
}

// Err returns a classified error like the real client's, for FailNext and SetFailure.
func Err(op, class string) error {
	return &vault.Error{Op: op, Class: class, Attempts: 1}
}

// FailNext makes the next calls of op fail with errs, one error per call, in order.
func (f *Fake) FailNext(op string, errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext[op] = append(f.failNext[op], errs...)
}

// SetFailure makes every call of op fail with err, until SetFailure(op, nil).
func (f *Fake) SetFailure(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.failures, op)
		return
	}
	f.failures[op] = err
}

// Calls is how many times op was called, failed calls included.
func (f *Fake) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Leases returns the IDs of the leases that exist (issued, not revoked, not expired), sorted.
func (f *Fake) Leases() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	var ids []string
	for id, l := range f.leases {
		if now.Before(l.expiresAt) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// RevokeOutside revokes a lease behind the client's back, as an administrator would.
func (f *Fake) RevokeOutside(leaseID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.leases, leaseID)
}

// begin counts a call of op and returns the error it must fail with, if any.
func (f *Fake) begin(ctx context.Context, op string) error {
	f.calls[op]++
	if err := ctx.Err(); err != nil {
		return &vault.Error{Op: op, Class: vault.ClassOf(err), Attempts: 1}
	}
	if q := f.failNext[op]; len(q) > 0 {
		f.failNext[op] = q[1:]
		return q[0]
	}
	return f.failures[op]
}

func (f *Fake) lease(op, leaseID string, now time.Time) (*fakeLease, error) {
	l, ok := f.leases[leaseID]
	if !ok || !now.Before(l.expiresAt) {
		delete(f.leases, leaseID)
		return nil, &vault.Error{Op: op, Path: leaseID, Class: vault.ClassLeaseGone, StatusCode: 400, Attempts: 1}
	}
	return l, nil
}

// Issue issues a lease for path with a random username and password.
func (f *Fake) Issue(ctx context.Context, p string) (*vault.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(ctx, OpIssue); err != nil {
		return nil, err
	}
	f.seq++
	now := f.clock.Now()
	ttl := f.leaseDuration()
	l := &fakeLease{
		path:      p,
		data:      vault.SecretData{"username": fmt.Sprintf("v-%s-%d-%s", path.Base(p), f.seq, randomHex(3)), "password": randomHex(16)},
		issuedAt:  now,
		expiresAt: now.Add(ttl),
		renewable: !f.NotRenewable,
	}
	if f.MaxTTL > 0 {
		l.maxExpires = now.Add(f.MaxTTL)
		l.expiresAt = minTime(l.expiresAt, l.maxExpires)
	}
	// Vault's lease IDs are random: two fakes (two Vaults) never hand out the same one.
	id := fmt.Sprintf("%s/fake%06d-%s", p, f.seq, randomHex(4))
	f.leases[id] = l
	out := &vault.Lease{
		ID: id, Duration: l.expiresAt.Sub(now), Renewable: l.renewable, Data: copyData(l.data),
		IssuedAt: now, ExpiresAt: l.expiresAt, TokenDeadline: f.TokenDeadline, TokenAccessor: f.accessor(),
	}
	out.OutlivesToken = !f.TokenDeadline.IsZero() && out.ExpiresAt.After(f.TokenDeadline)
	return out, nil
}

// Renew extends a lease by increment (0: LeaseDuration), capped by MaxTTL.
func (f *Fake) Renew(ctx context.Context, leaseID string, increment time.Duration) (*vault.Renewal, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(ctx, OpRenew); err != nil {
		return nil, err
	}
	now := f.clock.Now()
	l, err := f.lease(OpRenew, leaseID, now)
	if err != nil {
		return nil, err
	}
	if !l.renewable {
		return nil, &vault.Error{Op: OpRenew, Path: leaseID, Class: vault.ClassBadRequest, StatusCode: 400, Attempts: 1,
			Messages: []string{"lease is not renewable"}}
	}
	asked := increment
	if asked <= 0 {
		asked = f.leaseDuration()
	}
	granted, capped := asked, false
	if !l.maxExpires.IsZero() && now.Add(asked).After(l.maxExpires) {
		granted, capped = l.maxExpires.Sub(now), true
	}
	l.expiresAt = now.Add(granted)
	return &vault.Renewal{Duration: granted, ExpiresAt: l.expiresAt, Renewable: true, Capped: capped}, nil
}

// Revoke deletes a lease; revoking a lease that is gone succeeds.
func (f *Fake) Revoke(ctx context.Context, leaseID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(ctx, OpRevoke); err != nil {
		return err
	}
	delete(f.leases, leaseID)
	return nil
}

// Lookup reports whether a lease exists and when it expires.
func (f *Fake) Lookup(ctx context.Context, leaseID string) (*vault.LeaseInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(ctx, OpLookup); err != nil {
		return nil, err
	}
	now := f.clock.Now()
	l, err := f.lease(OpLookup, leaseID, now)
	if err != nil {
		return &vault.LeaseInfo{Exists: false}, nil
	}
	return &vault.LeaseInfo{
		Exists: true, IssuedAt: l.issuedAt, ExpiresAt: l.expiresAt, TTL: l.expiresAt.Sub(now), Renewable: l.renewable,
	}, nil
}

// ListLeases lists the live leases under prefix (a credential path).
func (f *Fake) ListLeases(ctx context.Context, prefix string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(ctx, OpListLeases); err != nil {
		return nil, err
	}
	now := f.clock.Now()
	var ids []string
	for id, l := range f.leases {
		if strings.HasPrefix(id, strings.Trim(prefix, "/")+"/") && now.Before(l.expiresAt) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Health returns HealthStatus.
func (f *Fake) Health(ctx context.Context) (*vault.Health, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(ctx, OpHealth); err != nil {
		return nil, err
	}
	if f.HealthStatus != nil {
		h := *f.HealthStatus
		return &h, nil
	}
	return &vault.Health{Initialized: true, Version: "1.21.0"}, nil
}

// TokenInfo returns Current.
func (f *Fake) TokenInfo() vault.TokenInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Current
}

// KeepTokens records needs and returns Held.
func (f *Fake) KeepTokens(ctx context.Context, needs map[string]time.Time) ([]vault.TokenStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Needs = needs
	return f.held(), f.begin(ctx, OpKeep)
}

// Token looks up a token of Held by accessor.
func (f *Fake) Token(accessor string) (vault.TokenStatus, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.held() {
		if t.Accessor == accessor {
			return t, true
		}
	}
	return vault.TokenStatus{}, false
}

// Tokens returns Held.
func (f *Fake) Tokens() []vault.TokenStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held()
}

func (f *Fake) held() []vault.TokenStatus {
	if f.Held != nil {
		return append([]vault.TokenStatus(nil), f.Held...)
	}
	return []vault.TokenStatus{{Accessor: f.accessor(), Current: true, EndsAt: f.TokenDeadline, Renewable: true}}
}

func (f *Fake) accessor() string {
	if f.Current.Accessor != "" {
		return f.Current.Accessor
	}
	return "fake-accessor"
}

// Login counts a login.
func (f *Fake) Login(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.begin(ctx, OpLogin)
}

func (f *Fake) leaseDuration() time.Duration {
	if f.LeaseDuration > 0 {
		return f.LeaseDuration
	}
	return time.Hour
}

func copyData(d vault.SecretData) vault.SecretData {
	out := make(vault.SecretData, len(d))
	for k, v := range d {
		out[k] = v
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
