package vault

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	vaultapi "github.com/hashicorp/vault/api"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

var (
	_ LeaseClient      = (*Client)(nil)
	_ ConnectionClient = (*Client)(nil)
)

// Client is the Vault client of one connection and login; it implements LeaseClient and
// ConnectionClient, and is safe for concurrent use.
//
// A call makes one request to Vault, after the rate limiter lets it through, and fails at once
// with a classified error when Vault cannot serve it: it does not retry, so that no caller waits
// on a failing Vault; the caller tries again later (a workqueue's backoff, a requeue). The only
// second request is made when Vault calls the client's token invalid: the client logs in once
// more and repeats the request with the new token. Before a call the client may renew its token
// or log in again, as the token's life requires (see KeepTokens).
type Client struct {
	cfg      Config
	loginAPI *vaultapi.Client // no token: logins and sys/health
	http     *http.Client
	clock    clock.Clock
	log      logr.Logger
	limiter  *rate.Limiter // shared by every API client of this Client
	secrets  *redactor

	authSem chan struct{} // held while logging in, renewing tokens or loading the token store
	// unanswered fails requests at once for a moment after Vault left one unanswered.
	unanswered *unanswered

	mu            sync.RWMutex
	cur           *heldToken            // the token new work uses; nil before the first login
	held          map[string]*heldToken // every token held, by accessor, the current one included
	learnedMaxTTL time.Duration         // learned from a capped renewal; applies to later logins
	storeLoaded   bool                  // the token store has been read
	logins        int
	renewals      int
}

// New returns a client for cfg. It does not contact Vault: the first call (or Login) logs in.
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	hc, err := newHTTPClient(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Limiter == nil {
		cfg.Limiter = rate.NewLimiter(rate.Limit(cfg.RateLimit.QPS), cfg.RateLimit.Burst)
	}
	c := &Client{
		cfg:        cfg,
		http:       hc,
		clock:      cfg.Clock,
		log:        cfg.Logger.WithValues("vaultAddress", cfg.Address, "authMethod", cfg.Auth.method()),
		limiter:    cfg.Limiter,
		secrets:    newRedactor(),
		authSem:    make(chan struct{}, 1),
		unanswered: &unanswered{clock: cfg.Clock},
		held:       map[string]*heldToken{},
	}
	c.rememberConfigSecrets()
	if c.loginAPI, err = c.newAPIClient(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Client) rememberConfigSecrets() {
	switch a := c.cfg.Auth; {
	case a.AppRole != nil:
		c.secrets.add(a.AppRole.SecretID, a.AppRole.RoleID)
	case a.Token != nil:
		c.secrets.add(a.Token.Token)
	}
}

func newHTTPClient(cfg Config) (*http.Client, error) {
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   10 * time.Second,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          32,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &http.Client{Transport: tr}, nil
}

// newAPIClient builds a Vault API client that carries no token, never retries (a failure goes
// back to the caller), has no timeout of its own (the call's context carries one), waits for the
// client's rate limiter before each request, and ignores VAULT_TOKEN and VAULT_NAMESPACE from
// the environment.
func (c *Client) newAPIClient() (*vaultapi.Client, error) {
	ac, err := vaultapi.NewClient(&vaultapi.Config{
		Address:    c.cfg.Address,
		HttpClient: c.http,
		MaxRetries: 0,
		CheckRetry: func(context.Context, *http.Response, error) (bool, error) { return false, nil },
		Limiter:    c.limiter,
	})
	if err != nil {
		return nil, &Error{Op: opConfigure, Class: ClassInvalidConfig, detail: "creating the vault api client"}
	}
	ac.ClearToken()
	if c.cfg.Namespace != "" {
		ac.SetNamespace(c.cfg.Namespace)
	} else {
		ac.ClearNamespace()
	}
	return ac, nil
}

// String names the connection, never the credentials.
func (c *Client) String() string {
	return "vault.Client{address: " + c.cfg.Address + ", auth: " + c.cfg.Auth.method() + "}"
}

// GoString keeps %#v from printing the client's fields.
func (c *Client) GoString() string { return c.String() }

// MarshalLog keeps logr from printing the client's fields.
func (c *Client) MarshalLog() any { return c.String() }

// closeIdleConnections releases the connections kept for reuse.
func (c *Client) closeIdleConnections() { c.http.CloseIdleConnections() }

// withTimeout bounds a call by Config.Timeout, or by the context's own deadline if it is sooner.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.cfg.Timeout)
}

