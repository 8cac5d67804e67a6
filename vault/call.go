package vault

import (
	"context"
	"sync/atomic"
	"time"
)

// attemptFunc makes one HTTP request, with the token h (nil for requests that carry none of the
// client's tokens).
type attemptFunc func(ctx context.Context, h *heldToken) error

// authMode says which token a call carries.
type authMode int

const (
	// noToken: logins, sys/health, and requests made with a token of their own.
	noToken authMode = iota
	// currentToken: the client's current token, brought up to date first.
	currentToken
	// issueToken: as currentToken, and the token must be fit to create leases (fitForLeases).
	issueToken
)

// call makes the request fn once and returns its failure, classified, without retrying. With a
// token mode, the current token is brought up to date first, and a token that Vault calls
// invalid is replaced by one new login, after which fn is made once more. call returns the token
// of the request that succeeded.
func (c *Client) call(ctx context.Context, op, path string, mode authMode, fn attemptFunc) (*heldToken, error) {
	for attempt := 1; ; attempt++ {
		h, err := c.carried(ctx, op, path, mode)
		if err != nil {
			return nil, err
		}
		err = c.attempt(ctx, op, h, fn)
		if err == nil {
			return h, nil
		}
		e := newError(op, path, err, c.secrets)
		e.Attempts = attempt
		if attempt > 1 || h == nil || !invalidToken(e) || !c.canLogin() {
			return nil, e
		}
		c.forgetToken(h)
		c.log.Info("Vault refused the client token, logging in again", "op", op, "accessor", h.accessor)
	}
}

// carried returns the token a request carries: none for noToken, else the current token,
// renewed or replaced first if it is due.
func (c *Client) carried(ctx context.Context, op, path string, mode authMode) (*heldToken, error) {
	if mode == noToken {
		return nil, nil
	}
	if err := c.ensureToken(ctx, mode == issueToken); err != nil {
		return nil, err
	}
	h := c.current()
	if h == nil {
		return nil, &Error{Op: op, Path: path, Class: ClassUnavailable, detail: "no Vault token"}
	}
	return h, nil
}

// attempt makes fn's request, unless the context has ended, and reports it to the observer.
func (c *Client) attempt(ctx context.Context, op string, h *heldToken, fn attemptFunc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	probe, err := c.unanswered.admit()
	if err != nil {
		return err
	}
	var reached atomic.Bool
	start := c.clock.Now()
	err = fn(limiterContext{traced(ctx, &reached)}, h)
	c.unanswered.done(probe, reached.Load(), err)
	if c.cfg.Observer != nil {
		outcome := OutcomeSuccess
		if err != nil {
			outcome = classify(err)
		}
		c.cfg.Observer(op, outcome, c.clock.Since(start))
	}
	return err
}

// limiterContext is a request's context with its deadline hidden, not removed: it still ends at
// the deadline. vault/api waits for the rate limiter with the request's context, and
// rate.Limiter.Wait refuses at once, without waiting, a wait that would end past the context's
// deadline; vault/api ignores that refusal and sends the request anyway, so that a busy client
// would exceed its rate limit. Without a deadline to see, the limiter waits, and the end of the
// context ends the wait and fails the request.
type limiterContext struct{ context.Context }

// Deadline reports none; Done and Err still end the context at its deadline.
func (limiterContext) Deadline() (time.Time, bool) { return time.Time{}, false }
