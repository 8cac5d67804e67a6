package vault_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	vaultapi "github.com/hashicorp/vault/api"

	"github.com/keyroll/keyroll/test/testground"
	"github.com/keyroll/keyroll/vault"
)

// These tests run the client against a real Vault dev server, a real redis-server (the database
// secrets engine issues Redis ACL users) and a real kube-apiserver (Kubernetes auth with
// TokenRequest tokens). The components the tests only read are shared; tests that seal or stop
// Vault get a Vault of their own.

const (
	operatorNS = "keyroll-system"
	operatorSA = "keyroll"

	ordersPath = "database/creds/orders"
	cappedPath = "database/creds/capped"

	keyrollPolicy = `
path "database/creds/*" { capabilities = ["read"] }
path "sys/leases/renew/database/creds/*" { capabilities = ["update"] }
path "sys/leases/revoke/database/creds/*" { capabilities = ["update"] }
path "sys/leases/lookup" { capabilities = ["update"] }
`
	limitedPolicy = `
path "database/creds/other" { capabilities = ["read"] }
`
)

var shared struct {
	once sync.Once
	g    *testground.Ground
	err  error
}

// sharedGround starts the shared components on first use; TestMain stops them.
func sharedGround(t *testing.T) *testground.Ground {
	t.Helper()
	shared.once.Do(func() {
		shared.g, shared.err = startSharedGround()
	})
	if shared.err != nil {
		t.Fatalf("starting the test ground: %v", shared.err)
	}
	return shared.g
}

func stopSharedGround() {
	if shared.g != nil {
		shared.g.Stop()
	}
}

func startSharedGround() (*testground.Ground, error) {
	g, err := testground.Start(testground.Options{Vault: true, Redis: true})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := configureVault(ctx, g); err != nil {
		g.Stop()
		return nil, err
	}
	return g, nil
}

// configureVault sets Vault up as a Vault administrator would for keyroll: Redis roles, the
// operator's policy, and Kubernetes auth roles for the operator's ServiceAccount.
func configureVault(ctx context.Context, g *testground.Ground) error {
	err := g.Vault.ConfigureRedis(ctx, g.Redis,
		testground.RedisRole{Name: "orders", DefaultTTL: 30 * time.Second, MaxTTL: 2 * time.Minute},
		testground.RedisRole{Name: "capped", DefaultTTL: 10 * time.Second, MaxTTL: 20 * time.Second})
	if err != nil {
		return err
	}
	for name, hcl := range map[string]string{"keyroll": keyrollPolicy, "limited": limitedPolicy} {
		if err := g.Vault.WritePolicy(ctx, name, hcl); err != nil {
			return err
		}
	}
	if err := g.CP.EnsureServiceAccount(ctx, operatorNS, operatorSA); err != nil {
		return err
	}
	role := func(name string, ttl, maxTTL time.Duration) testground.KubernetesAuthRole {
		return testground.KubernetesAuthRole{Name: name, ServiceAccounts: []string{operatorSA}, Namespaces: []string{operatorNS},
			Policies: []string{"keyroll"}, TokenTTL: ttl, TokenMaxTTL: maxTTL}
	}
	periodic := role("periodic", 0, 0)
	periodic.TokenPeriod = 4 * time.Second
	return g.Vault.EnableKubernetesAuth(ctx, g.CP, role("keyroll", time.Hour, 0), role("short", 5*time.Second, 12*time.Second), periodic,
		testground.KubernetesAuthRole{Name: "elsewhere", ServiceAccounts: []string{"someone-else"}, Namespaces: []string{operatorNS}, Policies: []string{"keyroll"}})
}

// attempts counts the Observer's calls per operation.
type attempts struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *attempts) observe(op, _ string, _ time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[string]int{}
	}
	a.n[op]++
}

func (a *attempts) count(op string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[op]
}

// logs captures a client's log lines and echoes them to the test log.
type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) logger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
		t.Log(prefix, args)
	}, funcr.Options{Verbosity: 1})
}

