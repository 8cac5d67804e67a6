package vault

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"
)

const (
	tokenA = "hvs.tokenAAAAAAAAAAAAAAAAAAAAAAAA"
	tokenB = "hvs.tokenBBBBBBBBBBBBBBBBBBBBBBBB"
)

// issueRecordingToken answers credentials reads and records the token each one carried.
func issueRecordingToken(mu *sync.Mutex, tokens *[]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*tokens = append(*tokens, r.Header.Get("X-Vault-Token"))
		mu.Unlock()
		issueOK(credsPath+"/x", time.Hour, map[string]any{"username": "u", "password": "p4ssword"})(w, r)
	}
}

func TestTokenIsRenewedOrReplacedWhenDue(t *testing.T) {
	const ttl = 60 * time.Second
	cases := map[string]struct {
		renewable     bool
		renewSelf     http.HandlerFunc
		step          time.Duration
		wantLogins    int
		wantRenewSelf int
		wantTTL       time.Duration
	}{
		"before the renewal point nothing happens": {renewable: true, renewSelf: renewSelfOK(ttl, true), step: 39 * time.Second, wantLogins: 1, wantTTL: ttl},
		"renewed at two thirds of its ttl":         {renewable: true, renewSelf: renewSelfOK(ttl, true), step: 41 * time.Second, wantLogins: 1, wantRenewSelf: 1, wantTTL: ttl},
		"not renewable: login again":               {renewable: false, step: 41 * time.Second, wantLogins: 2, wantTTL: ttl},
		"renewal capped short: login again":        {renewable: true, renewSelf: renewSelfCapped(20 * time.Second), step: 41 * time.Second, wantLogins: 2, wantRenewSelf: 1, wantTTL: ttl},
		"renewal capped but long enough: keep it":  {renewable: true, renewSelf: renewSelfCapped(50 * time.Second), step: 41 * time.Second, wantLogins: 1, wantRenewSelf: 1, wantTTL: 50 * time.Second},
		"renewal fails: login again":               {renewable: true, renewSelf: status(500), step: 41 * time.Second, wantLogins: 2, wantRenewSelf: 1, wantTTL: ttl},
		"renewal refused: login again":             {renewable: true, renewSelf: status(403, "permission denied"), step: 41 * time.Second, wantLogins: 2, wantRenewSelf: 1, wantTTL: ttl},
		"past expiry: login again":                 {renewable: false, step: 2 * ttl, wantLogins: 2, wantTTL: ttl},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)
			c.vault.handle("auth/approle/login", sequence(loginOK(tokenA, ttl, tc.renewable), loginOK(tokenB, ttl, tc.renewable)))
			c.vault.handle("auth/token/renew-self", tc.renewSelf)
			var mu sync.Mutex
			var tokens []string
			c.vault.handle(credsPath, issueRecordingToken(&mu, &tokens))
			if _, err := c.Issue(context.Background(), credsPath); err != nil {
				t.Fatal(err)
			}
			c.clock.Step(tc.step)

			if _, err := c.Issue(context.Background(), credsPath); err != nil {
				t.Fatal(err)
			}

			if got := c.vault.count("auth/approle/login"); got != tc.wantLogins {
				t.Errorf("logins = %d, want %d", got, tc.wantLogins)
			}
			if got := c.vault.count("auth/token/renew-self"); got != tc.wantRenewSelf {
				t.Errorf("renew-self requests = %d, want %d", got, tc.wantRenewSelf)
			}
			wantToken := map[int]string{1: tokenA, 2: tokenB}[tc.wantLogins]
			if want := []string{tokenA, wantToken}; !slices.Equal(tokens, want) {
				t.Errorf("issue requests carried tokens %q, want %q", tokens, want)
			}
			info := c.TokenInfo()
			if info.Logins != tc.wantLogins || info.TTL != tc.wantTTL || !info.Valid {
				t.Errorf("TokenInfo() = %+v, want %d logins, ttl %v, valid", info, tc.wantLogins, tc.wantTTL)
			}
			if tc.wantRenewSelf > 0 && c.vault.lastBody("auth/token/renew-self")["increment"] != float64(60) {
				t.Errorf("renew-self body = %v, want the login's ttl as increment", c.vault.lastBody("auth/token/renew-self"))
			}
		})
	}
}

