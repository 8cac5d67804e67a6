package vault

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

const credsPath = "database/creds/orders"

func TestNewValidatesConfig(t *testing.T) {
	jwt := func(context.Context) (string, error) { return "jwt", nil }
	cases := map[string]struct {
		cfg     Config
		wantErr bool
	}{
		"approle":           {cfg: Config{Address: "https://vault:8200", Auth: Auth{AppRole: &AppRoleAuth{RoleID: "r", SecretID: "s"}}}},
		"kubernetes":        {cfg: Config{Address: "http://127.0.0.1:8200", Auth: Auth{Kubernetes: &KubernetesAuth{Role: "r", JWT: jwt}}}},
		"token":             {cfg: Config{Address: "http://vault", Auth: Auth{Token: &TokenAuth{Token: "t"}}}},
		"no auth":           {cfg: Config{Address: "http://vault"}, wantErr: true},
		"two auth methods":  {cfg: Config{Address: "http://vault", Auth: Auth{Token: &TokenAuth{Token: "t"}, AppRole: &AppRoleAuth{RoleID: "r", SecretID: "s"}}}, wantErr: true},
		"no secret id":      {cfg: Config{Address: "http://vault", Auth: Auth{AppRole: &AppRoleAuth{RoleID: "r"}}}, wantErr: true},
		"no token source":   {cfg: Config{Address: "http://vault", Auth: Auth{Kubernetes: &KubernetesAuth{Role: "r"}}}, wantErr: true},
		"empty token":       {cfg: Config{Address: "http://vault", Auth: Auth{Token: &TokenAuth{}}}, wantErr: true},
		"no scheme":         {cfg: Config{Address: "vault:8200", Auth: Auth{Token: &TokenAuth{Token: "t"}}}, wantErr: true},
		"user in address":   {cfg: Config{Address: "https://u:p@vault", Auth: Auth{Token: &TokenAuth{Token: "t"}}}, wantErr: true},
		"ca bundle not pem": {cfg: Config{Address: "https://vault", CABundle: []byte("nope"), Auth: Auth{Token: &TokenAuth{Token: "t"}}}, wantErr: true},
		"burst without qps": {cfg: Config{Address: "https://vault", RateLimit: RateLimit{Burst: 3}, Auth: Auth{Token: &TokenAuth{Token: "t"}}}, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if tc.wantErr {
				if !IsInvalidConfig(err) {
					t.Fatalf("New() error = %v, want an InvalidConfig error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New() error = %v", err)
			}
		})
	}
}

