package vault

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	testclock "k8s.io/utils/clock/testing"
)

// fakeVault is an httptest Vault whose answers each test scripts per path (without /v1/).
type fakeVault struct {
	srv *httptest.Server

	mu     sync.Mutex
	routes map[string]http.HandlerFunc
	hits   map[string]int
	bodies map[string][]map[string]any
}

func newFakeVault(t *testing.T) *fakeVault {
	t.Helper()
	f := &fakeVault{routes: map[string]http.HandlerFunc{}, hits: map[string]int{}, bodies: map[string][]map[string]any{}}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVault) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(r.URL.Path, "/v1/")
	raw, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(raw))
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	// Vault takes the lease of a renewal or revocation in the URL or in the body: either way it
	// is the body's lease_id here.
	for _, base := range []string{"sys/leases/renew", "sys/leases/revoke"} {
		if id, ok := strings.CutPrefix(p, base+"/"); ok {
			if body == nil {
				body = map[string]any{}
			}
			p, body["lease_id"] = base, id
		}
	}
	f.mu.Lock()
	f.hits[p]++
	f.bodies[p] = append(f.bodies[p], body)
	h := f.routes[p]
	f.mu.Unlock()
	if h == nil {
		writeErrors(w, http.StatusNotFound)
		return
	}
	h(w, r)
}

// handle sets the handler of a path.
func (f *fakeVault) handle(path string, h http.HandlerFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes[path] = h
}

// count is how many requests reached path.
func (f *fakeVault) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[path]
}

// lastBody is the JSON body of the last request to path.
func (f *fakeVault) lastBody(path string) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.bodies[path]
	if len(b) == 0 {
		return nil
	}
	return b[len(b)-1]
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErrors(w http.ResponseWriter, code int, msgs ...string) {
	if msgs == nil {
		msgs = []string{}
	}
	writeJSON(w, code, map[string]any{"errors": msgs})
}

// status answers every request with code and Vault error strings.
func status(code int, msgs ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { writeErrors(w, code, msgs...) }
}

// sequence answers with the handlers in turn, repeating the last one.
func sequence(hs ...http.HandlerFunc) http.HandlerFunc {
	var mu sync.Mutex
	i := 0
	return func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		h := hs[min(i, len(hs)-1)]
		i++
		mu.Unlock()
		h(w, r)
	}
}

// loginOK answers a login with token, ttl and renewability; the token's accessor is accessorFor(token).
func loginOK(token string, ttl time.Duration, renewable bool, warnings ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"auth": map[string]any{
			"client_token": token, "accessor": accessorFor(token), "policies": []string{"default", "keyroll"},
			"lease_duration": int(ttl / time.Second), "renewable": renewable,
		}, "warnings": warnings})
	}
}

// accessorFor is the accessor the fake Vault gives a token.
func accessorFor(token string) string { return "acc-" + token[len(token)-6:] }

// renewSelfOK answers renew-self with the granted ttl.
func renewSelfOK(ttl time.Duration, renewable bool) http.HandlerFunc {
	return loginOK("unused", ttl, renewable)
}

// renewSelfCapped answers renew-self with ttl, capped by the token's max TTL, as Vault words it.
func renewSelfCapped(ttl time.Duration) http.HandlerFunc {
	return loginOK("unused", ttl, true, `TTL of "1m" exceeded the effective max_ttl of "`+ttl.String()+`"; TTL value is capped accordingly`)
}

// issueOK answers a credentials read.
func issueOK(leaseID string, ttl time.Duration, data map[string]any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{
			"lease_id": leaseID, "lease_duration": int(ttl / time.Second), "renewable": true, "data": data,
		})
	}
}

func renewOK(ttl time.Duration, warnings ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{
			"lease_id": "x", "lease_duration": int(ttl / time.Second), "renewable": true, "warnings": warnings,
		})
	}
}

// observed records the Observer's calls.
type observed struct {
	mu    sync.Mutex
	calls []string // "op outcome"
}

func (o *observed) observe(op, outcome string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, op+" "+outcome)
}

// count is the number of attempts of op.
func (o *observed) count(op string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.calls {
		if strings.HasPrefix(c, op+" ") {
			n++
		}
	}
	return n
}

// logLines captures a logr.Logger's output.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 10})
}

func (l *logLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

const (
	testRoleID   = "role-id-6f1c2a"
	testSecretID = "secret-id-9b7e44d1"
	testToken    = "hvs.CAESIJtestTokenValue0123456789"
)

var testEpoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

type testClient struct {
	*Client
	vault *fakeVault
	clock *testclock.FakeClock
	obs   *observed
	logs  *logLines
}

// newTestClient returns a client of a fake Vault with AppRole auth, a fake clock, an observer
// and captured logs; mutate adjusts the Config.
func newTestClient(t *testing.T, mutate func(*Config)) *testClient {
	t.Helper()
	tc := &testClient{vault: newFakeVault(t), clock: testclock.NewFakeClock(testEpoch), obs: &observed{}, logs: &logLines{}}
	cfg := Config{
		Address:  tc.vault.srv.URL,
		Auth:     Auth{AppRole: &AppRoleAuth{RoleID: testRoleID, SecretID: testSecretID}},
		Clock:    tc.clock,
		Logger:   tc.logs.logger(),
		Observer: tc.obs.observe,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	tc.Client = c
	t.Cleanup(c.closeIdleConnections)
	return tc
}