func (l *logs) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// kubernetesAuth logs in as the operator's ServiceAccount with a fresh TokenRequest token.
func kubernetesAuth(g *testground.Ground, role string) vault.Auth {
	return vault.Auth{Kubernetes: &vault.KubernetesAuth{Role: role, JWT: func(ctx context.Context) (string, error) {
		return g.CP.ServiceAccountToken(ctx, operatorNS, operatorSA, 10*time.Minute, "vault")
	}}}
}

func newClient(t *testing.T, cfg vault.Config) *vault.Client {
	t.Helper()
	c, err := vault.New(cfg)
	if err != nil {
		t.Fatalf("vault.New: %v", err)
	}
	return c
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func whoAmI(t *testing.T, g *testground.Ground, l *vault.Lease) error {
	t.Helper()
	user := l.Data["username"]
	who, err := g.Redis.WhoAmI(user, l.Data["password"])
	if err == nil && who != user {
		return errors.New("authenticated as " + who + ", not " + user)
	}
	return err
}

func TestIntegrationLeaseLifecycle(t *testing.T) {
	g := sharedGround(t)
	ctx := testContext(t, time.Minute)
	c := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: kubernetesAuth(g, "keyroll")})

	l, err := c.Issue(ctx, ordersPath)
	if err != nil {
		t.Fatalf("Issue() error = %v", err)
	}
	if !strings.HasPrefix(l.ID, ordersPath+"/") || l.Duration != 30*time.Second || !l.Renewable || l.OutlivesToken {
		t.Errorf("lease = %+v", l)
	}
	if err := whoAmI(t, g, l); err != nil {
		t.Fatalf("the issued credential does not authenticate: %v", err)
	}

	r, err := c.Renew(ctx, l.ID, 30*time.Second)
	if err != nil || r.Capped || r.Duration != 30*time.Second {
		t.Fatalf("Renew() = %+v, %v; want 30s, not capped", r, err)
	}
	if err := whoAmI(t, g, l); err != nil {
		t.Fatalf("the renewed credential does not authenticate: %v", err)
	}
	info, err := c.Lookup(ctx, l.ID)
	if err != nil || !info.Exists || !info.Renewable || info.TTL <= 0 || info.TTL > 30*time.Second || info.ExpiresAt.IsZero() {
		t.Fatalf("Lookup() = %+v, %v", info, err)
	}

	if err := c.Revoke(ctx, l.ID); err != nil {
		t.Fatalf("Revoke() error = %v", err)
	}
	if err := whoAmI(t, g, l); err == nil {
		t.Fatalf("the credential still authenticates after Revoke returned")
	}
	if info, err := c.Lookup(ctx, l.ID); err != nil || info.Exists {
		t.Errorf("Lookup() after revoke = %+v, %v; want gone", info, err)
	}
	if err := c.Revoke(ctx, l.ID); err != nil {
		t.Errorf("revoking a revoked lease: %v", err)
	}
	if _, err := c.Renew(ctx, l.ID, 30*time.Second); !vault.IsLeaseGone(err) {
		t.Errorf("Renew() of a revoked lease = %v, want LeaseGone", err)
	}
}

func TestIntegrationRenewalCappedByMaxTTL(t *testing.T) {
	g := sharedGround(t)
	ctx := testContext(t, time.Minute)
	c := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: kubernetesAuth(g, "keyroll")})
	l, err := c.Issue(ctx, cappedPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Revoke(context.Background(), l.ID) })

	r, err := c.Renew(ctx, l.ID, time.Hour)

	if err != nil {
		t.Fatalf("Renew() error = %v", err)
	}
	if !r.Capped || r.Duration <= 0 || r.Duration > 20*time.Second {
		t.Errorf("Renew(1h) of a lease with max TTL 20s = %+v; want capped, at most 20s", r)
	}
	t.Logf("granted %v, warnings %q", r.Duration, r.Warnings)
	if err := whoAmI(t, g, l); err != nil {
		t.Errorf("the credential does not authenticate after a capped renewal: %v", err)
	}
}