func TestNewAppliesDefaults(t *testing.T) {
	c, err := New(Config{Address: "https://vault/", Auth: Auth{AppRole: &AppRoleAuth{RoleID: "r", SecretID: "s"}}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.cfg
	if cfg.Address != "https://vault" || cfg.Auth.AppRole.Mount != "approle" || cfg.Timeout != 10*time.Second ||
		cfg.RateLimit != (RateLimit{DefaultQPS, DefaultBurst}) || cfg.Clock != (clock.RealClock{}) {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if l := c.loginAPI.Limiter(); l != c.limiter || l.Limit() != DefaultQPS || l.Burst() != DefaultBurst {
		t.Errorf("the API client's rate limiter is not the client's, at the default rate")
	}
}

// TestCallsFailFast: a failed request is not retried, whatever the failure; it comes back at once,
// classified, counted by the Observer as one request. Once Vault answers again, the next call
// succeeds with the same token.
func TestCallsFailFast(t *testing.T) {
	cases := map[string]struct {
		handler   http.HandlerFunc
		wantClass string
		is        func(error) bool
	}{
		"500":     {handler: status(500, "internal error"), wantClass: ClassUnavailable, is: IsUnavailable},
		"502":     {handler: status(502), wantClass: ClassUnavailable, is: IsUnavailable},
		"429":     {handler: status(429, "rate limit quota exceeded"), wantClass: ClassUnavailable, is: IsUnavailable},
		"sealed":  {handler: status(503, "Vault is sealed"), wantClass: ClassSealed, is: IsSealed},
		"standby": {handler: status(503, "node not active but active cluster node not found"), wantClass: ClassUnavailable, is: IsUnavailable},
		"412":     {handler: status(412, "required index state not present"), wantClass: ClassUnavailable, is: IsUnavailable},
		"403":     {handler: status(403, "permission denied"), wantClass: ClassPermissionDenied, is: IsPermissionDenied},
		"400":     {handler: status(400, "unsupported path"), wantClass: ClassBadRequest, is: IsBadRequest},
		"404":     {handler: status(404), wantClass: ClassNotFound, is: IsNotFound},
		"405":     {handler: status(405), wantClass: ClassBadRequest, is: IsBadRequest},
		"html 502": {handler: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(502)
			_, _ = w.Write([]byte("<html>bad gateway</html>"))
		}, wantClass: ClassUnavailable, is: IsUnavailable},
		"garbage 200": {handler: func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("{not json"))
		}, wantClass: ClassUnknown, is: func(err error) bool { return !IsUnavailable(err) }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)
			c.vault.handle("auth/approle/login", loginOK(testToken, time.Hour, true))
			c.vault.handle(credsPath, tc.handler)

			_, err := c.Issue(context.Background(), credsPath)

			if got := ClassOf(err); got != tc.wantClass || !tc.is(err) {
				t.Fatalf("ClassOf(%v) = %q, want %q", err, got, tc.wantClass)
			}
			if got := [2]int{c.obs.count(opIssue), c.vault.count(credsPath)}; got != [2]int{1, 1} {
				t.Errorf("observed and served issue requests = %v, want one of each", got)
			}
			var e *Error
			if !errors.As(err, &e) || e.Attempts != 1 || e.Op != opIssue || e.Path != credsPath {
				t.Errorf("error = %#v, want an *Error of op issue, path %s, 1 attempt", err, credsPath)
			}

			c.vault.handle(credsPath, issueOK("l1", time.Minute, nil)) // Vault answers again

			if _, err := c.Issue(context.Background(), credsPath); err != nil {
				t.Fatalf("the next Issue() = %v", err)
			}
			if got := [2]int{c.vault.count(credsPath), c.vault.count("auth/approle/login")}; got != [2]int{2, 1} {
				t.Errorf("issue requests, logins = %v, want [2 1]", got)
			}
		})
	}
}

func TestUnreachableVaultIsUnavailable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close() // nothing listens there any more
	c := newTestClient(t, func(cfg *Config) { cfg.Address = addr })

	_, err := c.Health(context.Background())

	if !IsUnavailable(err) || ClassOf(err) != ClassUnavailable {
		t.Fatalf("Health() error = %v, want Unavailable", err)
	}
	if got := c.obs.count(opHealth); got != 1 {
		t.Errorf("observed %d requests, want 1", got)
	}
}

// hang answers no request: it holds each until the client gives up.
func hang(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }

