package vault

import (
	"context"
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

// burstOfHealthCalls makes n concurrent Health calls and returns their errors.
func burstOfHealthCalls(c *testClient, n int) []error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = c.Health(context.Background())
		})
	}
	wg.Wait()
	return errs
}

// TestRateLimiterHoldsRate: a burst of concurrent calls passes Burst at once, then QPS per second,
// on the client's clock (here a fake one, so the accounting is exact).
func TestRateLimiterHoldsRate(t *testing.T) {
	cases := map[string]struct {
		qps   float64
		burst int
		calls int
	}{
		"10 qps, burst 2, 12 calls":  {qps: 10, burst: 2, calls: 12},
		"50 qps, burst 10, 60 calls": {qps: 50, burst: 10, calls: 60},
		"within the burst":           {qps: 1, burst: 5, calls: 5},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, func(cfg *Config) { cfg.RateLimit = RateLimit{QPS: tc.qps, Burst: tc.burst} })
			c.vault.handle("sys/health", healthy)
			autoStep(t, c.clock)

			for _, err := range burstOfHealthCalls(c, tc.calls) {
				if err != nil {
					t.Fatal(err)
				}
			}

			if got := c.vault.count("sys/health"); got != tc.calls {
				t.Errorf("server saw %d calls, want %d", got, tc.calls)
			}
			want := time.Duration(float64(tc.calls-tc.burst) / tc.qps * float64(time.Second))
			if elapsed := c.clock.Since(testEpoch); elapsed < want || elapsed > want+500*time.Millisecond {
				t.Errorf("the burst took %v on the client's clock, want about %v", elapsed, want)
			}
		})
	}
}

// TestRateLimiterRealTime checks the same on the real clock, with generous bounds: no one-second
// window sees more than Burst+QPS requests, and the whole burst takes at least (n-Burst)/QPS.
func TestRateLimiterRealTime(t *testing.T) {
	const qps, burst, calls = 20, 5, 45
	c := newTestClient(t, func(cfg *Config) {
		cfg.Clock = clock.RealClock{}
		cfg.RateLimit = RateLimit{QPS: qps, Burst: burst}
	})
	var mu sync.Mutex
	var arrivals []time.Time
	c.vault.handle("sys/health", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
		healthy(w, r)
	})
	start := time.Now()

	for _, err := range burstOfHealthCalls(c, calls) {
		if err != nil {
			t.Fatal(err)
		}
	}

	elapsed := time.Since(start)
	if min := time.Duration(calls-burst) * time.Second / qps; elapsed < min*9/10 || elapsed > 4*min {
		t.Errorf("%d calls took %v, want about %v", calls, elapsed, min)
	}
	if len(arrivals) != calls {
		t.Fatalf("server saw %d calls, want %d", len(arrivals), calls)
	}
	sort.Slice(arrivals, func(i, j int) bool { return arrivals[i].Before(arrivals[j]) })
	for i := range arrivals {
		n := 0
		for j := i; j < len(arrivals) && arrivals[j].Sub(arrivals[i]) < time.Second; j++ {
			n++
		}
		if n > burst+qps+1 {
			t.Fatalf("%d requests within one second from request %d, want at most %d", n, i, burst+qps)
		}
	}
}