// Issue reads path and returns the credential and its lease.
func (c *Client) Issue(ctx context.Context, path string) (*Lease, error) {
	path = strings.Trim(path, "/")
	if path == "" {
		return nil, &Error{Op: opIssue, Class: ClassBadRequest, detail: "empty path"}
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	var s *vaultapi.Secret
	h, err := c.call(ctx, opIssue, path, issueToken, func(ctx context.Context, h *heldToken) (err error) {
		s, err = readSecret(ctx, h.api, path)
		return err
	})
	if err != nil {
		return nil, err
	}
	c.noteIssue(h)
	if s == nil {
		return nil, &Error{Op: opIssue, Path: path, Class: ClassNotFound, detail: "the path holds nothing"}
	}
	if s.LeaseID == "" {
		return nil, &Error{Op: opIssue, Path: path, Class: ClassBadRequest, detail: "the path does not issue leased credentials"}
	}
	lease := c.newLease(s, h)
	c.log.V(1).Info("Issued credential", "path", path, "leaseID", lease.ID, "ttl", lease.Duration,
		"renewable", lease.Renewable, "tokenAccessor", lease.TokenAccessor, "outlivesToken", lease.OutlivesToken)
	return lease, nil
}

func (c *Client) newLease(s *vaultapi.Secret, h *heldToken) *Lease {
	now := c.clock.Now()
	l := &Lease{
		ID:        s.LeaseID,
		Duration:  seconds(s.LeaseDuration),
		Renewable: s.Renewable,
		Data:      make(SecretData, len(s.Data)),
		IssuedAt:  now,
		Warnings:  c.redactAll(s.Warnings),
	}
	l.ExpiresAt = now.Add(l.Duration)
	for k, v := range s.Data {
		l.Data[k] = stringValue(v)
		c.secrets.add(l.Data[k])
	}
	c.mu.RLock()
	l.TokenAccessor, l.TokenDeadline = h.accessor, h.deadline()
	c.mu.RUnlock()
	l.OutlivesToken = !l.TokenDeadline.IsZero() && l.ExpiresAt.After(l.TokenDeadline)
	return l
}

// Renew asks Vault to extend a lease by increment.
func (c *Client) Renew(ctx context.Context, leaseID string, increment time.Duration) (*Renewal, error) {
	if leaseID == "" {
		return nil, &Error{Op: opRenew, Class: ClassBadRequest, detail: "empty lease ID"}
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	asked := wholeSeconds(increment)
	var s *vaultapi.Secret
	_, err := c.call(ctx, opRenew, leaseID, currentToken, func(ctx context.Context, h *heldToken) (err error) {
		// The lease ID in the URL, not the body: a policy on sys/leases/renew/<prefix>* then
		// limits which leases the token may renew.
		s, err = h.api.Logical().WriteWithContext(ctx, "sys/leases/renew/"+leaseID, map[string]any{"increment": asked})
		return err
	})
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &Error{Op: opRenew, Path: leaseID, Class: ClassUnknown, detail: "empty response"}
	}
	r := &Renewal{
		Duration:  seconds(s.LeaseDuration),
		Renewable: s.Renewable,
		Warnings:  c.redactAll(s.Warnings),
	}
	r.ExpiresAt = c.clock.Now().Add(r.Duration)
	r.Capped = (asked > 0 && s.LeaseDuration < asked) || containsAny(s.Warnings, "capped", "exceeded the effective max_ttl")
	c.log.V(1).Info("Renewed lease", "leaseID", leaseID, "granted", r.Duration, "capped", r.Capped)
	return r, nil
}

// Health reports sys/health. It needs no token.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	var h *vaultapi.HealthResponse
	_, err := c.call(ctx, opHealth, "sys/health", noToken, func(ctx context.Context, _ *heldToken) (err error) {
		h, err = c.loginAPI.Sys().HealthWithContext(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := &Health{
		Initialized:        h.Initialized,
		Sealed:             h.Sealed,
		Standby:            h.Standby,
		PerformanceStandby: h.PerformanceStandby,
		Version:            h.Version,
		ClusterName:        h.ClusterName,
		Enterprise:         h.Enterprise,
	}
	if h.ServerTimeUTC > 0 {
		out.ServerTime = time.Unix(h.ServerTimeUTC, 0).UTC()
	}
	return out, nil
}

// readSecret reads a path with the given API client and parses the answer. Unlike
// Logical().Read, it keeps a 404 an error, so that a path that does not exist says so.
func readSecret(ctx context.Context, ac *vaultapi.Client, path string) (*vaultapi.Secret, error) {
	resp, err := ac.Logical().ReadRawWithContext(ctx, path)
	if resp != nil {
		defer resp.Body.Close()
	}
	if err != nil {
		return nil, err
	}
	return vaultapi.ParseSecret(resp.Body)
}

func (c *Client) redactAll(msgs []string) []string {
	if len(msgs) == 0 {
		return nil
	}
	return redactMessages(msgs, c.secrets)
}

func seconds(n int) time.Duration { return time.Duration(n) * time.Second }

// wholeSeconds rounds d up to whole seconds, as Vault counts them.
func wholeSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// stringValue renders one value of a secret's data as a string.
func stringValue(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case json.Number:
		return t.String()
	case bool:
		return strconv.FormatBool(t)
	case nil:
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

func durationValue(v any) time.Duration {
	n, err := strconv.ParseInt(stringValue(v), 10, 64)
	if err != nil {
		return 0
	}
	return time.Duration(n) * time.Second
}

func timeValue(v any) time.Time {
	s, ok := v.(string)
	if !ok || s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