// TestUnansweredCallsEndByTheTimeout: when Vault takes a request and never answers, every call ends
// by Config.Timeout, although the caller's context would wait an hour, after one request, as
// Unavailable with the deadline as its cause. A token renewal that is never answered holds
// KeepTokens up no longer, and the token, still valid, goes on being used.
func TestUnansweredCallsEndByTheTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	cases := map[string]struct {
		hang    string // the path that never answers
		op      string
		call    func(ctx context.Context, c *testClient) error
		wantErr bool
	}{
		"issue": {hang: credsPath, op: opIssue, wantErr: true, call: func(ctx context.Context, c *testClient) error {
			_, err := c.Issue(ctx, credsPath)
			return err
		}},
		"issue, its login unanswered": {hang: "auth/approle/login", op: opLogin, wantErr: true, call: func(ctx context.Context, c *testClient) error {
			_, err := c.Issue(ctx, credsPath)
			return err
		}},
		"renew": {hang: "sys/leases/renew", op: opRenew, wantErr: true, call: func(ctx context.Context, c *testClient) error {
			_, err := c.Renew(ctx, "l", time.Minute)
			return err
		}},
		"revoke": {hang: "sys/leases/revoke", op: opRevoke, wantErr: true, call: func(ctx context.Context, c *testClient) error {
			return c.Revoke(ctx, "l")
		}},
		"lookup": {hang: "sys/leases/lookup", op: opLookup, wantErr: true, call: func(ctx context.Context, c *testClient) error {
			_, err := c.Lookup(ctx, "l")
			return err
		}},
		"health": {hang: "sys/health", op: opHealth, wantErr: true, call: func(ctx context.Context, c *testClient) error {
			_, err := c.Health(ctx)
			return err
		}},
		"login": {hang: "auth/approle/login", op: opLogin, wantErr: true, call: func(ctx context.Context, c *testClient) error {
			return c.Login(ctx)
		}},
		"keep tokens, renewal unanswered": {hang: "auth/token/renew-self", op: opRenewSelf, call: func(ctx context.Context, c *testClient) error {
			if err := c.Login(ctx); err != nil {
				return err
			}
			c.clock.Step(41 * time.Minute) // due for renewal, valid for 19 more minutes
			_, err := c.KeepTokens(ctx, nil)
			return err
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, func(cfg *Config) { cfg.Timeout = timeout })
			c.vault.handle("auth/approle/login", loginOK(testToken, time.Hour, true))
			c.vault.handle(credsPath, issueOK("l", time.Hour, nil))
			c.vault.handle(tc.hang, hang)
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			start := time.Now()

			err := tc.call(ctx, c)

			elapsed := time.Since(start)
			if tc.wantErr && (!IsUnavailable(err) || !errors.Is(err, context.DeadlineExceeded)) || !tc.wantErr && err != nil {
				t.Fatalf("error = %v, want an Unavailable deadline error: %v", err, tc.wantErr)
			}
			if elapsed < timeout || elapsed > timeout+time.Second {
				t.Errorf("the call took %v, want about the timeout of %v", elapsed, timeout)
			}
			if got := [2]int{c.obs.count(tc.op), c.vault.count(tc.hang)}; got != [2]int{1, 1} {
				t.Errorf("observed and served %s requests = %v, want one of each", tc.op, got)
			}
		})
	}
}

// blackhole accepts TCP connections and never reads from or answers them, as a Vault that hangs
// (or a firewall that swallows packets after the handshake) does. It returns its URL.
func blackhole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// TestBlackholedVaultHoldsOneCallAtATime: a server that accepts connections and never answers
// ends the first call by the timeout; the calls that follow fail at once, without a request,
// until RetryUnanswered has passed, when one request tries again (and is held for the timeout)
// while the others still fail at once. An answer ends the wait.
func TestBlackholedVaultHoldsOneCallAtATime(t *testing.T) {
	addr := blackhole(t)
	c := newTestClient(t, func(cfg *Config) { cfg.Address, cfg.Timeout = addr, 200*time.Millisecond })
	health := func() (time.Duration, error) {
		start := time.Now()
		_, err := c.Health(context.Background())
		return time.Since(start), err
	}
	if took, err := health(); !IsUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) || took > 2*time.Second {
		t.Fatalf("the first call = %v after %v, want an Unavailable deadline error after about 200ms", err, took)
	}
	for _, call := range []func() error{
		func() error { _, err := c.Health(context.Background()); return err },
		func() error { return c.Login(context.Background()) },
		func() error { _, err := c.Issue(context.Background(), credsPath); return err },
	} {
		start := time.Now()
		if err := call(); !IsUnavailable(err) || time.Since(start) > 100*time.Millisecond {
			t.Errorf("a call right after = %v after %v, want Unavailable at once", err, time.Since(start))
		}
	}
	if got := [2]int{c.obs.count(opHealth), c.obs.count(opLogin)}; got != [2]int{1, 0} {
		t.Errorf("health and login requests = %v, want [1 0]", got)
	}

	c.clock.Step(RetryUnanswered)
	held := make(chan error)
	go func() { _, err := health(); held <- err }()
	time.Sleep(50 * time.Millisecond) // the probe is out
	if took, err := health(); !IsUnavailable(err) || took > 100*time.Millisecond {
		t.Errorf("a call while one tries again = %v after %v, want Unavailable at once", err, took)
	}
	if err := <-held; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the call that tried again = %v, want a deadline error", err)
	}
	if got := c.obs.count(opHealth); got != 2 {
		t.Errorf("health requests = %d, want 2", got)
	}
}

