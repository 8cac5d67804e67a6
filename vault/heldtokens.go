package vault

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// Vault revokes every lease with the token that created it. So the client keeps, besides its
// current token, every earlier token that may still own a live lease, renews each before it
// expires for as long as its leases live, and persists them in a TokenStore so that another
// process (a restarted operator, a new leader) takes them over.

// TokenStore persists the tokens a client holds, by accessor. The operator keeps them in a
// Kubernetes Secret that only it may read.
type TokenStore interface {
	// Load returns the persisted tokens, accessor to token.
	Load(ctx context.Context) (map[string]string, error)
	// Save adds the tokens in put (accessor to token) and removes the accessors in drop.
	Save(ctx context.Context, put map[string]string, drop []string) error
}

// tokenGrace is how long a token is kept after it last created a lease (or was taken over from
// the store) even if no lease of it has been reported: the ledger that names the lease may not
// have reached the caller of KeepTokens yet.
const tokenGrace = 5 * time.Minute

// TokenStatus describes one token the client holds, never the token itself.
type TokenStatus struct {
	// Accessor identifies the token without revealing it.
	Accessor string
	// Current says new work uses this token.
	Current   bool
	IssuedAt  time.Time
	ExpiresAt time.Time // zero: never
	// EndsAt is when the token ends for good (its max TTL), if known; Vault then revokes its leases.
	EndsAt      time.Time
	RenewAt     time.Time
	Renewable   bool
	LastRenewal time.Time
}

func (h *heldToken) status(current bool) TokenStatus {
	return TokenStatus{
		Accessor: h.accessor, Current: current, IssuedAt: h.issuedAt, ExpiresAt: h.expiresAt(),
		EndsAt: h.deadline(), RenewAt: h.renewAt(), Renewable: h.renewable, LastRenewal: h.lastRenewal,
	}
}

// Token describes a token the client holds, by accessor.
func (c *Client) Token(accessor string) (TokenStatus, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	h, ok := c.held[accessor]
	if !ok {
		return TokenStatus{}, false
	}
	return h.status(h == c.cur), true
}

// Tokens describes every token the client holds, the current one first, then oldest first.
func (c *Client) Tokens() []TokenStatus {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]TokenStatus, 0, len(c.held))
	for _, h := range c.held {
		out = append(out, h.status(h == c.cur))
	}
	slices.SortFunc(out, func(a, b TokenStatus) int {
		switch {
		case a.Current != b.Current:
			if a.Current {
				return -1
			}
			return 1
		case !a.IssuedAt.Equal(b.IssuedAt):
			return a.IssuedAt.Compare(b.IssuedAt)
		}
		return cmp.Compare(a.Accessor, b.Accessor)
	})
	return out
}

// KeepTokens keeps the tokens that own live leases alive, and makes sure there is a valid current
// token (logging in when there is none). needs says, by accessor, until when
// leases of that token live (their latest expiry). Each needed token is renewed once it is due,
// asking for a TTL that covers its leases where Vault allows; the current token is renewed or
// replaced as calls would; a token that is neither current nor needed (nor within tokenGrace of
// creating a lease) is given up: dropped from memory and from the store, not revoked. It returns
// the tokens held afterwards, and the first renewal error (the others are retried at their next
// due time).
func (c *Client) KeepTokens(ctx context.Context, needs map[string]time.Time) ([]TokenStatus, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	if err := c.lockAuth(ctx); err != nil {
		return c.Tokens(), newError(opRenewSelf, "", err, c.secrets)
	}
	defer c.unlockAuth()
	if err := c.loadTokens(ctx); err != nil {
		return c.Tokens(), err
	}
	if h := c.current(); h == nil || !h.valid(c.clock.Now()) {
		if err := c.obtain(ctx); err != nil {
			return c.Tokens(), err
		}
	}
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	var drop []string
	for _, h := range c.heldTokens(needs) {
		switch {
		case h == c.current():
			if c.refreshDue(false) {
				keep(c.refresh(ctx, false))
			}
		case !c.needed(h):
			drop = append(drop, h.accessor)
		default:
			keep(c.keepAlive(ctx, h))
		}
	}
	if len(drop) > 0 {
		c.mu.Lock()
		for _, a := range drop {
			delete(c.held, a)
		}
		c.mu.Unlock()
		c.log.Info("Gave up Vault tokens that own no live lease", "accessors", drop)
		c.dropTokens(ctx, drop)
	}
	return c.Tokens(), first
}

// heldTokens records needs on the held tokens and returns them.
func (c *Client) heldTokens(needs map[string]time.Time) []*heldToken {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*heldToken, 0, len(c.held))
	for a, h := range c.held {
		h.need = needs[a]
		out = append(out, h)
	}
	return out
}