// TestCappedTokenIsReplacedNotRenewed: once a renewal was capped, the token cannot be extended,
// so at its next renewal point the client logs in instead of renewing again.
func TestCappedTokenIsReplacedNotRenewed(t *testing.T) {
	c := newTestClient(t, nil)
	c.vault.handle("auth/approle/login", sequence(loginOK(tokenA, time.Minute, true), loginOK(tokenB, time.Minute, true)))
	c.vault.handle("auth/token/renew-self", renewSelfCapped(50*time.Second))
	c.vault.handle(credsPath, issueOK("l", time.Hour, nil))
	ctx := context.Background()

	mustIssue(t, c, ctx)
	c.clock.Step(41 * time.Second)
	mustIssue(t, c, ctx) // renewed, capped at 50s
	info := c.TokenInfo()
	if info.Renewable || !info.MaxExpiresAt.Equal(testEpoch.Add(91*time.Second)) || !info.RenewAt.Equal(testEpoch.Add(41*time.Second+33333333333)) {
		t.Fatalf("after a capped renewal TokenInfo() = %+v", info)
	}
	c.clock.Step(34 * time.Second)
	mustIssue(t, c, ctx)

	if got := [2]int{c.vault.count("auth/approle/login"), c.vault.count("auth/token/renew-self")}; got != [2]int{2, 1} {
		t.Errorf("logins, renewals = %v, want [2 1]", got)
	}
}

func mustIssue(t *testing.T, c *testClient, ctx context.Context) *Lease {
	t.Helper()
	l, err := c.Issue(ctx, credsPath)
	if err != nil {
		t.Fatalf("Issue() error = %v", err)
	}
	return l
}

// TestLeasesThatOutliveTheToken: Vault revokes a token's leases with it. Once the client knows
// when its token ends for good, it marks leases that would live longer.
func TestLeasesThatOutliveTheToken(t *testing.T) {
	cases := map[string]struct {
		renewable    bool
		learnMax     bool
		leaseTTL     time.Duration
		wantDeadline time.Duration // from the last login; 0: unknown
		wantOutlives bool
	}{
		"renewable token, max unknown":      {renewable: true, leaseTTL: time.Hour},
		"non-renewable token, short lease":  {leaseTTL: 30 * time.Second, wantDeadline: time.Minute},
		"non-renewable token, long lease":   {leaseTTL: time.Hour, wantDeadline: time.Minute, wantOutlives: true},
		"max learned from a capped renewal": {renewable: true, learnMax: true, leaseTTL: time.Hour, wantDeadline: 61 * time.Second, wantOutlives: true},
		"max learned, lease within it":      {renewable: true, learnMax: true, leaseTTL: 45 * time.Second, wantDeadline: 61 * time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)
			c.vault.handle("auth/approle/login", loginOK(tokenA, time.Minute, tc.renewable))
			c.vault.handle("auth/token/renew-self", renewSelfCapped(20*time.Second)) // capped at 61s
			c.vault.handle(credsPath, issueOK("l", tc.leaseTTL, nil))
			ctx := context.Background()
			if tc.learnMax {
				mustIssue(t, c, ctx)
				c.clock.Step(41 * time.Second) // renewal capped at 20s: max TTL 61s; login again
			}
			loginAt := c.clock.Now()

			l := mustIssue(t, c, ctx)

			wantDeadline := time.Time{}
			if tc.wantDeadline > 0 {
				wantDeadline = loginAt.Add(tc.wantDeadline)
			}
			if !l.TokenDeadline.Equal(wantDeadline) || l.OutlivesToken != tc.wantOutlives {
				t.Errorf("lease token deadline %v, outlives %v; want %v, %v", l.TokenDeadline, l.OutlivesToken, wantDeadline, tc.wantOutlives)
			}
		})
	}
}

// TestRefreshFailureKeepsValidToken: when logging in again fails while the token is still valid,
// calls go ahead with it; once it has expired, they fail with the login's error.
func TestRefreshFailureKeepsValidToken(t *testing.T) {
	c := newTestClient(t, nil)
	c.vault.handle("auth/approle/login", sequence(loginOK(tokenA, time.Minute, false), status(500, "storage down")))
	c.vault.handle(credsPath, issueOK("l", time.Hour, nil))
	ctx := context.Background()
	mustIssue(t, c, ctx)

	c.clock.Step(41 * time.Second)
	mustIssue(t, c, ctx) // login fails, token still valid for 19s
	mustIssue(t, c, ctx) // not retried at once
	if got := c.vault.count("auth/approle/login"); got != 2 {
		t.Errorf("logins = %d, want 2 (one failed retry within the retry interval)", got)
	}
	c.clock.Step(20 * time.Second)
	_, err := c.Issue(ctx, credsPath)

	if !IsUnavailable(err) || !IsLoginFailed(err) {
		t.Fatalf("Issue() with an expired token and a failing login = %v, want an Unavailable login error", err)
	}
	if c.TokenInfo().Valid {
		t.Errorf("TokenInfo().Valid after expiry")
	}
}