func TestIntegrationLeaseRevokedOutside(t *testing.T) {
	g := sharedGround(t)
	ctx := testContext(t, time.Minute)
	obs := &attempts{}
	c := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: kubernetesAuth(g, "keyroll"), Observer: obs.observe})
	l, err := c.Issue(ctx, ordersPath)
	if err != nil {
		t.Fatal(err)
	}

	if err := g.Vault.Root.Sys().RevokeWithContext(ctx, l.ID); err != nil {
		t.Fatalf("revoking with the root token: %v", err)
	}

	info, err := c.Lookup(ctx, l.ID)
	if err != nil || info.Exists {
		t.Fatalf("Lookup() of a lease revoked outside = %+v, %v; want gone, no error", info, err)
	}
	if n := obs.count("lookup"); n != 1 {
		t.Errorf("lookup attempts = %d, want 1", n)
	}
	if _, err := c.Renew(ctx, l.ID, time.Minute); !vault.IsLeaseGone(err) {
		t.Errorf("Renew() of a lease revoked outside = %v, want LeaseGone", err)
	}
}

func TestIntegrationKubernetesLogin(t *testing.T) {
	g := sharedGround(t)
	cases := map[string]struct {
		role      string
		wantClass string
	}{
		"bound service account": {role: "keyroll"},
		"unbound role":          {role: "elsewhere", wantClass: vault.ClassPermissionDenied},
		"unknown role":          {role: "nope", wantClass: vault.ClassBadRequest},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			obs := &attempts{}
			c := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: kubernetesAuth(g, tc.role), Observer: obs.observe})

			err := c.Login(ctx)

			if vault.ClassOf(err) != tc.wantClass {
				t.Fatalf("Login() error = %v, want class %q", err, tc.wantClass)
			}
			if n := obs.count("login"); n != 1 {
				t.Errorf("login attempts = %d, want 1", n)
			}
			info := c.TokenInfo()
			if err != nil {
				if !vault.IsLoginFailed(err) || info.Valid {
					t.Errorf("after a failed login: IsLoginFailed %v, TokenInfo %+v", vault.IsLoginFailed(err), info)
				}
				return
			}
			if !info.Valid || info.Method != "kubernetes" || !info.Renewable || info.TTL != time.Hour || info.Logins != 1 ||
				!strings.Contains(strings.Join(info.Policies, ","), "keyroll") {
				t.Errorf("TokenInfo() = %+v", info)
			}
			if _, err := c.Issue(ctx, ordersPath); err != nil {
				t.Errorf("Issue() after a Kubernetes login = %v", err)
			}
		})
	}
}

func TestIntegrationAppRoleLogin(t *testing.T) {
	g := sharedGround(t)
	ctx := testContext(t, time.Minute)
	roleID, secretID := enableAppRole(t, ctx, g.Vault.Root)
	cases := map[string]struct {
		secretID  string
		wantLogin bool
	}{
		"right secret id": {secretID: secretID, wantLogin: true},
		"wrong secret id": {secretID: "0b9c6a1e-0000-4000-8000-123456789abc"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			obs := &attempts{}
			ll := &logs{}
			c := newClient(t, vault.Config{Address: g.Vault.Addr, Observer: obs.observe, Logger: ll.logger(t),
				Auth: vault.Auth{AppRole: &vault.AppRoleAuth{RoleID: roleID, SecretID: tc.secretID}}})

			l, err := c.Issue(ctx, ordersPath)

			if !tc.wantLogin {
				if !vault.IsLoginFailed(err) || vault.IsUnavailable(err) || obs.count("login") != 1 {
					t.Errorf("Issue() with a wrong secret id = %v after %d login attempts; want one refused login", err, obs.count("login"))
				}
				if err != nil && (strings.Contains(err.Error(), tc.secretID) || strings.Contains(err.Error(), roleID)) {
					t.Errorf("the error quotes the role id or secret id: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Issue() after an AppRole login = %v", err)
			}
			defer func() { _ = c.Revoke(ctx, l.ID) }()
			if info := c.TokenInfo(); info.Method != "approle" || info.Logins != 1 {
				t.Errorf("TokenInfo() = %+v", info)
			}
			if out := ll.all(); strings.Contains(out, secretID) || strings.Contains(out, l.Data["password"]) {
				t.Errorf("a secret reached the logs:\n%s", out)
			}
		})
	}
}

