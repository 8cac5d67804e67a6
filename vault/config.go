package vault

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// Defaults applied by New to the zero values of Config.
const (
	DefaultTimeout = 10 * time.Second
	DefaultQPS     = 20
	DefaultBurst   = 40

	defaultKubernetesMount = "kubernetes"
	defaultAppRoleMount    = "approle"
)

// Config holds the plain settings of one Vault connection.
type Config struct {
	// Address is the URL of the Vault server, e.g. https://vault.vault.svc:8200.
	Address string
	// CABundle holds PEM certificates of the CAs that sign the server's certificate. Empty means
	// the system trust store. Verification is never skipped.
	CABundle []byte
	// TLSServerName is the name expected in the server's certificate, when it differs from the
	// host of Address.
	TLSServerName string
	// Namespace is the Vault Enterprise namespace (X-Vault-Namespace). Empty for the root namespace.
	Namespace string
	// Auth is how the client logs in: exactly one of its fields is set.
	Auth Auth
	// RateLimit bounds the requests sent to Vault (logins and token renewals included).
	RateLimit RateLimit
	// Limiter, when set, is a limiter that the client shares with others (the clients of one
	// connection's namespaces), made for RateLimit; without it the client makes its own.
	Limiter *rate.Limiter
	// Timeout bounds every call, however long the caller's context lasts (a sooner deadline of
	// the context wins), so that a Vault that never answers ends each call in time. A call is
	// not retried: it fails with a classified error, and the caller tries again later.
	// Default DefaultTimeout.
	Timeout time.Duration
	// Clock is the source of time. Default: the real clock.
	Clock clock.Clock
	// Logger receives the client's logs; it never sees a token, secret ID or credential.
	Logger logr.Logger
	// Tokens, when set, persists the tokens the client logs in with before they create anything,
	// and is read once, before the first call, to take over tokens another process left: they
	// are kept alive while their leases live.
	Tokens TokenStore
	// Observer, when set, is called once per HTTP request with the operation ("issue", "renew",
	// "revoke", "lookup", "health", "login", "renew-self", "lookup-self"), its outcome
	// (OutcomeSuccess or an error class) and how long the request took, the wait for the rate
	// limiter included (a request whose deadline passed in that wait counts as Unavailable).
	Observer func(op, outcome string, d time.Duration)
}

// Auth selects how the client logs in to Vault. Exactly one field must be set.
type Auth struct {
	Kubernetes *KubernetesAuth
	AppRole    *AppRoleAuth
	Token      *TokenAuth
}

// KubernetesAuth logs in through Vault's Kubernetes auth method.
type KubernetesAuth struct {
	// Mount is where the auth method is enabled. Default "kubernetes".
	Mount string
	// Role is the Vault role to log in as.
	Role string
	// JWT returns a service-account token for the login, typically a fresh one obtained through
	// the TokenRequest API. It is called once per login.
	JWT func(ctx context.Context) (string, error)
	// Audiences and TokenExpiration describe what JWT requests; they are part of Key, so that
	// changing them gives a new client.
	Audiences       []string
	TokenExpiration time.Duration
}

// AppRoleAuth logs in through Vault's AppRole auth method.
type AppRoleAuth struct {
	// Mount is where the auth method is enabled. Default "approle".
	Mount    string
	RoleID   string
	SecretID string
}

// TokenAuth uses a static Vault token. The client renews it while Vault allows, but cannot
// obtain a new one.
type TokenAuth struct {
	Token string
}

// RateLimit is a token bucket: QPS requests per second on average, up to Burst at once.
// The zero value means DefaultQPS and DefaultBurst.
type RateLimit struct {
	QPS   float64
	Burst int
}

// method names the configured auth method ("kubernetes", "approle" or "token").
func (a Auth) method() string {
	switch {
	case a.Kubernetes != nil:
		return "kubernetes"
	case a.AppRole != nil:
		return "approle"
	case a.Token != nil:
		return "token"
	}
	return ""
}

