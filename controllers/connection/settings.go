package connection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// What a VaultConnection writer could otherwise make of the manager's power, refused before any
// request reaches spec.address:
//
//   - a Kubernetes-auth token for an audience the API server accepts would be a working API token
//     of the manager's service account, POSTed to whatever address the connection names. Every
//     token keyroll mints for Vault is checked with a TokenReview first, and one the API server
//     accepts is never sent;
//   - a Secret reference into any namespace would send any Secret of the cluster as a Vault token
//     or secret ID. VaultConnections may refer to Secrets of one namespace only, the operator's
//     (or the one its --vault-secrets-namespace names).

// SettingsError is a VaultConnection setting that keyroll refuses to use; Field names it.
type SettingsError struct{ Field, Message string }

func (e *SettingsError) Error() string { return e.Field + ": " + e.Message }

// audienceCheckValid is how long a set of audiences, once checked, is taken as safe.
const audienceCheckValid = time.Hour

// audienceChecks remembers the sets of audiences checked safe, and when.
type audienceChecks struct {
	mu sync.Mutex
	at map[string]time.Time
}

func audienceKey(audiences []string) string {
	s := slices.Clone(audiences)
	slices.Sort(s)
	return strings.Join(s, "\x00")
}

// CheckSettings refuses, before the VaultConnection's address is called at all, settings that
// would send the manager's API token there (see SettingsError). The Secret references are checked
// as each is read.
func (c *Connector) CheckSettings(ctx context.Context, vc *v1beta1.VaultConnection) error {
	if k := vc.Spec.Auth.Kubernetes; k != nil && c.Tokens != nil {
		return c.checkAudiences(ctx, k.Audiences, k.TokenExpirationSeconds)
	}
	return nil
}

// checkAudiences refuses audiences for which the API
// server accepts the manager's tokens: it mints one and reviews it (once an hour per set of
// audiences). serviceAccountToken reviews every token it mints as well.
func (c *Connector) checkAudiences(ctx context.Context, audiences []string, seconds int64) error {
	key := audienceKey(audiences)
	now := c.Clock.Now()
	c.audiences.mu.Lock()
	at, ok := c.audiences.at[key]
	c.audiences.mu.Unlock()
	if ok && now.Sub(at) < audienceCheckValid {
		return nil
	}
	if _, err := c.serviceAccountToken(c.ServiceAccount, audiences, seconds)(ctx); err != nil {
		return err
	}
	c.audiences.mu.Lock()
	defer c.audiences.mu.Unlock()
	if c.audiences.at == nil {
		c.audiences.at = map[string]time.Time{}
	}
	c.audiences.at[key] = now
	return nil
}

// refuseAPIToken reviews a freshly minted token with the API server's own audiences: a token
// the API server accepts is refused.
func (c *Connector) refuseAPIToken(ctx context.Context, token string, audiences []string) error {
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	out, err := c.Tokens.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("auth.kubernetes.audiences: reviewing the service-account token before it is sent to Vault: %w", err)
	}
	if out.Status.Authenticated {
		return &SettingsError{Field: "auth.kubernetes.audiences", Message: fmt.Sprintf(
			"the API server accepts a token for audiences %v: it would be an API token of the manager, and keyroll never sends one to Vault; use an audience of Vault's own (vault)", audiences)}
	}
	return nil
}

// secretNamespace is the namespace whose Secrets VaultConnections may refer to.
func (c *Connector) secretNamespace() string {
	if c.SecretNamespace != "" {
		return c.SecretNamespace
	}
	return c.TokenNamespace
}

// checkSecretRef refuses a Secret reference outside the namespace VaultConnections may use.
func (c *Connector) checkSecretRef(ref v1beta1.SecretKeyReference, field string) error {
	ns := c.secretNamespace()
	if ns == "" || ref.Namespace == ns {
		return nil
	}
	return &SettingsError{Field: field, Message: fmt.Sprintf(
		"Secret %s/%s is outside namespace %s: a VaultConnection may refer to Secrets of the operator's namespace only (--vault-secrets-namespace)", ref.Namespace, ref.Name, ns)}
}

// IsSettingsError says err is a refused setting (SettingsError).
func IsSettingsError(err error) bool {
	var s *SettingsError
	return errors.As(err, &s)
}