// enableAppRole enables AppRole with the root token and returns a role ID and a secret ID.
func enableAppRole(t *testing.T, ctx context.Context, root *vaultapi.Client) (string, string) {
	t.Helper()
	err := root.Sys().EnableAuthWithOptionsWithContext(ctx, "approle", &vaultapi.EnableAuthOptions{Type: "approle"})
	if err != nil && !strings.Contains(err.Error(), "path is already in use") {
		t.Fatalf("enabling approle: %v", err)
	}
	if _, err := root.Logical().WriteWithContext(ctx, "auth/approle/role/keyroll",
		map[string]any{"token_policies": "keyroll", "token_ttl": "1h"}); err != nil {
		t.Fatalf("writing the approle role: %v", err)
	}
	rid, err := root.Logical().ReadWithContext(ctx, "auth/approle/role/keyroll/role-id")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := root.Logical().WriteWithContext(ctx, "auth/approle/role/keyroll/secret-id", nil)
	if err != nil {
		t.Fatal(err)
	}
	return rid.Data["role_id"].(string), sid.Data["secret_id"].(string)
}

// TestIntegrationTokenRenewalAndRelogin runs calls for 15 s with a token whose TTL is 5 s and
// max TTL 12 s: the client renews it, then logs in again before it ends, and every call works.
// The lease the first token issued dies with that token, as Vault does; once the client has seen
// the max TTL, it says so of the leases it issues.
func TestIntegrationTokenRenewalAndRelogin(t *testing.T) {
	g := sharedGround(t)
	ctx := testContext(t, time.Minute)
	rootLease, err := g.Vault.Root.Logical().ReadWithContext(ctx, ordersPath) // not tied to the client's tokens
	if err != nil {
		t.Fatal(err)
	}
	ll := &logs{}
	c := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: kubernetesAuth(g, "short"), Logger: ll.logger(t)})
	first, err := c.Issue(ctx, ordersPath)
	if err != nil {
		t.Fatal(err)
	}
	if first.OutlivesToken {
		t.Errorf("first lease: the token's max TTL cannot be known yet: %+v", first)
	}

	var second *vault.Lease
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		info, err := c.Lookup(ctx, rootLease.LeaseID)
		if err != nil || !info.Exists {
			t.Fatalf("Lookup() at %v = %+v, %v (token %+v)", time.Now().Format(time.StampMilli), info, err, c.TokenInfo())
		}
		if second == nil && c.TokenInfo().Logins >= 2 {
			if second, err = c.Issue(ctx, ordersPath); err != nil {
				t.Fatal(err)
			}
		}
	}

	ti := c.TokenInfo()
	if ti.Renewals < 1 || ti.Logins < 2 || !ti.Valid {
		t.Fatalf("TokenInfo() = %+v; want at least one renewal and one more login", ti)
	}
	if second == nil || !second.OutlivesToken || second.TokenDeadline.Sub(second.IssuedAt) > 13*time.Second {
		t.Errorf("a 30s lease issued after the max TTL was learned: %+v; want OutlivesToken", second)
	}
	waitGone(t, ctx, c, first) // the first token has ended, and Vault revoked its lease with it
	if n := strings.Count(ll.all(), `"Logged in to Vault"`); n < 2 {
		t.Errorf("%d login log lines, want at least 2", n)
	}
	if out := ll.all(); strings.Contains(out, "hvs.") || strings.Contains(out, "eyJ") || strings.Contains(out, first.Data["password"]) {
		t.Errorf("a secret reached the logs:\n%s", out)
	}
	_ = g.Vault.Root.Sys().RevokeWithContext(ctx, rootLease.LeaseID)
}

