package vault

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	"github.com/hashicorp/vault/api/auth/approle"
	"github.com/hashicorp/vault/api/auth/kubernetes"
)

// login logs in with the configured auth method and makes the new token current, once the token
// store holds it. The previous token is kept, not revoked: revoking it would revoke the leases it
// created, and it is kept alive while they may be live (KeepTokens).
func (c *Client) login(ctx context.Context) error {
	method, path, err := c.loginMethod(ctx)
	if err != nil {
		return err
	}
	var s *vaultapi.Secret
	_, err = c.call(ctx, opLogin, path, noToken, func(ctx context.Context, _ *heldToken) (err error) {
		// Not c.loginAPI.Auth().Login: that would set the new token on the login client.
		s, err = method.Login(ctx, c.loginAPI)
		return err
	})
	if err != nil {
		return err
	}
	if s == nil || s.Auth == nil || s.Auth.ClientToken == "" {
		return &Error{Op: opLogin, Path: path, Class: ClassUnknown, detail: "the response holds no token"}
	}
	c.secrets.add(s.Auth.ClientToken)
	now := c.clock.Now()
	ttl := seconds(s.Auth.LeaseDuration)
	st := tokenState{
		token: s.Auth.ClientToken, accessor: accessorOf(s.Auth.Accessor, s.Auth.ClientToken),
		issuedAt: now, refreshedAt: now, ttl: ttl, loginTTL: ttl,
		renewable: s.Auth.Renewable, policies: s.Auth.Policies,
	}
	c.mu.RLock()
	if learned := c.learnedMaxTTL; learned > 0 && ttl > 0 {
		st.maxExpires = now.Add(max(learned, ttl))
	}
	c.mu.RUnlock()
	h, err := c.hold(st)
	if err != nil {
		return err
	}
	// Persisted before it creates anything: a lease it creates must survive this process.
	if err := c.saveTokens(ctx, map[string]string{st.accessor: st.token}); err != nil {
		return &Error{Op: opLogin, Path: path, Class: ClassUnavailable, detail: "the token store refused the new token: " + redactMessages([]string{err.Error()}, c.secrets)[0]}
	}
	c.mu.Lock()
	c.held[st.accessor], c.cur = h, h
	c.logins++
	c.mu.Unlock()
	c.log.Info("Logged in to Vault", "path", path, "accessor", st.accessor, "ttl", ttl, "renewable", s.Auth.Renewable,
		"policies", s.Auth.Policies)
	return nil
}

// hold wraps a token state with an API client that carries the token.
func (c *Client) hold(st tokenState) (*heldToken, error) {
	ac, err := c.newAPIClient()
	if err != nil {
		return nil, err
	}
	ac.SetToken(st.token)
	return &heldToken{tokenState: st, api: ac}, nil
}

// accessorOf is the token's accessor, or, where Vault gave none, a name derived from the token
// that reveals nothing of it.
func accessorOf(accessor, token string) string {
	if accessor != "" {
		return accessor
	}
	sum := sha256.Sum256([]byte("keyroll/vault/accessor/" + token))
	return "sha256-" + hex.EncodeToString(sum[:12])
}

// loginMethod returns vault/api's login for the configured auth method, and the path it logs in
// at. A Kubernetes login gets a fresh service-account token from the caller's source.
func (c *Client) loginMethod(ctx context.Context) (vaultapi.AuthMethod, string, error) {
	var (
		method vaultapi.AuthMethod
		path   string
		err    error
	)
	switch a := c.cfg.Auth; {
	case a.Kubernetes != nil:
		path = "auth/" + a.Kubernetes.Mount + "/login"
		var jwt string
		if jwt, err = c.serviceAccountToken(ctx, path); err != nil {
			return nil, path, err
		}
		method, err = kubernetes.NewKubernetesAuth(a.Kubernetes.Role,
			kubernetes.WithServiceAccountToken(jwt), kubernetes.WithMountPath(a.Kubernetes.Mount))
	case a.AppRole != nil:
		path = "auth/" + a.AppRole.Mount + "/login"
		method, err = approle.NewAppRoleAuth(a.AppRole.RoleID, &approle.SecretID{FromString: a.AppRole.SecretID},
			approle.WithMountPath(a.AppRole.Mount))
	default:
		return nil, "", &Error{Op: opLogin, Class: ClassInvalidConfig, detail: "a static token cannot log in"}
	}
	if err != nil {
		return nil, path, &Error{Op: opLogin, Path: path, Class: ClassInvalidConfig, detail: "setting up the login: " + c.secrets.redact(err.Error())}
	}
	return method, path, nil
}

