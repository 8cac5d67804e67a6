package vault

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

func healthy(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, map[string]any{"initialized": true, "version": "1.21.0"})
}

// arrivals records when requests reach the server.
type arrivals struct {
	mu    sync.Mutex
	times []time.Time
}

func (a *arrivals) wrap(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.times = append(a.times, time.Now())
		a.mu.Unlock()
		h(w, r)
	}
}

func (a *arrivals) sorted() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := append([]time.Time(nil), a.times...)
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// burstOfCalls makes n concurrent calls, Health and Lookup in turn (the login client and a
// token's client), and returns their errors.
func burstOfCalls(c *testClient, n int) []error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			if i%2 == 0 {
				_, errs[i] = c.Health(context.Background())
				return
			}
			_, errs[i] = c.Lookup(context.Background(), "l")
		})
	}
	wg.Wait()
	return errs
}

func lookupOK(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, map[string]any{"data": map[string]any{"id": "l", "ttl": 60, "renewable": true}})
}

// TestRateLimiterRealTime: a burst of concurrent calls, with and without a token, passes Burst at
// once, then QPS per second: no one-second window sees more than Burst+QPS requests, and the whole
// burst takes at least (n-Burst)/QPS.
func TestRateLimiterRealTime(t *testing.T) {
	const qps, burst, calls = 20, 5, 45
	c := newTestClient(t, func(cfg *Config) {
		cfg.Clock = clock.RealClock{}
		cfg.RateLimit = RateLimit{QPS: qps, Burst: burst}
	})
	seen := &arrivals{}
	c.vault.handle("auth/approle/login", seen.wrap(loginOK(testToken, time.Hour, true)))
	c.vault.handle("sys/health", seen.wrap(healthy))
	c.vault.handle("sys/leases/lookup", seen.wrap(lookupOK))
	start := time.Now()

	for _, err := range burstOfCalls(c, calls) {
		if err != nil {
			t.Fatal(err)
		}
	}

	elapsed := time.Since(start)
	requests := calls + 1 // and the login
	if min := time.Duration(requests-burst) * time.Second / qps; elapsed < min*9/10 || elapsed > 4*min {
		t.Errorf("%d requests took %v, want about %v", requests, elapsed, min)
	}
	times := seen.sorted()
	if len(times) != requests || c.vault.count("sys/leases/lookup") != calls/2 {
		t.Fatalf("server saw %d requests (%d lookups), want %d", len(times), c.vault.count("sys/leases/lookup"), requests)
	}
	for i := range times {
		n := 0
		for j := i; j < len(times) && times[j].Sub(times[i]) < time.Second; j++ {
			n++
		}
		if n > burst+qps+1 {
			t.Fatalf("%d requests within one second from request %d, want at most %d", n, i, burst+qps)
		}
	}
}

// TestRateLimitHoldsWhenTheWaitOutlastsTheDeadline: calls that would wait for the rate limiter
// past their deadline are not sent (vault/api alone would send them at once); they fail as
// Unavailable when the deadline ends their wait.
func TestRateLimitHoldsWhenTheWaitOutlastsTheDeadline(t *testing.T) {
	const qps, burst, calls, timeout = 5, 1, 10, 300 * time.Millisecond
	c := newTestClient(t, func(cfg *Config) {
		cfg.Clock = clock.RealClock{}
		cfg.RateLimit = RateLimit{QPS: qps, Burst: burst}
		cfg.Timeout = timeout
	})
	seen := &arrivals{}
	c.vault.handle("sys/health", seen.wrap(healthy))
	var wg sync.WaitGroup
	errs := make([]error, calls)
	start := time.Now()
	for i := range calls {
		wg.Go(func() { _, errs[i] = c.Health(context.Background()) })
	}
	wg.Wait()

	elapsed := time.Since(start)
	served := len(seen.sorted())
	if want := burst + int(timeout.Seconds()*qps) + 1; served < burst || served > want {
		t.Errorf("server saw %d of %d requests within %v, want at most %d", served, calls, elapsed, want)
	}
	failed := 0
	for _, err := range errs {
		switch {
		case err == nil:
		case IsUnavailable(err) && errors.Is(err, context.DeadlineExceeded):
			failed++
		default:
			t.Errorf("Health() = %v, want success or an Unavailable deadline error", err)
		}
	}
	if failed != calls-served || elapsed > timeout+time.Second {
		t.Errorf("%d calls failed after %v, want %d after about %v", failed, elapsed, calls-served, timeout)
	}
}
