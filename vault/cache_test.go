package vault

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

func TestConfigKey(t *testing.T) {
	base := func() Config {
		return Config{Address: "https://vault:8200", CABundle: []byte("ca"), Namespace: "team",
			Auth: Auth{AppRole: &AppRoleAuth{RoleID: "role", SecretID: "secret-1"}}}
	}
	jwt := func(context.Context) (string, error) { return "", nil }
	cases := map[string]struct {
		change   func(*Config)
		wantSame bool
	}{
		"identical":                     {change: func(*Config) {}, wantSame: true},
		"trailing slash and mount":      {change: func(c *Config) { c.Address += "/"; c.Auth.AppRole.Mount = "approle" }, wantSame: true},
		"logger and clock do not count": {change: func(c *Config) { c.Observer = func(string, string, time.Duration) {} }, wantSame: true},
		"address":                       {change: func(c *Config) { c.Address = "https://vault2:8200" }},
		"ca bundle":                     {change: func(c *Config) { c.CABundle = []byte("other ca") }},
		"server name":                   {change: func(c *Config) { c.TLSServerName = "vault.internal" }},
		"namespace":                     {change: func(c *Config) { c.Namespace = "team-b" }},
		"secret id":                     {change: func(c *Config) { c.Auth.AppRole.SecretID = "secret-2" }},
		"role id":                       {change: func(c *Config) { c.Auth.AppRole.RoleID = "role-2" }},
		"mount":                         {change: func(c *Config) { c.Auth.AppRole.Mount = "approle-2" }},
		"rate limit":                    {change: func(c *Config) { c.RateLimit = RateLimit{QPS: 1, Burst: 1} }},
		"timeout":                       {change: func(c *Config) { c.Timeout = time.Minute }},
		"auth method":                   {change: func(c *Config) { c.Auth = Auth{Kubernetes: &KubernetesAuth{Role: "role", JWT: jwt}} }},

		"token": {change: func(c *Config) { c.Auth = Auth{Token: &TokenAuth{Token: "secret-1"}} }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a, b := base(), base()
			tc.change(&b)
			if same := a.Key() == b.Key(); same != tc.wantSame {
				t.Errorf("same key = %v, want %v", same, tc.wantSame)
			}
		})
	}
	if k := base().Key(); len(k) != 64 {
		t.Errorf("key %q is not a sha256 hex digest", k)
	}
}

// Defect: the audiences and lifetime of the service-account token were not part of the key, so
// editing them changed nothing.
func TestConfigKeyCoversTheKubernetesTokenRequest(t *testing.T) {
	jwt := func(context.Context) (string, error) { return "", nil }
	k := func(mutate func(*KubernetesAuth)) string {
		a := &KubernetesAuth{Role: "keyroll", JWT: jwt, Audiences: []string{"vault"}, TokenExpiration: 10 * time.Minute}
		if mutate != nil {
			mutate(a)
		}
		return Config{Address: "https://vault:8200", Auth: Auth{Kubernetes: a}}.Key()
	}
	if first, again := k(nil), k(nil); first != again {
		t.Fatal("the same settings give different keys")
	}
	if k(nil) == k(func(a *KubernetesAuth) { a.Audiences = []string{"vault-2"} }) {
		t.Error("other audiences give the same key")
	}
	if k(nil) == k(func(a *KubernetesAuth) { a.TokenExpiration = time.Hour }) {
		t.Error("another token lifetime gives the same key")
	}
}

func TestCacheOneClientPerConnection(t *testing.T) {
	cfg := func(secret string) Config {
		return Config{Address: "https://vault:8200", Auth: Auth{AppRole: &AppRoleAuth{RoleID: "role", SecretID: secret}}}
	}
	cache := NewCache()
	a1, err := cache.Get("conn-a", cfg("s1"))
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := cache.Get("conn-a", cfg("s1"))
	b, _ := cache.Get("conn-b", cfg("s1"))
	if a1 != a2 || cache.Len() != 2 {
		t.Fatalf("same name and settings gave different clients (len %d)", cache.Len())
	}
	if a1 == b {
		t.Fatalf("two connections with the same settings share a client: their tokens and logs would mix")
	}

	a3, _ := cache.Get("conn-a", cfg("s2")) // conn-a's secret changed
	if a3 == a1 || cache.Len() != 2 {
		t.Fatalf("a changed secret did not give a new client (len %d)", cache.Len())
	}
	if a4, _ := cache.Get("conn-a", cfg("s2")); a4 != a3 {
		t.Fatalf("the new client is not kept")
	}
	cache.Forget("conn-b")
	cache.Forget("conn-a")
	if cache.Len() != 0 {
		t.Errorf("len = %d after every user left, want 0", cache.Len())
	}
	if _, err := cache.Get("bad", Config{Address: "nope"}); !IsInvalidConfig(err) || cache.Len() != 0 {
		t.Errorf("Get(invalid) = %v, len %d", err, cache.Len())
	}
}

// TestCacheSharesOneLogin: many users of the same settings, calling at once, log in once.
func TestCacheSharesOneLogin(t *testing.T) {
	fv := newFakeVault(t)
	fv.handle("auth/approle/login", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		loginOK(tokenA, time.Hour, true)(w, r)
	})
	fv.handle(credsPath, issueOK("l", time.Hour, nil))
	cache := NewCache()
	const users = 1000
	var wg sync.WaitGroup
	errs := make(chan error, users)
	for i := range users {
		wg.Go(func() {
			c, err := cache.Get("conn", Config{Address: fv.srv.URL, RateLimit: RateLimit{QPS: 1e6, Burst: users},
				Auth: Auth{AppRole: &AppRoleAuth{RoleID: testRoleID, SecretID: testSecretID}}})
			if err == nil && i%10 == 0 {
				_, err = c.Issue(context.Background(), credsPath)
			}
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
	if got := fv.count("auth/approle/login"); got != 1 || cache.Len() != 1 {
		t.Errorf("logins = %d, clients = %d; want 1 and 1", got, cache.Len())
	}
	if got := fv.count(credsPath); got != users/10 {
		t.Errorf("issues = %d, want %d", got, users/10)
	}
	cache.Forget("conn")
}
