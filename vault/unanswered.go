package vault

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	"k8s.io/utils/clock"
)

// RetryUnanswered is how long a client waits, after Vault left one of its requests unanswered
// (no connection, or no answer before the deadline), before one request tries Vault again; the
// requests in between fail at once as Unavailable. So a Vault that does not answer holds one
// caller for the deadline, not every caller (a reconcile worker each), and the clusters of other
// VaultConnections go on.
const RetryUnanswered = 2 * time.Second

// unanswered is the state of that wait. A request that waits for the rate limiter past its
// deadline never reached Vault, and says nothing of it.
type unanswered struct {
	clock   clock.PassiveClock
	mu      sync.Mutex
	since   time.Time // when a request last went unanswered; zero: the last one was answered
	probing bool      // a request is trying Vault again
}

// admit says whether a request may go to Vault now, and whether it is the one trying again;
// refused, it returns the error the request fails with.
func (u *unanswered) admit() (probe bool, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.since.IsZero() {
		return false, nil
	}
	ago := u.clock.Since(u.since)
	if u.probing || ago < RetryUnanswered {
		return false, notTried{ago: ago}
	}
	u.probing = true
	return true, nil
}

// notTried is the failure of a request that admit refused.
type notTried struct{ ago time.Duration }

func (e notTried) Error() string {
	return fmt.Sprintf("Vault left a request unanswered %s ago; not tried again yet", e.ago.Round(time.Millisecond))
}

// done records how a request that was admitted ended; reached says it went out to Vault.
func (u *unanswered) done(probe, reached bool, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if probe {
		u.probing = false
	}
	var answer *vaultapi.ResponseError
	switch {
	case err == nil:
		u.since = time.Time{}
	case !reached || errors.Is(err, context.Canceled):
		// It says nothing of Vault.
	case classify(err) == ClassUnavailable && !errors.As(err, &answer):
		u.since = u.clock.Now() // no connection, or no answer before the deadline
	default:
		u.since = time.Time{} // Vault answered, if only with an error
	}
}

// traced is ctx with a trace that sets reached once the request dials Vault or is written to a
// connection: a request still waiting for the rate limiter when its deadline passes did neither.
func traced(ctx context.Context, reached *atomic.Bool) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart: func(string, string) { reached.Store(true) },
		WroteRequest: func(httptrace.WroteRequestInfo) { reached.Store(true) },
	})
}