// TestAnAnswerEndsTheWaitAfterAnUnansweredRequest: once Vault answers the request that tries
// again, calls go through again at once.
func TestAnAnswerEndsTheWaitAfterAnUnansweredRequest(t *testing.T) {
	c := newTestClient(t, func(cfg *Config) { cfg.Timeout = 200 * time.Millisecond })
	c.vault.handle("sys/health", hang)
	if _, err := c.Health(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Health() = %v, want a deadline error", err)
	}
	c.vault.handle("sys/health", healthy)
	if _, err := c.Health(context.Background()); !IsUnavailable(err) {
		t.Fatalf("Health() right after = %v, want Unavailable at once", err)
	}
	c.clock.Step(RetryUnanswered)
	for i := range 3 {
		if _, err := c.Health(context.Background()); err != nil {
			t.Fatalf("Health() %d after Vault answered again = %v", i, err)
		}
	}
	if got := c.obs.count(opHealth); got != 4 {
		t.Errorf("health requests = %d, want 4 (one unanswered, three answered)", got)
	}
}

func TestDefaultTimeoutAppliesWithoutDeadline(t *testing.T) {
	c := newTestClient(t, func(cfg *Config) {
		cfg.Clock = clock.RealClock{}
		cfg.Timeout = 200 * time.Millisecond
	})
	c.vault.handle("sys/health", hang)
	start := time.Now()

	_, err := c.Health(context.Background())

	if !IsUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("Health() = %v after %v, want a deadline error after about 200ms", err, time.Since(start))
	}
}

func TestCanceledContext(t *testing.T) {
	c := newTestClient(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	_, err := c.Issue(ctx, credsPath)

	if ClassOf(err) != ClassCanceled || !errors.Is(err, context.Canceled) {
		t.Fatalf("Issue() error = %v, want Canceled", err)
	}
	if n := c.vault.count(credsPath) + c.vault.count("auth/approle/login"); n != 0 {
		t.Errorf("server saw %d requests after cancellation", n)
	}
}

func TestTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, map[string]any{"initialized": true, "version": "1.21.0"})
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are expected
	srv.StartTLS()
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cases := map[string]struct {
		ca         []byte
		serverName string
		wantClass  string
	}{
		"trusted ca":             {ca: ca},
		"trusted ca, good name":  {ca: ca, serverName: "example.com"},
		"system pool rejects it": {wantClass: ClassInvalidConfig},
		"trusted ca, wrong name": {ca: ca, serverName: "vault.example.org", wantClass: ClassInvalidConfig},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, func(cfg *Config) {
				cfg.Address, cfg.CABundle, cfg.TLSServerName = srv.URL, tc.ca, tc.serverName
			})
			h, err := c.Health(context.Background())
			if got := ClassOf(err); got != tc.wantClass {
				t.Fatalf("Health() error = %v, want class %q", err, tc.wantClass)
			}
			if err == nil && h.Version != "1.21.0" {
				t.Errorf("version = %q", h.Version)
			}
			if n := c.obs.count(opHealth); n != 1 {
				t.Errorf("observed %d requests, want 1", n)
			}
		})
	}
}

func TestNamespaceHeader(t *testing.T) {
	c := newTestClient(t, func(cfg *Config) { cfg.Namespace = "team-a/" })
	var got []string
	c.vault.handle("auth/approle/login", func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("X-Vault-Namespace"))
		loginOK(testToken, time.Hour, true)(w, r)
	})
	c.vault.handle(credsPath, func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("X-Vault-Namespace"))
		issueOK("l", time.Hour, nil)(w, r)
	})
	if _, err := c.Issue(context.Background(), credsPath); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "team-a,team-a" {
		t.Errorf("X-Vault-Namespace = %q, want team-a on login and issue", got)
	}
}