// serviceAccountToken obtains a service-account token for a Kubernetes login from the caller's
// source, and remembers it as a secret. An empty token is refused: vault/api would read the
// pod's mounted token instead.
func (c *Client) serviceAccountToken(ctx context.Context, path string) (string, error) {
	jwt, err := c.cfg.Auth.Kubernetes.JWT(ctx)
	if err != nil {
		e := newError(opLogin, path, err, c.secrets)
		e.Class = classifyTokenSource(err)
		e.detail = "obtaining a service-account token: " + e.detail
		return "", e
	}
	if jwt == "" {
		return "", &Error{Op: opLogin, Path: path, Class: ClassInvalidConfig, detail: "the service-account token is empty"}
	}
	c.secrets.add(jwt)
	return jwt, nil
}

// classifyTokenSource classifies a failure of the caller's service-account token source:
// context errors as such, anything else as a transient failure worth trying again later.
func classifyTokenSource(err error) string {
	if c := classify(err); c == ClassCanceled {
		return c
	}
	return ClassUnavailable
}

// lookupStatic learns the TTL, renewability and policies of the static token and makes it
// current. A token whose policies forbid looking itself up is assumed not to expire.
func (c *Client) lookupStatic(ctx context.Context) error {
	token := c.cfg.Auth.Token.Token
	h, err := c.hold(tokenState{token: token, accessor: accessorOf("", token)})
	if err != nil {
		return err
	}
	now := c.clock.Now()
	data, err := c.lookupSelf(ctx, h)
	switch {
	case IsPermissionDenied(err) && !invalidToken(err):
		c.log.V(1).Info("Cannot look up the Vault token, assuming it does not expire")
		h.tokenState = tokenState{token: token, accessor: h.accessor, issuedAt: now, refreshedAt: now, final: true}
	case err != nil:
		return err
	default:
		h.tokenState = lookedUpState(token, data, now)
	}
	c.mu.Lock()
	c.held, c.cur = map[string]*heldToken{h.accessor: h}, h
	c.logins++
	c.mu.Unlock()
	c.log.Info("Looked up the Vault token", "ttl", h.ttl, "renewable", h.renewable, "policies", h.policies)
	return nil
}

// lookupSelf reads what Vault knows of a held token, with that token.
func (c *Client) lookupSelf(ctx context.Context, h *heldToken) (map[string]any, error) {
	var s *vaultapi.Secret
	_, err := c.call(ctx, opLookupSelf, "auth/token/lookup-self", noToken, func(ctx context.Context, _ *heldToken) (err error) {
		s, err = h.api.Auth().Token().LookupSelfWithContext(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	if s == nil || s.Data == nil {
		return nil, &Error{Op: opLookupSelf, Class: ClassUnknown, detail: "the response holds no token information"}
	}
	return s.Data, nil
}

// lookedUpState is the state of a token as auth/token/lookup-self describes it.
func lookedUpState(token string, d map[string]any, now time.Time) tokenState {
	s := tokenState{
		token: token, accessor: accessorOf(stringValue(d["accessor"]), token),
		issuedAt: now, refreshedAt: now,
		ttl:       durationValue(d["ttl"]),
		loginTTL:  durationValue(d["creation_ttl"]),
		renewable: d["renewable"] == true,
	}
	if issued := timeValue(d["issue_time"]); !issued.IsZero() {
		s.issuedAt = issued
	}
	if s.loginTTL <= 0 {
		s.loginTTL = s.ttl
	}
	if explicitMax := durationValue(d["explicit_max_ttl"]); explicitMax > 0 {
		s.maxExpires = s.issuedAt.Add(explicitMax)
	}
	if ps, ok := d["policies"].([]any); ok {
		for _, p := range ps {
			s.policies = append(s.policies, fmt.Sprint(p))
		}
	}
	return s
}
