package rotation

import (
	"crypto/sha256"
	"encoding/binary"
	"time"
)

// Renewal timing bounds, in percent of the lease duration.
const (
	// DefaultRenewalPercent is used when the percent given is zero or negative.
	DefaultRenewalPercent = 67
	// MinRenewalPercent and MaxRenewalPercent bound the requested percent (the API's bounds).
	MinRenewalPercent = 10
	MaxRenewalPercent = 90
	// JitterPercent is how far, either way, the renewal may move from the requested percent.
	JitterPercent = 10
	// EarliestRenewalPercent: a lease is never renewed before this share of its duration has passed.
	EarliestRenewalPercent = 5
	// LatestRenewalPercent: a lease is always renewed before this share of its duration has passed,
	// so at least a tenth of the lease is left for retries.
	LatestRenewalPercent = 90
)

// NextRenewal returns when a lease issued or last renewed at renewedAt, for leaseDuration, is next
// renewed: at percent of the duration, moved by a jitter so that many clusters issued in the same
// second do not renew in the same second.
//
// Bounds: the result lies in [renewedAt + lo*d, renewedAt + hi*d] with d = leaseDuration,
// lo = max(percent-10, 5)% and hi = min(percent+10, 90)%; percent itself is first clamped to
// [10, 90] (0 or less means 67). Within that window the point is picked uniformly by a SHA-256 hash
// of key, so the same key always gives the same time (an operator restart does not move it) and
// different keys spread evenly. Pass a key that is stable for the lease and distinct per cluster,
// such as the RedisCluster's UID and the lease id ("<uid>/<lease-id>").
//
// The result is never later than 90% of the lease; it may be before now when a renewal was missed
// (the operator was down), which Decide treats as due at once. It returns the zero time when
// leaseDuration is not positive: such a lease has no expiry to renew against.
func NextRenewal(renewedAt time.Time, leaseDuration time.Duration, percent int32, key string) time.Time {
	if leaseDuration <= 0 {
		return time.Time{}
	}
	lo, hi := renewalWindow(percent)
	from, to := share(leaseDuration, lo), share(leaseDuration, hi)
	return renewedAt.Add(from + jitter(key, to-from))
}

// renewalWindow returns the window, in percent of the lease, in which the renewal falls.
func renewalWindow(percent int32) (lo, hi int64) {
	p := int64(percent)
	switch {
	case p <= 0:
		p = DefaultRenewalPercent
	case p < MinRenewalPercent:
		p = MinRenewalPercent
	case p > MaxRenewalPercent:
		p = MaxRenewalPercent
	}
	return max(p-JitterPercent, EarliestRenewalPercent), min(p+JitterPercent, LatestRenewalPercent)
}

// share returns percent% of d without overflowing for long durations.
func share(d time.Duration, percent int64) time.Duration {
	return d/100*time.Duration(percent) + d%100*time.Duration(percent)/100
}

// jitter maps key to a duration in [0, span], the same for the same key.
func jitter(key string, span time.Duration) time.Duration {
	if span <= 0 {
		return 0
	}
	sum := sha256.Sum256([]byte(key))
	return time.Duration(binary.BigEndian.Uint64(sum[:8]) % uint64(span+1))
}
