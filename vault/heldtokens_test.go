package vault

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// memStore is a TokenStore in memory that records the order of its writes.
type memStore struct {
	mu     sync.Mutex
	tokens map[string]string
	saves  []string // "put:<accessor>" and "drop:<accessor>", in order
	fail   error
}

func (s *memStore) Load(context.Context) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.tokens), nil
}

func (s *memStore) Save(_ context.Context, put map[string]string, drop []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	if s.tokens == nil {
		s.tokens = map[string]string{}
	}
	for _, a := range slices.Sorted(maps.Keys(put)) {
		s.tokens[a] = put[a]
		s.saves = append(s.saves, "put:"+a)
	}
	for _, a := range drop {
		delete(s.tokens, a)
		s.saves = append(s.saves, "drop:"+a)
	}
	return nil
}

func (s *memStore) accessors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.tokens))
}

// tokenRecorder answers with h and records the token each request carried.
type tokenRecorder struct {
	mu     sync.Mutex
	tokens []string
}

func (r *tokenRecorder) wrap(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.tokens = append(r.tokens, req.Header.Get("X-Vault-Token"))
		r.mu.Unlock()
		h(w, req)
	}
}

func (r *tokenRecorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.tokens...)
}

// TestReplacedTokenIsKeptWhileItOwnsLeases: a token replaced by a new login stays held, is renewed
// with itself while a lease of it lives, and is given up (dropped from the store) once none does.
func TestReplacedTokenIsKeptWhileItOwnsLeases(t *testing.T) {
	store := &memStore{}
	c := newTestClient(t, func(cfg *Config) { cfg.Tokens = store })
	c.vault.handle("auth/approle/login", sequence(loginOK(tokenA, time.Minute, true), loginOK(tokenB, time.Minute, true)))
	renewals := &tokenRecorder{}
	c.vault.handle("auth/token/renew-self", renewals.wrap(renewSelfOK(time.Minute, true)))
	c.vault.handle(credsPath, issueOK("l", time.Hour, nil))
	ctx := context.Background()

	lease := mustIssue(t, c, ctx)
	if lease.TokenAccessor != accessorFor(tokenA) {
		t.Fatalf("lease token accessor = %q, want %q", lease.TokenAccessor, accessorFor(tokenA))
	}
	if err := c.Login(ctx); err != nil { // a new login for new work
		t.Fatal(err)
	}
	if got := store.accessors(); !slices.Equal(got, []string{accessorFor(tokenA), accessorFor(tokenB)}) {
		t.Fatalf("store after two logins holds %q", got)
	}
	needs := map[string]time.Time{accessorFor(tokenA): testEpoch.Add(time.Hour)}

	c.clock.Step(41 * time.Second) // both tokens due
	held, err := c.KeepTokens(ctx, needs)

	if err != nil {
		t.Fatal(err)
	}
	if got := renewals.seen(); !slices.Contains(got, tokenA) || !slices.Contains(got, tokenB) {
		t.Errorf("renew-self carried tokens %q, want both the replaced and the current one", got)
	}
	if body := c.vault.lastBody("auth/token/renew-self"); body["increment"] != float64(3600-41) && body["increment"] != float64(60) {
		t.Errorf("renew-self increment = %v", body["increment"])
	}
	if len(held) != 2 || !held[0].Current || held[0].Accessor != accessorFor(tokenB) {
		t.Errorf("held = %+v, want the current token first, then the replaced one", held)
	}

	c.clock.Step(tokenGrace) // no lease of token A is left, and it issued none for a while
	held, err = c.KeepTokens(ctx, map[string]time.Time{})

	if err != nil || len(held) != 1 || held[0].Accessor != accessorFor(tokenB) {
		t.Fatalf("KeepTokens() = %+v, %v; want only the current token", held, err)
	}
	if got := store.accessors(); !slices.Equal(got, []string{accessorFor(tokenB)}) {
		t.Errorf("store holds %q after giving token A up", got)
	}
	if _, ok := c.Token(accessorFor(tokenA)); ok {
		t.Errorf("token A still held")
	}
}

// TestRenewalAsksForTheLeasesLifeAndLearnsTheTokensEnd: a token that owns a lease is renewed for
// as long as the lease lives; a capped renewal tells when the token ends.
func TestRenewalAsksForTheLeasesLifeAndLearnsTheTokensEnd(t *testing.T) {
	c := newTestClient(t, nil)
	c.vault.handle("auth/approle/login", loginOK(tokenA, 15*time.Second, true))
	c.vault.handle("auth/token/renew-self", renewSelfCapped(45*time.Second))
	c.vault.handle(credsPath, issueOK("l", 10*time.Minute, nil))
	ctx := context.Background()
	l := mustIssue(t, c, ctx)

	c.clock.Step(11 * time.Second)
	if _, err := c.KeepTokens(ctx, map[string]time.Time{l.TokenAccessor: l.ExpiresAt}); err != nil {
		t.Fatal(err)
	}

	if body := c.vault.lastBody("auth/token/renew-self"); body["increment"] != float64(600-11) {
		t.Errorf("renew-self increment = %v, want the lease's remaining life (589)", body["increment"])
	}
	ts, ok := c.Token(l.TokenAccessor)
	if want := testEpoch.Add(56 * time.Second); !ok || !ts.EndsAt.Equal(want) || ts.Renewable {
		t.Errorf("token after a capped renewal = %+v, want it to end at %v", ts, want)
	}
	if got := c.TokenInfo().MaxTTL; got != 56*time.Second {
		t.Errorf("learned max TTL = %v, want 56s", got)
	}
}