// withDefaults returns a copy of cfg with defaults applied, or an error saying what is invalid.
func (cfg Config) withDefaults() (Config, error) {
	if err := cfg.validate(); err != nil {
		return cfg, &Error{Op: opConfigure, Class: ClassInvalidConfig, detail: err.Error()}
	}
	cfg.Address = strings.TrimRight(cfg.Address, "/")
	cfg.Namespace = strings.Trim(cfg.Namespace, "/")
	cfg.Auth = cfg.Auth.withDefaults()
	if cfg.RateLimit.QPS == 0 && cfg.RateLimit.Burst == 0 {
		cfg.RateLimit = RateLimit{QPS: DefaultQPS, Burst: DefaultBurst}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return cfg, nil
}

func (a Auth) withDefaults() Auth {
	switch {
	case a.Kubernetes != nil:
		k := *a.Kubernetes
		k.Mount = mountOr(k.Mount, defaultKubernetesMount)
		a.Kubernetes = &k
	case a.AppRole != nil:
		r := *a.AppRole
		r.Mount = mountOr(r.Mount, defaultAppRoleMount)
		a.AppRole = &r
	}
	return a
}

func mountOr(mount, def string) string {
	if m := strings.Trim(mount, "/"); m != "" {
		return m
	}
	return def
}

func (cfg Config) validate() error {
	u, err := url.Parse(cfg.Address)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("address must be an http:// or https:// URL with a host")
	}
	if u.User != nil {
		return errors.New("address must not hold user information")
	}
	if cfg.RateLimit.QPS < 0 || cfg.RateLimit.Burst < 0 || (cfg.RateLimit.QPS > 0) != (cfg.RateLimit.Burst > 0) {
		return errors.New("rate limit: qps and burst must both be positive (or both zero for the defaults)")
	}
	return cfg.Auth.validate()
}

func (a Auth) validate() error {
	n := 0
	for _, set := range []bool{a.Kubernetes != nil, a.AppRole != nil, a.Token != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("auth: set exactly one of kubernetes, appRole or token")
	}
	switch {
	case a.Kubernetes != nil && (a.Kubernetes.Role == "" || a.Kubernetes.JWT == nil):
		return errors.New("auth.kubernetes: role and a service-account token source are required")
	case a.AppRole != nil && (a.AppRole.RoleID == "" || a.AppRole.SecretID == ""):
		return errors.New("auth.appRole: roleID and secretID are required")
	case a.Token != nil && a.Token.Token == "":
		return errors.New("auth.token: the token is empty")
	}
	return nil
}

// tlsConfig verifies the server against CABundle (or the system pool) and TLSServerName.
func (cfg Config) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.TLSServerName}
	if len(cfg.CABundle) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CABundle) {
			return nil, &Error{Op: opConfigure, Class: ClassInvalidConfig, detail: "caBundle holds no PEM certificate"}
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// Key identifies the connection and login that cfg describes: address, CA bundle, server name,
// namespace, rate limit, timeout, auth method and its parameters, with secret material
// (secret ID, token) hashed in, so that a changed secret yields a different key. The key itself
// reveals nothing of the secrets. A Kubernetes token source is not part of the key (its audiences
// and token lifetime are).
func (cfg Config) Key() string {
	h := sha256.New()
	field := func(name, value string) {
		writeField(h, name, value)
	}
	field("address", strings.TrimRight(cfg.Address, "/"))
	field("ca", hashBytes(cfg.CABundle))
	field("servername", cfg.TLSServerName)
	field("namespace", strings.Trim(cfg.Namespace, "/"))
	field("ratelimit", strconv.FormatFloat(cfg.RateLimit.QPS, 'g', -1, 64)+"/"+strconv.Itoa(cfg.RateLimit.Burst))
	field("timeout", cfg.Timeout.String())
	a := cfg.Auth.withDefaults()
	field("method", a.method())
	switch {
	case a.Kubernetes != nil:
		field("mount", a.Kubernetes.Mount)
		field("role", a.Kubernetes.Role)
		field("audiences", strings.Join(a.Kubernetes.Audiences, ","))
		field("tokenexpiration", a.Kubernetes.TokenExpiration.String())
	case a.AppRole != nil:
		field("mount", a.AppRole.Mount)
		field("roleid", hashBytes([]byte(a.AppRole.RoleID)))
		field("secretid", hashBytes([]byte(a.AppRole.SecretID)))
	case a.Token != nil:
		field("token", hashBytes([]byte(a.Token.Token)))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeField writes a length-prefixed name and value, so that no two field lists collide.
func writeField(h hash.Hash, name, value string) {
	fmt.Fprintf(h, "%d:%s=%d:%s;", len(name), name, len(value), value)
}

func hashBytes(b []byte) string {
	sum := sha256.Sum256(append([]byte("keyroll/vault/"), b...))
	return hex.EncodeToString(sum[:])
}

// String shows the mount and nothing of the role ID or secret ID.
func (a AppRoleAuth) String() string {
	return "AppRoleAuth{Mount: " + a.Mount + ", RoleID: " + redacted + ", SecretID: " + redacted + "}"
}

// GoString keeps %#v from printing the secret ID.
func (a AppRoleAuth) GoString() string { return a.String() }

// MarshalLog keeps logr from printing the secret ID.
func (a AppRoleAuth) MarshalLog() any { return a.String() }

// String shows nothing of the token.
func (a TokenAuth) String() string { return "TokenAuth{Token: " + redacted + "}" }

// GoString keeps %#v from printing the token.
func (a TokenAuth) GoString() string { return a.String() }

// MarshalLog keeps logr from printing the token.
func (a TokenAuth) MarshalLog() any { return a.String() }
