package vault

import (
	"context"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
)

// renewFraction of a token's TTL passes before the client renews it (or logs in again).
const renewFraction = 2.0 / 3.0

// refreshRetryInterval bounds how often a failed renewal or login is tried again while the
// token is still valid.
const refreshRetryInterval = 10 * time.Second

// tokenState is what the client knows of one Vault token.
type tokenState struct {
	token       string
	accessor    string        // identifies the token without revealing it
	issuedAt    time.Time     // login (or first lookup of a static or persisted token)
	refreshedAt time.Time     // last login, renewal or lookup
	ttl         time.Duration // granted by the last login, renewal or lookup; 0: never expires
	loginTTL    time.Duration // granted at login: the least increment asked for on renewal
	renewable   bool          // false also once a renewal was capped: it cannot be extended
	maxExpires  time.Time     // when the token ends for good, if known
	policies    []string
	retryAt     time.Time // after a failed refresh: not before this
	final       bool      // nothing more can be done (a static token that cannot be extended)
	lastRenewal time.Time
}

func (s tokenState) expiresAt() time.Time {
	if s.ttl <= 0 {
		return time.Time{}
	}
	return s.refreshedAt.Add(s.ttl)
}

func (s tokenState) renewAt() time.Time {
	if s.ttl <= 0 || s.final {
		return time.Time{}
	}
	at := s.refreshedAt.Add(time.Duration(float64(s.ttl) * renewFraction))
	if s.retryAt.After(at) {
		return s.retryAt
	}
	return at
}

// deadline is when the token ends for good, as far as the client knows (zero: unknown or never).
func (s tokenState) deadline() time.Time {
	switch {
	case !s.maxExpires.IsZero():
		return s.maxExpires
	case !s.renewable || s.final:
		return s.expiresAt()
	}
	return time.Time{}
}

func (s tokenState) valid(now time.Time) bool {
	exp := s.expiresAt()
	return s.token != "" && (exp.IsZero() || now.Before(exp))
}

// heldToken is one token the client holds: the current one, which new work uses, or an earlier
// one that is kept alive because leases it created may still be live (Vault revokes a token's
// leases with it).
type heldToken struct {
	tokenState
	api       *vaultapi.Client // carries this token
	lastIssue time.Time        // when it last issued a lease, in this process
	adoptedAt time.Time        // when this process took it over from the token store
	need      time.Time        // the latest expiry of a lease it owns, as KeepTokens was last told
}

// current returns the token new work uses, nil before the first login.
func (c *Client) current() *heldToken {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cur
}

// state is a copy of the current token's state (zero before the first login).
func (c *Client) state() tokenState {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.cur == nil {
		return tokenState{}
	}
	return c.cur.tokenState
}

// updateToken changes the state of a held token under the lock.
func (c *Client) updateToken(h *heldToken, f func(s *tokenState)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&h.tokenState)
}

func (c *Client) canLogin() bool { return c.cfg.Auth.Token == nil }

// TokenInfo describes the client's current token, never the token itself.
func (c *Client) TokenInfo() TokenInfo {
	c.mu.RLock()
	logins, renewals, maxTTL := c.logins, c.renewals, c.learnedMaxTTL
	c.mu.RUnlock()
	s := c.state()
	return TokenInfo{
		Method:       c.cfg.Auth.method(),
		Accessor:     s.accessor,
		Valid:        s.valid(c.clock.Now()),
		IssuedAt:     s.issuedAt,
		ExpiresAt:    s.expiresAt(),
		MaxExpiresAt: s.deadline(),
		RenewAt:      s.renewAt(),
		TTL:          s.ttl,
		Renewable:    s.renewable,
		Policies:     append([]string(nil), s.policies...),
		Logins:       logins,
		Renewals:     renewals,
		LastRenewal:  s.lastRenewal,
		MaxTTL:       maxTTL,
	}
}

// Login obtains a new token now (a static token is looked up again). The token it replaces is
// kept alive while leases it created may be live.
func (c *Client) Login(ctx context.Context) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	if err := c.lockAuth(ctx); err != nil {
		return newError(opLogin, "", err, c.secrets)
	}
	defer c.unlockAuth()
	if err := c.loadTokens(ctx); err != nil {
		return err
	}
	return c.obtain(ctx)
}

