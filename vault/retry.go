package vault

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// attemptFunc performs one HTTP request, with the token h (nil for requests that carry none of
// the client's tokens).
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

// call runs fn until it succeeds, fails for a reason that retrying cannot fix, runs out of
// attempts, or the context ends. Every attempt waits for the rate limiter first. With a token
// mode, the current token is brought up to date before each attempt, a token that Vault calls
// invalid is replaced by a new login once, and call returns the token of the attempt that
// succeeded.
func (c *client) call(ctx context.Context, op, path string, mode authMode, fn attemptFunc) (*heldToken, error) {
	var last *Error
	relogged := false
	for attempt := 1; ; attempt++ {
		var h *heldToken
		if mode != noToken {
			if err := c.ensureToken(ctx, mode == issueToken); err != nil {
				return nil, err
			}
			if h = c.current(); h == nil {
				return nil, &Error{Op: op, Path: path, Class: ClassUnavailable, detail: "no Vault token"}
			}
		}
		if err := c.wait(ctx); err != nil {
			return nil, c.giveUp(last, op, path, attempt-1, err)
		}
		err := c.attempt(ctx, op, h, fn)
		if err == nil {
			return h, nil
		}
		if isContextError(err) && last != nil {
			return nil, c.giveUp(last, op, path, attempt, err)
		}
		last = newError(op, path, err, c.secrets)
		last.Attempts = attempt
		if h != nil && !relogged && invalidToken(last) && c.canLogin() {
			relogged = true
			c.forgetToken(h)
			c.log.Info("Vault refused the client token, logging in again", "op", op, "accessor", h.accessor)
			continue
		}
		if !retryable(last.Class) || attempt >= c.cfg.Retry.Attempts || ctx.Err() != nil {
			return nil, last
		}
		wait := c.backoff(attempt)
		c.log.V(1).Info("Retrying Vault request", "op", op, "path", path, "attempt", attempt,
			"class", last.Class, "status", last.StatusCode, "backoff", wait)
		if err := c.sleep(ctx, wait); err != nil {
			return nil, c.giveUp(last, op, path, attempt, err)
		}
	}
}

// attempt runs fn once and reports it to the observer.
func (c *client) attempt(ctx context.Context, op string, h *heldToken, fn attemptFunc) error {
	start := c.clock.Now()
	err := fn(ctx, h)
	if c.cfg.Observer != nil {
		outcome := OutcomeSuccess
		if err != nil {
			outcome = classify(err)
		}
		c.cfg.Observer(op, outcome, c.clock.Since(start))
	}
	return err
}

// giveUp reports the last failure when the context ends before the next attempt could succeed:
// "Vault is sealed" says more than "context deadline exceeded". A caller's cancellation is
// reported as such.
func (c *client) giveUp(last *Error, op, path string, attempts int, ctxErr error) error {
	if last == nil || errors.Is(ctxErr, context.Canceled) {
		e := newError(op, path, ctxErr, c.secrets)
		e.Attempts = attempts
		return e
	}
	e := *last
	e.Attempts = attempts
	e.cause = ctxErr
	if e.detail != "" {
		e.detail += "; "
	}
	e.detail += "gave up: " + ctxErr.Error()
	return &e
}

func isContextError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// backoff is the wait after a failed attempt: BaseBackoff doubled per attempt, at most
// MaxBackoff, of which a random half is taken off (jitter) so that many clients spread out.
func (c *client) backoff(attempt int) time.Duration {
	r := c.cfg.Retry
	d := r.MaxBackoff
	if attempt < 32 {
		if b := r.BaseBackoff << (attempt - 1); b > 0 && b < d {
			d = b
		}
	}
	half := d / 2
	return half + rand.N(half+1)
}

// sleep waits for d on the client's clock, or until the context ends.
func (c *client) sleep(ctx context.Context, d time.Duration) error {
	t := c.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// wait takes a token from the rate limiter, on the client's clock.
func (c *client) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := c.clock.Now()
	r := c.limiter.ReserveN(now, 1)
	if !r.OK() {
		return errors.New("rate limiter refuses every request")
	}
	d := r.DelayFrom(now)
	if d <= 0 {
		return nil
	}
	if err := c.sleep(ctx, d); err != nil {
		r.CancelAt(c.clock.Now())
		return err
	}
	return nil
}
