package vault

import (
	"context"
	"fmt"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
)

// login logs in with the configured auth method and makes the new token current. The previous
// token is left to expire, not revoked: revoking it would revoke the leases it issued.
func (c *client) login(ctx context.Context) error {
	path, body, err := c.loginRequest(ctx)
	if err != nil {
		return err
	}
	var s *vaultapi.Secret
	err = c.call(ctx, opLogin, path, false, func(ctx context.Context) (err error) {
		s, err = c.put(ctx, c.loginAPI, path, body)
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
	c.update(func(t *tokenState) {
		*t = tokenState{
			token: s.Auth.ClientToken, issuedAt: now, refreshedAt: now, ttl: ttl, loginTTL: ttl,
			renewable: s.Auth.Renewable, policies: s.Auth.Policies,
			logins: t.logins + 1, renewals: t.renewals, lastRenewal: t.lastRenewal, maxTTL: t.maxTTL,
		}
		if t.maxTTL > 0 && ttl > 0 {
			t.maxExpires = now.Add(max(t.maxTTL, ttl))
		}
	})
	c.log.Info("Logged in to Vault", "path", path, "ttl", ttl, "renewable", s.Auth.Renewable,
		"policies", s.Auth.Policies)
	return nil
}

// loginRequest returns the login path and body of the configured auth method.
func (c *client) loginRequest(ctx context.Context) (string, map[string]any, error) {
	switch a := c.cfg.Auth; {
	case a.Kubernetes != nil:
		path := "auth/" + a.Kubernetes.Mount + "/login"
		jwt, err := a.Kubernetes.JWT(ctx)
		if err != nil {
			e := newError(opLogin, path, err, c.secrets)
			e.Class = classifyTokenSource(err)
			e.detail = "obtaining a service-account token: " + e.detail
			return "", nil, e
		}
		if jwt == "" {
			return "", nil, &Error{Op: opLogin, Path: path, Class: ClassInvalidConfig, detail: "the service-account token is empty"}
		}
		c.secrets.add(jwt)
		return path, map[string]any{"role": a.Kubernetes.Role, "jwt": jwt}, nil
	case a.AppRole != nil:
		return "auth/" + a.AppRole.Mount + "/login", map[string]any{"role_id": a.AppRole.RoleID, "secret_id": a.AppRole.SecretID}, nil
	}
	return "", nil, &Error{Op: opLogin, Class: ClassInvalidConfig, detail: "a static token cannot log in"}
}

// classifyTokenSource classifies a failure of the caller's service-account token source:
// context errors as such, anything else as a transient failure worth trying again later.
func classifyTokenSource(err error) string {
	if c := classify(err); c == ClassCanceled {
		return c
	}
	return ClassUnavailable
}

// lookupSelf learns the TTL, renewability and policies of a static token. A token whose
// policies forbid looking itself up is assumed not to expire.
func (c *client) lookupSelf(ctx context.Context) error {
	token := c.cfg.Auth.Token.Token
	c.update(func(t *tokenState) { t.token = token })
	var s *vaultapi.Secret
	err := c.call(ctx, opLookupSelf, "auth/token/lookup-self", false, func(ctx context.Context) (err error) {
		s, err = c.get(ctx, c.api, "auth/token/lookup-self")
		return err
	})
	now := c.clock.Now()
	if IsPermissionDenied(err) && !invalidToken(err) {
		c.log.V(1).Info("Cannot look up the Vault token, assuming it does not expire")
		c.update(func(t *tokenState) {
			*t = tokenState{token: token, issuedAt: now, refreshedAt: now, final: true, logins: t.logins + 1}
		})
		return nil
	}
	if err != nil {
		c.update(func(t *tokenState) { t.token = "" })
		return err
	}
	if s == nil || s.Data == nil {
		c.update(func(t *tokenState) { t.token = "" })
		return &Error{Op: opLookupSelf, Class: ClassUnknown, detail: "the response holds no token information"}
	}
	c.update(func(t *tokenState) { *t = staticTokenState(token, s.Data, now, t.logins+1) })
	st := c.state()
	c.log.Info("Looked up the Vault token", "ttl", st.ttl, "renewable", st.renewable, "policies", st.policies)
	return nil
}

func staticTokenState(token string, d map[string]any, now time.Time, logins int) tokenState {
	s := tokenState{
		token: token, issuedAt: now, refreshedAt: now, logins: logins,
		ttl:       durationValue(d["ttl"]),
		loginTTL:  durationValue(d["creation_ttl"]),
		renewable: d["renewable"] == true,
	}
	if s.loginTTL <= 0 {
		s.loginTTL = s.ttl
	}
	if explicitMax := durationValue(d["explicit_max_ttl"]); explicitMax > 0 {
		if issued := timeValue(d["issue_time"]); !issued.IsZero() {
			s.maxExpires = issued.Add(explicitMax)
		}
	}
	if ps, ok := d["policies"].([]any); ok {
		for _, p := range ps {
			s.policies = append(s.policies, fmt.Sprint(p))
		}
	}
	return s
}