func TestStaticToken(t *testing.T) {
	cases := map[string]struct {
		lookup        http.HandlerFunc
		step          time.Duration
		wantRenewSelf int
		wantClass     string
		wantExpires   time.Duration // 0: never
	}{
		"root token never expires": {lookup: lookupSelfOK(0, 0, false), step: 1000 * time.Hour},
		"renewable token is renewed": {lookup: lookupSelfOK(60*time.Second, 60*time.Second, true), step: 41 * time.Second,
			wantRenewSelf: 1, wantExpires: 41*time.Second + time.Minute},
		"non-renewable token is kept": {lookup: lookupSelfOK(60*time.Second, 60*time.Second, false), step: 41 * time.Second,
			wantExpires: time.Minute},
		"lookup-self forbidden: assumed not to expire": {lookup: status(403, "permission denied"), step: 1000 * time.Hour},
		"invalid token": {lookup: status(403, "permission denied", "invalid token"), wantClass: ClassPermissionDenied},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, func(cfg *Config) { cfg.Auth = Auth{Token: &TokenAuth{Token: testToken}} })
			c.vault.handle("auth/token/lookup-self", tc.lookup)
			c.vault.handle("auth/token/renew-self", renewSelfOK(time.Minute, true))
			c.vault.handle(credsPath, issueOK("l", time.Hour, nil))
			ctx := context.Background()

			_, err := c.Issue(ctx, credsPath)
			if ClassOf(err) != tc.wantClass {
				t.Fatalf("Issue() error = %v, want class %q", err, tc.wantClass)
			}
			if err != nil {
				return
			}
			c.clock.Step(tc.step)
			mustIssue(t, c, ctx)

			if got := c.vault.count("auth/token/renew-self"); got != tc.wantRenewSelf {
				t.Errorf("renew-self requests = %d, want %d", got, tc.wantRenewSelf)
			}
			if got := c.vault.count("auth/token/lookup-self"); got != 1 {
				t.Errorf("lookup-self requests = %d, want 1", got)
			}
			var wantExp time.Time
			if tc.wantExpires > 0 {
				wantExp = testEpoch.Add(tc.wantExpires)
			}
			if info := c.TokenInfo(); !info.ExpiresAt.Equal(wantExp) || info.Method != "token" {
				t.Errorf("TokenInfo() = %+v, want expiry %v", info, wantExp)
			}
		})
	}
}

func lookupSelfOK(ttl, creationTTL time.Duration, renewable bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, map[string]any{"data": map[string]any{
			"ttl": int(ttl / time.Second), "creation_ttl": int(creationTTL / time.Second), "renewable": renewable,
			"explicit_max_ttl": 0, "policies": []string{"default"},
		}})
	}
}

// TestInvalidTokenLogsInAgainOnce: a token Vault no longer knows (revoked outside, server
// restarted) is replaced by a new login, and the call is tried once more.
func TestInvalidTokenLogsInAgainOnce(t *testing.T) {
	cases := map[string]struct {
		issue      http.HandlerFunc
		wantClass  string
		wantIssues int
		wantLogins int
	}{
		"second attempt succeeds":          {issue: sequence(status(403, "permission denied", "invalid token"), issueOK("l", time.Hour, nil)), wantIssues: 2, wantLogins: 2},
		"invalid again: permission denied": {issue: status(403, "permission denied", "invalid token"), wantClass: ClassPermissionDenied, wantIssues: 2, wantLogins: 2},
		"policy refusal: no new login":     {issue: status(403, "permission denied"), wantClass: ClassPermissionDenied, wantIssues: 1, wantLogins: 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)
			c.vault.handle("auth/approle/login", sequence(loginOK(tokenA, time.Hour, true), loginOK(tokenB, time.Hour, true)))
			c.vault.handle(credsPath, tc.issue)

			_, err := c.Issue(context.Background(), credsPath)

			if ClassOf(err) != tc.wantClass {
				t.Fatalf("Issue() error = %v, want class %q", err, tc.wantClass)
			}
			if got := [2]int{c.vault.count(credsPath), c.vault.count("auth/approle/login")}; got != [2]int{tc.wantIssues, tc.wantLogins} {
				t.Errorf("issues, logins = %v, want [%d %d]", got, tc.wantIssues, tc.wantLogins)
			}
		})
	}
}