func (c *Client) lockAuth(ctx context.Context) error {
	select {
	case c.authSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Client) unlockAuth() { <-c.authSem }

// refreshDue says whether the current token must be obtained, renewed or replaced before a call.
// forIssue also asks for a token that can still carry a new lease for long (see fitForLeases).
func (c *Client) refreshDue(forIssue bool) bool {
	s := c.state()
	if s.token == "" {
		return true
	}
	now := c.clock.Now()
	if now.Before(s.retryAt) {
		return false // a refresh failed a moment ago: not again yet
	}
	if forIssue && c.canLogin() && !c.fitForLeases(s, now) {
		return true
	}
	at := s.renewAt()
	return !at.IsZero() && !now.Before(at)
}

// fitForLeases says whether a token may still create leases: one whose end is known must have at
// least two thirds of its whole life left, so that a lease it creates can be rolled out and replaced
// in time before the token, and with it the lease, ends.
func (c *Client) fitForLeases(s tokenState, now time.Time) bool {
	end := s.deadline()
	if end.IsZero() {
		return true
	}
	life := end.Sub(s.issuedAt)
	return end.Sub(now) >= time.Duration(float64(life)*renewFraction)
}

// forgetToken drops a token Vault refused as invalid: it no longer exists, nor do its leases.
func (c *Client) forgetToken(h *heldToken) {
	c.mu.Lock()
	delete(c.held, h.accessor)
	if c.cur == h {
		c.cur = nil
	}
	c.mu.Unlock()
	c.dropTokens(context.Background(), []string{h.accessor})
}

// ensureToken makes sure the client holds a current token that is not due for renewal: it logs
// in, renews or logs in again as needed. One goroutine does so while the others wait for it.
func (c *Client) ensureToken(ctx context.Context, forIssue bool) error {
	if c.loaded() && !c.refreshDue(forIssue) {
		return nil
	}
	if err := c.lockAuth(ctx); err != nil {
		return newError(opLogin, "", err, c.secrets)
	}
	defer c.unlockAuth()
	if err := c.loadTokens(ctx); err != nil {
		return err
	}
	if !c.refreshDue(forIssue) {
		return nil
	}
	return c.refresh(ctx, forIssue)
}

// refresh renews the current token while Vault extends it, and logs in again when it is not
// renewable, the renewal fails, the renewal was capped short of a useful TTL, or (forIssue) the
// token is too close to its end to create leases. While the current token is still valid, a
// failed refresh is logged and tried again later, and the call goes ahead.
func (c *Client) refresh(ctx context.Context, forIssue bool) error {
	h := c.current()
	if h == nil {
		return c.obtain(ctx)
	}
	s := c.state()
	now := c.clock.Now()
	var err error
	switch {
	case forIssue && c.canLogin() && !c.fitForLeases(s, now):
		c.log.Info("Vault token is too close to its end to create leases, logging in again", "accessor", s.accessor, "endsAt", s.deadline())
		err = c.login(ctx)
	case s.renewable:
		err = c.renewOrLogin(ctx, h)
	case c.canLogin():
		err = c.login(ctx)
	default:
		c.updateToken(h, func(s *tokenState) { s.final = true })
		c.log.Info("Vault token cannot be extended or replaced", "expiresAt", s.expiresAt())
		return nil
	}
	if err == nil {
		return nil
	}
	if !s.valid(now) {
		return err
	}
	c.log.Error(err, "Refreshing the Vault token failed, using the current token meanwhile",
		"expiresAt", s.expiresAt())
	c.updateToken(h, func(s *tokenState) { s.retryAt = now.Add(min(refreshRetryInterval, s.expiresAt().Sub(now)/4)) })
	return nil
}

func (c *Client) renewOrLogin(ctx context.Context, h *heldToken) error {
	short, err := c.renewSelf(ctx, h)
	switch {
	case !c.canLogin():
		return err
	case err != nil:
		c.log.Info("Renewing the Vault token failed, logging in again", "error", err.Error())
	case short:
		c.log.Info("Vault token is near its max TTL, logging in again", "expiresAt", c.state().expiresAt())
	default:
		return nil
	}
	return c.login(ctx)
}

// obtain gets a token: a login, or a lookup of the static token.
func (c *Client) obtain(ctx context.Context) error {
	if c.canLogin() {
		return c.login(ctx)
	}
	return c.lookupStatic(ctx)
}

// renewSelf renews a token with that token (auth/token/renew-self). It asks for the TTL the token
// was issued with, or more when a lease it owns lives longer, so that the token outlives its leases
// where Vault allows. A renewal that Vault caps (its max TTL) tells when the token ends for good.
// short says the capped renewal left less than half of the login TTL.
func (c *Client) renewSelf(ctx context.Context, h *heldToken) (short bool, err error) {
	c.mu.RLock()
	s, need := h.tokenState, h.need
	c.mu.RUnlock()
	now := c.clock.Now()
	asked := max(s.loginTTL, need.Sub(now))
	var out *vaultapi.Secret
	_, err = c.call(ctx, opRenewSelf, "auth/token/renew-self", noToken, func(ctx context.Context, _ *heldToken) (err error) {
		out, err = h.api.Auth().Token().RenewSelfWithContext(ctx, wholeSeconds(asked))
		return err
	})
	if err != nil {
		return false, err
	}
	if out == nil || out.Auth == nil {
		return false, &Error{Op: opRenewSelf, Class: ClassUnknown, detail: "the response holds no token information"}
	}
	granted := seconds(out.Auth.LeaseDuration)
	capped := containsAny(out.Warnings, "exceeded the effective max_ttl")
	now = c.clock.Now()
	c.mu.Lock()
	t := &h.tokenState
	t.refreshedAt, t.ttl, t.lastRenewal = now, granted, now
	t.renewable = out.Auth.Renewable && !capped
	t.retryAt = time.Time{}
	if capped {
		t.maxExpires = now.Add(granted)
		c.learnedMaxTTL = t.maxExpires.Sub(t.issuedAt)
	}
	c.renewals++
	c.mu.Unlock()
	c.log.V(1).Info("Renewed the Vault token", "accessor", s.accessor, "ttl", granted, "capped", capped)
	return capped && granted < s.loginTTL/2, nil
}
