package rotation

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var issuedAt = time.Date(2025, time.June, 2, 9, 50, 0, 0, time.UTC)

// goldenOffset is where the key of TestNextRenewalDeterministic renews in a 1h lease at 67%:
// 34m12s + SHA-256(key)[:8] mod (12m + 1ns), computed independently of this package.
const goldenOffset = 37*time.Minute + 59*time.Second + 149973760*time.Nanosecond

func TestNextRenewalBounds(t *testing.T) {
	cases := map[string]struct {
		lease    time.Duration
		percent  int32
		from, to time.Duration // the window, from issuedAt
	}{
		"default 67%":        {lease: time.Hour, percent: 67, from: 34*time.Minute + 12*time.Second, to: 46*time.Minute + 12*time.Second},
		"zero means 67%":     {lease: time.Hour, percent: 0, from: 34*time.Minute + 12*time.Second, to: 46*time.Minute + 12*time.Second},
		"10%, cut at 5%":     {lease: time.Hour, percent: 10, from: 3 * time.Minute, to: 12 * time.Minute},
		"below 10% is 10%":   {lease: time.Hour, percent: 3, from: 3 * time.Minute, to: 12 * time.Minute},
		"90%, cut at 90%":    {lease: time.Hour, percent: 90, from: 48 * time.Minute, to: 54 * time.Minute},
		"above 90% is 90%":   {lease: time.Hour, percent: 150, from: 48 * time.Minute, to: 54 * time.Minute},
		"long lease (768h)":  {lease: 768 * time.Hour, percent: 67, from: 768 * time.Hour * 57 / 100, to: 768 * time.Hour * 77 / 100},
		"short lease (10s)":  {lease: 10 * time.Second, percent: 50, from: 4 * time.Second, to: 6 * time.Second},
		"odd lease (1h1ns)":  {lease: time.Hour + 1, percent: 67, from: 34*time.Minute + 12*time.Second, to: 46*time.Minute + 12*time.Second + 1},
		"percent 85, cut 90": {lease: 100 * time.Second, percent: 85, from: 75 * time.Second, to: 90 * time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			lo, hi := issuedAt.Add(tc.from), issuedAt.Add(tc.to)
			expiryMargin := issuedAt.Add(tc.lease * LatestRenewalPercent / 100)
			for i := range 500 {
				got := NextRenewal(issuedAt, tc.lease, tc.percent, fmt.Sprintf("uid-%d/lease", i))
				if got.Before(lo) || got.After(hi) {
					t.Fatalf("key %d: renewal at +%s, want within [+%s, +%s]", i, got.Sub(issuedAt), tc.from, tc.to)
				}
				if got.After(expiryMargin) {
					t.Fatalf("key %d: renewal at +%s is past 90%% of the lease", i, got.Sub(issuedAt))
				}
			}
		})
	}
}

func TestNextRenewalDeterministic(t *testing.T) {
	const key = "7f0c2f9e-5d6b-4a51-9d4a-0d5c1c6e3b21/database/creds/orders/abc123"
	first := NextRenewal(issuedAt, time.Hour, 67, key)
	if again := NextRenewal(issuedAt, time.Hour, 67, key); !again.Equal(first) {
		t.Fatalf("same key gave %s, then %s", first, again)
	}
	// A fixed value: the jitter must not depend on anything that changes between operator
	// restarts (process-seeded hashes, random numbers).
	want := issuedAt.Add(goldenOffset)
	if !first.Equal(want) {
		t.Errorf("NextRenewal = +%s, want +%s (the jitter changed)", first.Sub(issuedAt), goldenOffset)
	}
	if other := NextRenewal(issuedAt, time.Hour, 67, key+"x"); other.Equal(first) {
		t.Errorf("a different key gave the same time %s", other)
	}
}

func TestNextRenewalNoDuration(t *testing.T) {
	for name, d := range map[string]time.Duration{"zero": 0, "negative": -time.Hour} {
		t.Run(name, func(t *testing.T) {
			if got := NextRenewal(issuedAt, d, 67, "k"); !got.IsZero() {
				t.Errorf("NextRenewal with lease %s = %s, want zero", d, got)
			}
		})
	}
}

// TestNextRenewalSpreadsKeys: the keys of many clusters cover their window evenly; each tenth of
// the window holds between 5% and 15% of 1,000 keys.
func TestNextRenewalSpreadsKeys(t *testing.T) {
	const n = 1000
	lo := issuedAt.Add(share(time.Hour, 57))
	span := share(time.Hour, 20)
	var tenths [10]int
	for _, key := range clusterKeys(n) {
		offset := NextRenewal(issuedAt, time.Hour, 67, key).Sub(lo)
		tenths[min(int(offset*10/span), 9)]++
	}
	for i, c := range tenths {
		if c < n*5/100 || c > n*15/100 {
			t.Errorf("tenth %d of the window holds %d of %d keys, want 50..150 (all: %v)", i, c, n, tenths)
		}
	}
}

// TestRenewalSpreadTarget is the performance target: 1,000 clusters with the same lease duration,
// issued in the same second, renew with no more than 5% of them in any one second.
func TestRenewalSpreadTarget(t *testing.T) {
	cases := map[string]time.Duration{"5m": 5 * time.Minute, "1h": time.Hour, "24h": 24 * time.Hour, "768h": 768 * time.Hour}
	for name, lease := range cases {
		t.Run(name, func(t *testing.T) {
			share, second := largestShareInOneSecond(1000, lease)
			t.Logf("lease %s: largest share of 1,000 renewals in one second: %.1f%% (at %s)", lease, share*100, second.Format(time.RFC3339))
			if share > 0.05 {
				t.Errorf("%.1f%% of the renewals fall in one second, want at most 5%%", share*100)
			}
		})
	}
}

// BenchmarkRenewalSpread computes the renewal times of 1,000 clusters issued in the same second
// with a 1h lease and reports the largest share of them in any one second.
func BenchmarkRenewalSpread(b *testing.B) {
	var share float64
	for b.Loop() {
		share, _ = largestShareInOneSecond(1000, time.Hour)
	}
	b.ReportMetric(share*100, "%max/s")
}

// largestShareInOneSecond returns the largest share of n clusters' renewals that fall in one
// second, and that second.
func largestShareInOneSecond(n int, lease time.Duration) (float64, time.Time) {
	issued := issuedAt.Add(300 * time.Millisecond) // all issued within the same second
	perSecond := map[int64]int{}
	var most, busiest int64
	for _, key := range clusterKeys(n) {
		s := NextRenewal(issued, lease, DefaultRenewalPercent, key).Unix()
		perSecond[s]++
		if c := int64(perSecond[s]); c > most {
			most, busiest = c, s
		}
	}
	return float64(most) / float64(n), time.Unix(busiest, 0).UTC()
}

// clusterKeys returns n distinct renewal keys shaped like "<RedisCluster UID>/<lease id>".
func clusterKeys(n int) []string {
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x/database/creds/orders/%x",
			r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xfff, r.Uint32()&0xffff, r.Uint64()&0xffffffffffff, r.Uint64())
	}
	return keys
}