func TestConcurrentCallsShareOneLogin(t *testing.T) {
	c := newTestClient(t, func(cfg *Config) { cfg.RateLimit = RateLimit{QPS: 1000, Burst: 100} })
	c.vault.handle("auth/approle/login", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond) // let the other calls pile up
		loginOK(tokenA, time.Hour, true)(w, r)
	})
	c.vault.handle(credsPath, issueOK("l", time.Hour, nil))
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			_, err := c.Issue(context.Background(), credsPath)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := c.vault.count("auth/approle/login"); got != 1 {
		t.Errorf("logins = %d, want 1", got)
	}
}

func TestKubernetesLogin(t *testing.T) {
	const jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl"
	cases := map[string]struct {
		mount     string
		source    func(context.Context) (string, error)
		wantPath  string
		wantClass string
	}{
		"default mount": {source: func(context.Context) (string, error) { return jwt, nil }, wantPath: "auth/kubernetes/login"},
		"own mount":     {mount: "/k8s-east/", source: func(context.Context) (string, error) { return jwt, nil }, wantPath: "auth/k8s-east/login"},
		"token request fails": {source: func(context.Context) (string, error) { return "", errors.New("serviceaccounts/token is forbidden") },
			wantClass: ClassUnavailable},
		"empty token": {source: func(context.Context) (string, error) { return "", nil }, wantClass: ClassInvalidConfig},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, func(cfg *Config) {
				cfg.Auth = Auth{Kubernetes: &KubernetesAuth{Mount: tc.mount, Role: "keyroll", JWT: tc.source}}
			})
			c.vault.handle("auth/kubernetes/login", loginOK(tokenA, time.Hour, true))
			c.vault.handle("auth/k8s-east/login", loginOK(tokenA, time.Hour, true))

			err := c.Login(context.Background())

			if ClassOf(err) != tc.wantClass {
				t.Fatalf("Login() error = %v, want class %q", err, tc.wantClass)
			}
			if err != nil {
				if !IsLoginFailed(err) {
					t.Errorf("IsLoginFailed(%v) = false", err)
				}
				return
			}
			if body := c.vault.lastBody(tc.wantPath); body["role"] != "keyroll" || body["jwt"] != jwt {
				t.Errorf("login body at %s = %v", tc.wantPath, body)
			}
			if info := c.TokenInfo(); info.Method != "kubernetes" || info.Logins != 1 || !info.Valid {
				t.Errorf("TokenInfo() = %+v", info)
			}
		})
	}
}

func TestLoginAndTokenInfo(t *testing.T) {
	c := newTestClient(t, nil)
	c.vault.handle("auth/approle/login", loginOK(tokenA, time.Minute, true))
	ctx := context.Background()
	if err := c.Login(ctx); err != nil {
		t.Fatal(err)
	}
	if body := c.vault.lastBody("auth/approle/login"); body["role_id"] != testRoleID || body["secret_id"] != testSecretID {
		t.Errorf("login body = %v", body)
	}
	want := TokenInfo{Method: "approle", Accessor: accessorFor(tokenA), Valid: true, IssuedAt: testEpoch, ExpiresAt: testEpoch.Add(time.Minute),
		RenewAt: testEpoch.Add(40 * time.Second), TTL: time.Minute, Renewable: true, Logins: 1}
	got := c.TokenInfo()
	if !slices.Equal(got.Policies, []string{"default", "keyroll"}) {
		t.Errorf("policies = %q", got.Policies)
	}
	got.Policies = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("TokenInfo() = %+v, want %+v", got, want)
	}
	if err := c.Login(ctx); err != nil || c.TokenInfo().Logins != 2 {
		t.Errorf("a second Login() = %v, logins %d; want a new login", err, c.TokenInfo().Logins)
	}
	c.clock.Step(time.Minute)
	if c.TokenInfo().Valid {
		t.Errorf("token valid after its ttl")
	}
}