// TestTokenTooCloseToItsEndLogsInBeforeIssuing: a token whose end is known and near does not
// create leases; a new login does.
func TestTokenTooCloseToItsEndLogsInBeforeIssuing(t *testing.T) {
	c := newTestClient(t, nil)
	c.vault.handle("auth/approle/login", sequence(loginOK(tokenA, time.Minute, true), loginOK(tokenB, time.Minute, true)))
	c.vault.handle("auth/token/renew-self", renewSelfCapped(50*time.Second)) // ends 91s after login
	c.vault.handle(credsPath, issueOK("l", time.Hour, nil))
	ctx := context.Background()
	mustIssue(t, c, ctx)
	c.clock.Step(41 * time.Second)
	if _, err := c.KeepTokens(ctx, nil); err != nil { // renewed, capped: 50s of 91s left
		t.Fatal(err)
	}
	if ts, _ := c.Token(accessorFor(tokenA)); !ts.Current {
		t.Fatalf("token A is not current any more: %+v", ts)
	}

	l := mustIssue(t, c, ctx)

	if l.TokenAccessor != accessorFor(tokenB) || c.vault.count("auth/approle/login") != 2 {
		t.Errorf("lease issued by %q after %d logins, want a new token (%q)", l.TokenAccessor, c.vault.count("auth/approle/login"), accessorFor(tokenB))
	}
}

// TestNewTokenIsStoredBeforeItIsUsed: a login is persisted before the token creates a lease, and
// a store that refuses it fails the call rather than create an unpersisted lease.
func TestNewTokenIsStoredBeforeItIsUsed(t *testing.T) {
	store := &memStore{fail: errors.New("secrets is forbidden")}
	c := newTestClient(t, func(cfg *Config) { cfg.Tokens = store })
	c.vault.handle("auth/approle/login", loginOK(tokenA, time.Minute, true))
	c.vault.handle(credsPath, issueOK("l", time.Hour, nil))
	ctx := context.Background()

	_, err := c.Issue(ctx, credsPath)

	if !IsUnavailable(err) || c.vault.count(credsPath) != 0 {
		t.Fatalf("Issue() with a failing store = %v after %d issue requests, want Unavailable and none", err, c.vault.count(credsPath))
	}
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	mustIssue(t, c, ctx)
	if got := store.accessors(); !slices.Equal(got, []string{accessorFor(tokenA)}) {
		t.Errorf("store holds %q", got)
	}
}

// TestStoredTokensAreTakenOver: a new client (a restarted operator) looks the stored tokens up,
// forgets the ones Vault no longer knows, and continues with the freshest valid one, without a
// login.
func TestStoredTokensAreTakenOver(t *testing.T) {
	const tokenC = "hvs.tokenCCCCCCCCCCCCCCCCCCCCCCCC"
	store := &memStore{tokens: map[string]string{
		accessorFor(tokenA): tokenA, accessorFor(tokenB): tokenB, accessorFor(tokenC): tokenC,
	}}
	c := newTestClient(t, func(cfg *Config) { cfg.Tokens = store })
	c.vault.handle("auth/approle/login", loginOK("hvs.unwantedlogin000000000000000", time.Minute, true))
	c.vault.handle("auth/token/lookup-self", func(w http.ResponseWriter, r *http.Request) {
		tok := r.Header.Get("X-Vault-Token")
		issued := map[string]string{tokenA: "2026-01-02T03:00:00Z", tokenB: "2026-01-02T03:04:00Z"}[tok]
		if issued == "" {
			status(403, "permission denied", "invalid token")(w, r)
			return
		}
		writeJSON(w, 200, map[string]any{"data": map[string]any{
			"accessor": accessorFor(tok), "ttl": 50, "creation_ttl": 60, "renewable": true, "issue_time": issued,
		}})
	})
	issues := &tokenRecorder{}
	c.vault.handle(credsPath, issues.wrap(issueOK("l", time.Hour, nil)))

	l := mustIssue(t, c, context.Background())

	if c.vault.count("auth/approle/login") != 0 || l.TokenAccessor != accessorFor(tokenB) || !slices.Equal(issues.seen(), []string{tokenB}) {
		t.Errorf("after taking over: %d logins, lease by %q (tokens %q); want the freshest stored token, no login",
			c.vault.count("auth/approle/login"), l.TokenAccessor, issues.seen())
	}
	if got := store.accessors(); !slices.Equal(got, []string{accessorFor(tokenA), accessorFor(tokenB)}) {
		t.Errorf("store holds %q, want the token Vault no longer knows removed", got)
	}
	if held := c.Tokens(); len(held) != 2 {
		t.Errorf("held = %+v, want the two valid stored tokens", held)
	}
}
