package vault

import (
	"regexp"
	"sort"
	"strings"
	"sync"
)

const (
	redacted = "[redacted]"
	// minSecretLength: shorter values are not searched for, so that a one-letter value does not
	// shred every message.
	minSecretLength = 4
	// maxRememberedSecrets bounds the memory of values to remove from messages: the oldest are
	// forgotten first.
	maxRememberedSecrets = 1024
)

// secretPatterns match secrets the client may not know by value: Vault tokens (hvs., hvb., hvr.
// and the legacy s., b., r. prefixes) and JSON web tokens.
var secretPatterns = []*regexp.Regexp{
	regexp.MustCompile(`\b(?:hv[sbr]|[sbr])\.[A-Za-z0-9_.\-]{20,}`),
	regexp.MustCompile(`eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*`),
}

// redactor removes secret values from text meant for errors and logs: the tokens, secret IDs and
// service-account tokens the client has used and the credential values it has issued.
type redactor struct {
	mu     sync.Mutex
	ring   []string
	next   int
	known  map[string]struct{}
	sorted []string // known values, longest first; nil when it needs rebuilding
}

func newRedactor() *redactor {
	return &redactor{known: make(map[string]struct{})}
}

// add remembers values to remove from now on.
func (r *redactor) add(values ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range values {
		if len(v) < minSecretLength {
			continue
		}
		if _, ok := r.known[v]; ok {
			continue
		}
		if len(r.ring) < maxRememberedSecrets {
			r.ring = append(r.ring, v)
		} else {
			delete(r.known, r.ring[r.next])
			r.ring[r.next] = v
			r.next = (r.next + 1) % maxRememberedSecrets
		}
		r.known[v] = struct{}{}
		r.sorted = nil
	}
}

// redact returns s without any remembered secret value and without anything shaped like a
// Vault token or a JSON web token.
func (r *redactor) redact(s string) string {
	for _, v := range r.values() {
		s = strings.ReplaceAll(s, v, redacted)
	}
	for _, p := range secretPatterns {
		s = p.ReplaceAllString(s, redacted)
	}
	return s
}

func (r *redactor) values() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sorted == nil {
		r.sorted = make([]string, 0, len(r.known))
		for v := range r.known {
			r.sorted = append(r.sorted, v)
		}
		// Longest first, so that a secret containing another is removed whole.
		sort.Slice(r.sorted, func(i, j int) bool { return len(r.sorted[i]) > len(r.sorted[j]) })
	}
	return r.sorted
}