// needed says whether a token that is not current must be kept: a lease of it lives, or it
// created a lease (or was taken over) a moment ago.
func (c *Client) needed(h *heldToken) bool {
	now := c.clock.Now()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !h.valid(now) {
		return false
	}
	recent := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) < tokenGrace }
	return h.need.After(now) || recent(h.lastIssue) || recent(h.adoptedAt)
}

// keepAlive renews a token that is not current when it is due. A token Vault no longer knows is
// forgotten: its leases are gone with it.
func (c *Client) keepAlive(ctx context.Context, h *heldToken) error {
	c.mu.RLock()
	s := h.tokenState
	c.mu.RUnlock()
	at := s.renewAt()
	if !s.renewable || at.IsZero() || c.clock.Now().Before(at) {
		return nil
	}
	_, err := c.renewSelf(ctx, h)
	switch {
	case err == nil:
		return nil
	case invalidToken(err):
		c.log.Info("Vault no longer knows a token that owned leases; they are gone with it", "accessor", s.accessor)
		c.forgetToken(h)
		return nil
	}
	now := c.clock.Now()
	c.updateToken(h, func(t *tokenState) { t.retryAt = now.Add(min(refreshRetryInterval, t.expiresAt().Sub(now)/4)) })
	return err
}

// loaded says whether the token store has been read (always, without one).
func (c *Client) loaded() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.storeLoaded
}

// loadTokens takes over the tokens of the store, once: each is looked up with itself; one that
// Vault no longer knows is removed from the store, and the freshest one that can still create
// leases becomes current, so that a restarted operator needs no new login. It runs under the auth
// lock.
func (c *Client) loadTokens(ctx context.Context) error {
	if c.loaded() {
		return nil
	}
	if c.cfg.Tokens == nil || !c.canLogin() {
		c.markLoaded()
		return nil
	}
	stored, err := c.cfg.Tokens.Load(ctx)
	if err != nil {
		return &Error{Op: opLookupSelf, Class: ClassUnavailable, detail: "reading the token store: " + redactMessages([]string{err.Error()}, c.secrets)[0]}
	}
	var gone []string
	for accessor, token := range stored {
		c.secrets.add(token)
		h, err := c.adopt(ctx, token)
		switch {
		case IsPermissionDenied(err) || IsNotFound(err):
			gone = append(gone, accessor)
		case err != nil:
			return err
		default:
			c.mu.Lock()
			c.held[h.accessor] = h
			c.mu.Unlock()
		}
	}
	c.chooseCurrent()
	c.markLoaded()
	if len(gone) > 0 {
		c.log.Info("Vault no longer knows persisted tokens; removing them", "accessors", gone)
		c.dropTokens(ctx, gone)
	}
	if n := len(stored) - len(gone); n > 0 {
		c.log.Info("Took over persisted Vault tokens", "count", n, "current", c.state().accessor)
	}
	return nil
}

func (c *Client) markLoaded() {
	c.mu.Lock()
	c.storeLoaded = true
	c.mu.Unlock()
}

// adopt looks a persisted token up and holds it.
func (c *Client) adopt(ctx context.Context, token string) (*heldToken, error) {
	h, err := c.hold(tokenState{token: token, accessor: accessorOf("", token)})
	if err != nil {
		return nil, err
	}
	data, err := c.lookupSelf(ctx, h)
	if err != nil {
		return nil, err
	}
	now := c.clock.Now()
	h.tokenState = lookedUpState(token, data, now)
	h.adoptedAt = now
	return h, nil
}

// chooseCurrent makes the freshest valid held token that can still create leases current, when
// there is no current token.
func (c *Client) chooseCurrent() {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil {
		return
	}
	for _, h := range c.held {
		if h.valid(now) && h.renewable && c.fitForLeases(h.tokenState, now) && (c.cur == nil || h.issuedAt.After(c.cur.issuedAt)) {
			c.cur = h
		}
	}
}

// saveTokens adds tokens to the token store, if there is one.
func (c *Client) saveTokens(ctx context.Context, put map[string]string) error {
	if c.cfg.Tokens == nil || len(put) == 0 {
		return nil
	}
	return c.cfg.Tokens.Save(ctx, put, nil)
}

// dropTokens removes tokens from the token store, if there is one. A failure is only logged: a
// stale entry is dropped at the next load, when Vault no longer knows the token.
func (c *Client) dropTokens(ctx context.Context, accessors []string) {
	if c.cfg.Tokens == nil || len(accessors) == 0 {
		return
	}
	if err := c.cfg.Tokens.Save(ctx, nil, accessors); err != nil {
		c.log.Info("Could not remove given-up tokens from the token store", "error", redactMessages([]string{err.Error()}, c.secrets)[0])
	}
}

// noteIssue records that a token created a lease now.
func (c *Client) noteIssue(h *heldToken) {
	if h == nil {
		return
	}
	now := c.clock.Now()
	c.mu.Lock()
	h.lastIssue = now
	c.mu.Unlock()
}