func TestIssue(t *testing.T) {
	c := newTestClient(t, nil)
	c.vault.handle("auth/approle/login", loginOK(testToken, time.Hour, true))
	var gotToken string
	c.vault.handle(credsPath, func(w http.ResponseWriter, r *http.Request) {
		gotToken = r.Header.Get("X-Vault-Token")
		writeJSON(w, 200, map[string]any{
			"lease_id": credsPath + "/abc", "lease_duration": 1800, "renewable": true,
			"data":     map[string]any{"username": "V_TOKEN_ORDERS_X", "password": "pw-123456", "n": 7},
			"warnings": []string{"w1"},
		})
	})

	l, err := c.Issue(context.Background(), "/"+credsPath+"/")

	if err != nil {
		t.Fatal(err)
	}
	if gotToken != testToken {
		t.Errorf("issue sent token %q, want the login's", gotToken)
	}
	want := Lease{ID: credsPath + "/abc", Duration: 30 * time.Minute, Renewable: true, IssuedAt: testEpoch,
		ExpiresAt: testEpoch.Add(30 * time.Minute), TokenDeadline: time.Time{}}
	if l.ID != want.ID || l.Duration != want.Duration || !l.Renewable || !l.IssuedAt.Equal(want.IssuedAt) ||
		!l.ExpiresAt.Equal(want.ExpiresAt) || l.OutlivesToken || !l.TokenDeadline.IsZero() {
		t.Errorf("lease = %+v, want %+v", l, want)
	}
	if l.Data["username"] != "V_TOKEN_ORDERS_X" || l.Data["password"] != "pw-123456" || l.Data["n"] != "7" {
		t.Errorf("data = %v", map[string]string(l.Data))
	}
	if len(l.Warnings) != 1 || l.Warnings[0] != "w1" {
		t.Errorf("warnings = %q", l.Warnings)
	}
}

func TestIssueWithoutLease(t *testing.T) {
	cases := map[string]struct {
		handler   http.HandlerFunc
		wantClass string
	}{
		"empty answer": {handler: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }, wantClass: ClassNotFound},
		"not a lease": {handler: func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, 200, map[string]any{"data": map[string]any{"a": "b"}})
		}, wantClass: ClassBadRequest},
		"empty path": {wantClass: ClassBadRequest},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)
			c.vault.handle("auth/approle/login", loginOK(testToken, time.Hour, true))
			p := ""
			if tc.handler != nil {
				p = credsPath
				c.vault.handle(credsPath, tc.handler)
			}
			if _, err := c.Issue(context.Background(), p); ClassOf(err) != tc.wantClass {
				t.Fatalf("Issue() error = %v, want class %s", err, tc.wantClass)
			}
		})
	}
}

