package vault

import (
	"context"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
)

// renewFraction of a token's TTL passes before the client renews it (or logs in again).
const renewFraction = 2.0 / 3.0

// refreshRetryInterval bounds how often a failed renewal or login is tried again while the
// current token is still valid.
const refreshRetryInterval = 10 * time.Second

// tokenState is what the client knows of its Vault token.
type tokenState struct {
	token       string
	issuedAt    time.Time     // login (or first lookup of a static token)
	refreshedAt time.Time     // last login or renewal
	ttl         time.Duration // granted by the last login or renewal; 0: never expires
	loginTTL    time.Duration // granted at login: the increment asked for on renewal
	renewable   bool          // false also once a renewal was capped: it cannot be extended
	maxExpires  time.Time     // when the token ends for good, if known
	policies    []string
	retryAt     time.Time // after a failed refresh: not before this
	final       bool      // nothing more can be done (a static token that cannot be extended)

	logins, renewals int
	lastRenewal      time.Time
	maxTTL           time.Duration // learned from a capped renewal; applies to later logins
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

func (c *client) state() tokenState {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.tok
}

func (c *client) update(f func(s *tokenState)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.tok)
	c.api.SetToken(c.tok.token)
}

func (c *client) canLogin() bool { return c.cfg.Auth.Token == nil }

// TokenInfo describes the client's token, never the token itself.
func (c *client) TokenInfo() TokenInfo {
	s := c.state()
	return TokenInfo{
		Method:       c.cfg.Auth.method(),
		Valid:        s.valid(c.clock.Now()),
		IssuedAt:     s.issuedAt,
		ExpiresAt:    s.expiresAt(),
		MaxExpiresAt: s.deadline(),
		RenewAt:      s.renewAt(),
		TTL:          s.ttl,
		Renewable:    s.renewable,
		Policies:     append([]string(nil), s.policies...),
		Logins:       s.logins,
		Renewals:     s.renewals,
		LastRenewal:  s.lastRenewal,
	}
}

// Login obtains a new token now (a static token is looked up again).
func (c *client) Login(ctx context.Context) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	if err := c.lockAuth(ctx); err != nil {
		return newError(opLogin, "", err, c.secrets)
	}
	defer c.unlockAuth()
	return c.obtain(ctx)
}

func (c *client) lockAuth(ctx context.Context) error {
	select {
	case c.authSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *client) unlockAuth() { <-c.authSem }

// refreshDue says whether the token must be obtained, renewed or replaced before a call.
func (c *client) refreshDue() bool {
	s := c.state()
	if s.token == "" {
		return true
	}
	at := s.renewAt()
	return !at.IsZero() && !c.clock.Now().Before(at)
}

// forgetToken drops a token Vault refused, so that the next call logs in again.
func (c *client) forgetToken(used string) {
	c.update(func(s *tokenState) {
		if s.token == used {
			s.token = ""
		}
	})
}

// ensureToken makes sure the client holds a token that is not due for renewal: it logs in, renews
// or logs in again as needed. One goroutine does so while the others wait for it.
func (c *client) ensureToken(ctx context.Context) error {
	if !c.refreshDue() {
		return nil
	}
	if err := c.lockAuth(ctx); err != nil {
		return newError(opLogin, "", err, c.secrets)
	}
	defer c.unlockAuth()
	if !c.refreshDue() {
		return nil
	}
	return c.refresh(ctx)
}

// refresh renews the token while Vault extends it, and logs in again when it is not renewable,
// the renewal fails, or the renewal was capped short of a useful TTL. While the current token is
// still valid, a failed refresh is logged and tried again later, and the call goes ahead.
func (c *client) refresh(ctx context.Context) error {
	s := c.state()
	var err error
	switch {
	case s.token == "":
		return c.obtain(ctx)
	case s.renewable:
		err = c.renewOrLogin(ctx, s)
	case c.canLogin():
		err = c.login(ctx)
	default:
		c.update(func(s *tokenState) { s.final = true })
		c.log.Info("Vault token cannot be extended or replaced", "expiresAt", s.expiresAt())
		return nil
	}
	if err == nil {
		return nil
	}
	now := c.clock.Now()
	if !s.valid(now) {
		return err
	}
	c.log.Error(err, "Refreshing the Vault token failed, using the current token meanwhile",
		"expiresAt", s.expiresAt())
	c.update(func(s *tokenState) { s.retryAt = now.Add(min(refreshRetryInterval, s.expiresAt().Sub(now)/4)) })
	return nil
}

func (c *client) renewOrLogin(ctx context.Context, s tokenState) error {
	short, err := c.renewSelf(ctx, s)
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
func (c *client) obtain(ctx context.Context) error {
	if c.canLogin() {
		return c.login(ctx)
	}
	return c.lookupSelf(ctx)
}

// renewSelf renews the token by the TTL it was issued with. short says Vault capped the renewal
// below half of that TTL: the token is near its max TTL.
func (c *client) renewSelf(ctx context.Context, s tokenState) (short bool, err error) {
	asked := wholeSeconds(s.loginTTL)
	var out *vaultapi.Secret
	err = c.call(ctx, opRenewSelf, "auth/token/renew-self", false, func(ctx context.Context) (err error) {
		out, err = c.put(ctx, c.api, "auth/token/renew-self", map[string]any{"increment": asked})
		return err
	})
	if err != nil {
		return false, err
	}
	if out == nil || out.Auth == nil {
		return false, &Error{Op: opRenewSelf, Class: ClassUnknown, detail: "the response holds no token information"}
	}
	granted := seconds(out.Auth.LeaseDuration)
	capped := asked > 0 && out.Auth.LeaseDuration < asked
	now := c.clock.Now()
	c.update(func(t *tokenState) {
		if t.token != s.token {
			return
		}
		t.refreshedAt, t.ttl, t.renewals, t.lastRenewal = now, granted, t.renewals+1, now
		t.renewable = out.Auth.Renewable && !capped
		t.retryAt = time.Time{}
		if capped {
			t.maxExpires = now.Add(granted)
			t.maxTTL = t.maxExpires.Sub(t.issuedAt)
		}
	})
	c.log.V(1).Info("Renewed the Vault token", "ttl", granted, "capped", capped)
	return capped && granted < s.loginTTL/2, nil
}