// TestIntegrationReplacedTokenKeepsItsLeaseAlive: a lease lives as long as the token that created
// it. A token replaced by a new login is still renewed by KeepTokens while its lease lives, so the
// lease outlives the token's period many times over; a token nobody keeps dies, and Vault revokes
// its lease with it.
func TestIntegrationReplacedTokenKeepsItsLeaseAlive(t *testing.T) {
	g := sharedGround(t)
	ctx := testContext(t, time.Minute)
	kept := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: kubernetesAuth(g, "periodic")})
	dropped := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: kubernetesAuth(g, "periodic")})
	keptLease, err := kept.Issue(ctx, ordersPath)
	if err != nil {
		t.Fatal(err)
	}
	droppedLease, err := dropped.Issue(ctx, ordersPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*vault.Client{kept, dropped} {
		if err := c.Login(ctx); err != nil { // new work moves to a new token
			t.Fatal(err)
		}
	}
	needs := map[string]time.Time{keptLease.TokenAccessor: keptLease.ExpiresAt}
	var droppedGoneAfter time.Duration
	start := time.Now()
	for time.Since(start) < 20*time.Second { // five token periods, within the 30s lease
		if _, err := kept.KeepTokens(ctx, needs); err != nil {
			t.Fatalf("KeepTokens() after %s: %v", time.Since(start).Round(time.Second), err)
		}
		if err := whoAmI(t, g, keptLease); err != nil {
			t.Fatalf("the kept token's credential stopped working after %s: %v", time.Since(start).Round(time.Second), err)
		}
		if exists, _ := g.Vault.LeaseExpiry(droppedLease.ID); !exists && droppedGoneAfter == 0 {
			droppedGoneAfter = time.Since(start)
		}
		time.Sleep(time.Second)
	}
	if exists, _ := g.Vault.LeaseExpiry(keptLease.ID); !exists {
		t.Errorf("the lease of the kept token is gone")
	}
	if droppedGoneAfter == 0 || droppedGoneAfter > 10*time.Second {
		t.Errorf("the lease of the token nobody kept was still there after %s (gone after %s); the control failed", time.Since(start), droppedGoneAfter)
	}
	ts, ok := kept.Token(keptLease.TokenAccessor)
	if !ok || ts.Current || ts.LastRenewal.IsZero() {
		t.Errorf("replaced token = %+v, %v; want it held, not current, renewed", ts, ok)
	}
	t.Logf("the lease of the token nobody kept was revoked by Vault %s after the new login", droppedGoneAfter.Round(100*time.Millisecond))
	_ = kept.Revoke(ctx, keptLease.ID)
}

func waitGone(t *testing.T, ctx context.Context, c vault.LeaseClient, l *vault.Lease) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		info, err := c.Lookup(ctx, l.ID)
		if err == nil && !info.Exists {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("lease %s still there (%+v, %v)", l.ID, info, err)
		}
	}
	if err := func() error { _, err := c.Renew(ctx, l.ID, 0); return err }(); !vault.IsLeaseGone(err) {
		t.Errorf("Renew() of a lease gone with its token = %v", err)
	}
}

// ownVault starts a Vault dev server for one test (one that seals or stops it).
func ownVault(t *testing.T) *testground.Vault {
	t.Helper()
	v, err := testground.StartVault(t.TempDir())
	if err != nil {
		t.Fatalf("starting vault: %v", err)
	}
	t.Cleanup(v.Stop)
	return v
}