func TestRenew(t *testing.T) {
	const capWarning = `TTL of "1h0m0s" exceeded the effective max_ttl of "25s"; TTL value is capped accordingly`
	cases := map[string]struct {
		increment  time.Duration
		handler    http.HandlerFunc
		wantAsked  float64
		wantGrant  time.Duration
		wantCapped bool
		wantClass  string
	}{
		"granted as asked":          {increment: time.Hour, handler: renewOK(time.Hour), wantAsked: 3600, wantGrant: time.Hour},
		"capped by the max ttl":     {increment: time.Hour, handler: renewOK(25*time.Second, capWarning), wantAsked: 3600, wantGrant: 25 * time.Second, wantCapped: true},
		"capped, no warning":        {increment: time.Hour, handler: renewOK(59 * time.Minute), wantAsked: 3600, wantGrant: 59 * time.Minute, wantCapped: true},
		"default increment":         {handler: renewOK(time.Hour), wantAsked: 0, wantGrant: time.Hour},
		"default increment, capped": {handler: renewOK(25*time.Second, capWarning), wantAsked: 0, wantGrant: 25 * time.Second, wantCapped: true},
		"sub-second increment":      {increment: 1500 * time.Millisecond, handler: renewOK(2 * time.Second), wantAsked: 2, wantGrant: 2 * time.Second},
		"lease gone":                {increment: time.Hour, handler: status(400, "lease not found"), wantAsked: 3600, wantClass: ClassLeaseGone},
		"lease expired":             {increment: time.Hour, handler: status(400, "lease expired"), wantAsked: 3600, wantClass: ClassLeaseGone},
		"lease not renewable":       {increment: time.Hour, handler: status(400, "lease is not renewable"), wantAsked: 3600, wantClass: ClassBadRequest},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)
			c.vault.handle("auth/approle/login", loginOK(testToken, time.Hour, true))
			c.vault.handle("sys/leases/renew", tc.handler)

			r, err := c.Renew(context.Background(), "database/creds/orders/abc", tc.increment)

			body := c.vault.lastBody("sys/leases/renew")
			if body["lease_id"] != "database/creds/orders/abc" || body["increment"] != tc.wantAsked {
				t.Errorf("renew body = %v, want the lease id and increment %v", body, tc.wantAsked)
			}
			if ClassOf(err) != tc.wantClass {
				t.Fatalf("Renew() error = %v, want class %q", err, tc.wantClass)
			}
			if err != nil {
				if c.obs.count(opRenew) != 1 {
					t.Errorf("observed %d attempts, want 1", c.obs.count(opRenew))
				}
				return
			}
			if r.Duration != tc.wantGrant || r.Capped != tc.wantCapped || !r.ExpiresAt.Equal(testEpoch.Add(tc.wantGrant)) {
				t.Errorf("renewal = %+v, want duration %v, capped %v", r, tc.wantGrant, tc.wantCapped)
			}
		})
	}
}

func TestRevoke(t *testing.T) {
	c := newTestClient(t, nil)
	c.vault.handle("auth/approle/login", loginOK(testToken, time.Hour, true))
	c.vault.handle("sys/leases/revoke", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })

	if err := c.Revoke(context.Background(), "database/creds/orders/abc"); err != nil {
		t.Fatal(err)
	}
	if body := c.vault.lastBody("sys/leases/revoke"); body["lease_id"] != "database/creds/orders/abc" || (body["sync"] != nil && body["sync"] != true) {
		t.Errorf("revoke body = %v, want the lease id, and no asynchronous revocation (Vault's default is sync)", body)
	}
	if err := c.Revoke(context.Background(), ""); !IsBadRequest(err) {
		t.Errorf("Revoke(\"\") = %v, want BadRequest", err)
	}
}

func TestLookup(t *testing.T) {
	cases := map[string]struct {
		handler   http.HandlerFunc
		want      LeaseInfo
		wantClass string
	}{
		"exists": {handler: func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, 200, map[string]any{"data": map[string]any{
				"id": "l", "issue_time": "2026-01-02T03:04:05.5Z", "expire_time": "2026-01-02T03:34:05Z",
				"last_renewal": nil, "ttl": 1799, "renewable": true,
			}})
		}, want: LeaseInfo{Exists: true, IssuedAt: time.Date(2026, 1, 2, 3, 4, 5, 5e8, time.UTC),
			ExpiresAt: time.Date(2026, 1, 2, 3, 34, 5, 0, time.UTC), TTL: 1799 * time.Second, Renewable: true}},
		"revoked outside": {handler: status(400, "invalid lease"), want: LeaseInfo{Exists: false}},
		"forbidden":       {handler: status(403, "permission denied"), wantClass: ClassPermissionDenied},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)
			c.vault.handle("auth/approle/login", loginOK(testToken, time.Hour, true))
			c.vault.handle("sys/leases/lookup", tc.handler)

			info, err := c.Lookup(context.Background(), "l")

			if ClassOf(err) != tc.wantClass {
				t.Fatalf("Lookup() error = %v, want class %q", err, tc.wantClass)
			}
			if err == nil && *info != tc.want {
				t.Errorf("Lookup() = %+v, want %+v", *info, tc.want)
			}
			if c.obs.count(opLookup) != 1 {
				t.Errorf("observed %d attempts, want 1", c.obs.count(opLookup))
			}
		})
	}
}

func TestHealth(t *testing.T) {
	cases := map[string]struct {
		body map[string]any
		want Health
	}{
		"active": {body: map[string]any{"initialized": true, "version": "1.21.0", "server_time_utc": 1767323045},
			want: Health{Initialized: true, Version: "1.21.0", ServerTime: time.Unix(1767323045, 0).UTC()}},
		"sealed":  {body: map[string]any{"initialized": true, "sealed": true, "version": "1.21.0"}, want: Health{Initialized: true, Sealed: true, Version: "1.21.0"}},
		"standby": {body: map[string]any{"initialized": true, "standby": true, "version": "1.21.0"}, want: Health{Initialized: true, Standby: true, Version: "1.21.0"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)
			var query string
			c.vault.handle("sys/health", func(w http.ResponseWriter, r *http.Request) {
				query = r.URL.RawQuery
				if r.Header.Get("X-Vault-Token") != "" {
					t.Errorf("health sent a token")
				}
				writeJSON(w, 299, tc.body) // what Vault answers to sealedcode=299 and standbycode=299
			})

			h, err := c.Health(context.Background())

			if err != nil {
				t.Fatal(err)
			}
			if *h != tc.want {
				t.Errorf("Health() = %+v, want %+v", *h, tc.want)
			}
			if !strings.Contains(query, "sealedcode=299") || !strings.Contains(query, "standbycode=299") {
				t.Errorf("query %q does not turn sealed and standby into success codes", query)
			}
			if c.vault.count("auth/approle/login") != 0 {
				t.Errorf("health logged in")
			}
		})
	}
}

func TestSecretDataPrintsKeysOnly(t *testing.T) {
	l := &Lease{ID: "l", Data: SecretData{"username": "u-1234", "password": "pw-secret-42"}}
	a := AppRoleAuth{Mount: "approle", RoleID: testRoleID, SecretID: testSecretID}
	tok := &TokenAuth{Token: testToken}
	c := newTestClient(t, nil)
	ll := &logLines{}
	ll.logger().Info("Printing", "lease", l, "data", l.Data, "approle", a, "token", tok, "client", c.Client,
		"config", c.cfg)
	outputs := append(ll.all(),
		fmtAll(l)+fmtAll(*l)+fmtAll(l.Data)+fmtAll(a)+fmtAll(&a)+fmtAll(tok)+fmtAll(c.Client)+fmtAll(c.cfg.Auth))
	for _, out := range outputs {
		for _, secret := range []string{"u-1234", "pw-secret-42", testSecretID, testRoleID, testToken} {
			if strings.Contains(out, secret) {
				t.Errorf("output holds %q: %s", secret, out)
			}
		}
	}
	if !strings.Contains(fmtAll(l), "password") {
		t.Errorf("the keys should still show: %s", fmtAll(l))
	}
}

// The leases under a credential path, as Vault lists them (LIST sys/leases/lookup/<path>/),
// become full lease IDs; a sub-prefix is no lease; a path with no lease is an empty list.
func TestListLeases(t *testing.T) {
	c := newTestClient(t, nil)
	c.vault.handle("auth/approle/login", loginOK(testToken, time.Hour, true))
	c.vault.handle("sys/leases/lookup/database/creds/orders", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "LIST" && r.URL.Query().Get("list") != "true" {
			writeErrors(w, 405)
			return
		}
		writeJSON(w, 200, map[string]any{"data": map[string]any{"keys": []any{"abc", "def", "sub/"}}})
	})
	ids, err := c.ListLeases(context.Background(), "database/creds/orders")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"database/creds/orders/abc", "database/creds/orders/def"}; !slices.Equal(ids, want) {
		t.Errorf("ListLeases = %v, want %v", ids, want)
	}
	c.vault.handle("sys/leases/lookup/database/creds/orders", status(403, "permission denied"))
	if _, err := c.ListLeases(context.Background(), "database/creds/orders"); !IsPermissionDenied(err) {
		t.Errorf("ListLeases without the policy: %v, want PermissionDenied", err)
	}
}