// TestIntegrationVaultUnavailable: a sealed, a stopped and a blackholed Vault (its process
// paused: the kernel still accepts connections, nothing answers) each fail a call after one
// request, as Sealed or Unavailable, at once or by Config.Timeout although the caller would wait
// longer; once Vault answers again, the next call works (after a request it left unanswered: once
// RetryUnanswered has passed; until then calls fail at once).
func TestIntegrationVaultUnavailable(t *testing.T) {
	const timeout = time.Second
	cases := map[string]struct {
		breakVault   func(t *testing.T, v *testground.Vault) (restore func())
		wantClass    string
		wantDeadline bool
	}{
		"sealed": {breakVault: func(t *testing.T, v *testground.Vault) func() { seal(t, v); return nil }, wantClass: vault.ClassSealed},
		"stopped": {breakVault: func(_ *testing.T, v *testground.Vault) func() { v.Stop(); return nil },
			wantClass: vault.ClassUnavailable},
		"blackholed": {breakVault: pause, wantClass: vault.ClassUnavailable, wantDeadline: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := ownVault(t)
			obs := &attempts{}
			c := newClient(t, vault.Config{Address: v.Addr, Auth: vault.Auth{Token: &vault.TokenAuth{Token: v.RootToken}},
				Observer: obs.observe, Timeout: timeout})
			if err := c.Login(testContext(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			restore := tc.breakVault(t, v)
			start := time.Now()

			_, err := c.Issue(testContext(t, 20*time.Second), "database/creds/anything")

			elapsed := time.Since(start)
			if vault.ClassOf(err) != tc.wantClass || !vault.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) != tc.wantDeadline {
				t.Fatalf("Issue() error = %v, want class %s (deadline: %v)", err, tc.wantClass, tc.wantDeadline)
			}
			if n := obs.count("issue"); n != 1 {
				t.Errorf("%d issue requests, want 1", n)
			}
			switch {
			case tc.wantDeadline && (elapsed < timeout || elapsed > timeout+time.Second):
				t.Errorf("Issue() took %v, want the timeout of %v", elapsed, timeout)
			case !tc.wantDeadline && elapsed > timeout/2:
				t.Errorf("Issue() took %v, want it to fail at once", elapsed)
			}
			t.Logf("%s after %v", err, elapsed.Round(time.Millisecond))
			if restore == nil {
				return
			}
			restore()
			if tc.wantDeadline { // Vault left the request unanswered: the next ones fail at once for a moment
				start := time.Now()
				if _, err := c.Health(testContext(t, 10*time.Second)); !vault.IsUnavailable(err) || time.Since(start) > timeout/2 {
					t.Errorf("Health() right after an unanswered request = %v after %v, want Unavailable at once", err, time.Since(start))
				}
				time.Sleep(vault.RetryUnanswered)
			}
			if h, err := c.Health(testContext(t, 10*time.Second)); err != nil || h.Sealed {
				t.Errorf("Health() once Vault answers again = %+v, %v", h, err)
			}
		})
	}
}

// pause stops the Vault process (SIGSTOP) until the returned restore, or the test's end,
// continues it.
func pause(t *testing.T, v *testground.Vault) func() {
	t.Helper()
	pid := v.Process().PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("pausing vault: %v", err)
	}
	// The signal takes a moment to stop every thread on a busy machine: until then Vault answers.
	for deadline := time.Now().Add(5 * time.Second); !allStopped(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("vault (pid %d) is not stopped 5 s after SIGSTOP", pid)
		}
	}
	var once sync.Once
	restore := func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(restore) // before ownVault's Stop
	return restore
}

// allStopped says whether every thread of the process pid is stopped.
func allStopped(pid int) bool {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*")
	for _, task := range tasks {
		tid, _ := strconv.Atoi(filepath.Base(task))
		if testground.ProcessState(tid) != "T" {
			return false
		}
	}
	return len(tasks) > 0
}

func seal(t *testing.T, v *testground.Vault) {
	t.Helper()
	if err := v.Root.Sys().Seal(); err != nil {
		t.Fatalf("sealing: %v", err)
	}
}

func TestIntegrationHealth(t *testing.T) {
	v := ownVault(t)
	ctx := testContext(t, 20*time.Second)
	c := newClient(t, vault.Config{Address: v.Addr, Auth: vault.Auth{Token: &vault.TokenAuth{Token: v.RootToken}}})
	h, err := c.Health(ctx)
	if err != nil || h.Sealed || !h.Initialized || !strings.HasPrefix(h.Version, "1.21.") {
		t.Fatalf("Health() = %+v, %v", h, err)
	}
	seal(t, v)
	if h, err := c.Health(ctx); err != nil || !h.Sealed {
		t.Errorf("Health() of a sealed Vault = %+v, %v; want sealed, no error", h, err)
	}
}

// TestIntegrationPermissionDenied: a token whose policy forbids the path is refused after one request.
func TestIntegrationPermissionDenied(t *testing.T) {
	g := sharedGround(t)
	ctx := testContext(t, time.Minute)
	tok, err := g.Vault.Root.Auth().Token().CreateWithContext(ctx, &vaultapi.TokenCreateRequest{Policies: []string{"limited"}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	obs := &attempts{}
	ll := &logs{}
	c := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: vault.Auth{Token: &vault.TokenAuth{Token: tok.Auth.ClientToken}},
		Observer: obs.observe, Logger: ll.logger(t)})

	_, err = c.Issue(ctx, ordersPath)

	if !vault.IsPermissionDenied(err) {
		t.Fatalf("Issue() error = %v, want PermissionDenied", err)
	}
	if n := obs.count("issue"); n != 1 {
		t.Errorf("issue attempts = %d, want exactly 1", n)
	}
	if strings.Contains(err.Error(), tok.Auth.ClientToken) || strings.Contains(ll.all(), tok.Auth.ClientToken) {
		t.Errorf("the token reached the error or the logs")
	}
	if info := c.TokenInfo(); info.Method != "token" || !info.Renewable || info.TTL <= 0 || info.TTL > time.Hour {
		t.Errorf("TokenInfo() of a 1h token = %+v", info)
	}
}

// TestIntegrationPolicyLimitsLeasesByPrefix: the client names the lease in the URL of a renewal and
// a revocation, so a policy on sys/leases/renew/<prefix>* and sys/leases/revoke/<prefix>* (as
// deploy/vault/policy.hcl and a tenant's policy are written) lets a token renew and revoke the
// leases of its own role and refuses another role's: Vault, too, keeps a tenant to its leases.
func TestIntegrationPolicyLimitsLeasesByPrefix(t *testing.T) {
	g := sharedGround(t)
	ctx := testContext(t, time.Minute)
	const tenantPolicy = `
path "database/creds/orders" { capabilities = ["read"] }
path "sys/leases/renew/database/creds/orders/*" { capabilities = ["update"] }
path "sys/leases/revoke/database/creds/orders/*" { capabilities = ["update"] }
`
	if err := g.Vault.WritePolicy(ctx, "tenant-orders", tenantPolicy); err != nil {
		t.Fatal(err)
	}
	tok, err := g.Vault.Root.Auth().Token().CreateWithContext(ctx, &vaultapi.TokenCreateRequest{Policies: []string{"tenant-orders"}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	tenant := newClient(t, vault.Config{Address: g.Vault.Addr, Auth: vault.Auth{Token: &vault.TokenAuth{Token: tok.Auth.ClientToken}}})
	own, err := tenant.Issue(ctx, ordersPath)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := g.Vault.Root.Logical().ReadWithContext(ctx, cappedPath)
	if err != nil || theirs == nil {
		t.Fatalf("reading %s as root: %v", cappedPath, err)
	}
	if _, err := tenant.Renew(ctx, theirs.LeaseID, 0); !vault.IsPermissionDenied(err) {
		t.Errorf("renewing another role's lease: %v, want PermissionDenied", err)
	}
	if err := tenant.Revoke(ctx, theirs.LeaseID); !vault.IsPermissionDenied(err) {
		t.Errorf("revoking another role's lease: %v, want PermissionDenied", err)
	}
	if ok, _ := g.Vault.LeaseExpiry(theirs.LeaseID); !ok {
		t.Error("the other role's lease is gone")
	}
	if _, err := tenant.Renew(ctx, own.ID, 0); err != nil {
		t.Errorf("renewing its own lease: %v", err)
	}
	if err := tenant.Revoke(ctx, own.ID); err != nil {
		t.Errorf("revoking its own lease: %v", err)
	}
	_ = g.Vault.Root.Sys().RevokeWithContext(ctx, theirs.LeaseID)
}
