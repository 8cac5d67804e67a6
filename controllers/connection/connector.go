// Package connection turns VaultConnections into Vault clients: one shared client (one login, one
// rate limit, one token store) per VaultConnection, handed to each RedisCluster confined to what
// its namespace may do (tenancy.go), and settings that would hand the manager's power to
// a VaultConnection's writer refused before anything is sent.
package connection

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/vault"
)

// Connector turns VaultConnections into Vault clients. Clients come from a shared cache, so that
// every RedisCluster behind one VaultConnection shares one login and one rate limit.
type Connector struct {
	// Reader reads the Secrets a VaultConnection refers to. They carry no keyroll label, so the
	// manager's label-filtered cache does not hold them: this is the uncached API reader.
	Reader client.Reader
	// Tokens requests service-account tokens for Kubernetes auth (TokenRequest API).
	Tokens kubernetes.Interface
	// ServiceAccount is the operator's own service account, which logs in to Vault.
	ServiceAccount types.NamespacedName
	// Writer writes the Secrets that keep each VaultConnection's Vault tokens, in TokenNamespace
	// (the operator's own namespace); without a namespace, tokens are not persisted.
	Writer         client.Client
	TokenNamespace string
	// SecretNamespace is the only namespace whose Secrets a VaultConnection may name (its
	// token, secret ID and CA Secrets); empty: TokenNamespace.
	SecretNamespace string
	// Intents records each issue before it is made (nil: none are recorded).
	Intents *Intents
	// Clients hands out one Vault client per VaultConnection: NewClients, or fakes in tests.
	Clients Clients
	Clock   clock.Clock
	// Observer, when set, sees every Vault request, with the name of its VaultConnection.
	Observer func(connection, op, outcome string, seconds float64)

	audiences audienceChecks
	shared    sharedLimits
}

// Client is what the controllers use of a Vault client: leases for RedisClusters; login, health
// and tokens for VaultConnections. *vault.Client is one, and so is vaulttest.Fake.
type Client interface {
	vault.LeaseClient
	vault.ConnectionClient
}

// Clients hands out the Vault client of each VaultConnection for its settings, a new one when
// they change, and drops it when the VaultConnection is gone.
type Clients interface {
	Get(name string, cfg vault.Config) (Client, error)
	Forget(name string)
}

// NewClients is Clients on a vault.Cache: real Vault clients, one per VaultConnection.
func NewClients() Clients { return cacheClients{vault.NewCache()} }

type cacheClients struct{ cache *vault.Cache }

func (c cacheClients) Get(name string, cfg vault.Config) (Client, error) {
	cl, err := c.cache.Get(name, cfg)
	if err != nil {
		return nil, err // not a nil *vault.Client in a non-nil interface
	}
	return cl, nil
}

func (c cacheClients) Forget(name string) { c.cache.Forget(name) }

// Client returns the Vault client of a VaultConnection itself: its health and, with identity
// Operator, the login every namespace shares. With identity Namespace it never logs in.
func (c *Connector) Client(ctx context.Context, vc *v1beta1.VaultConnection) (Client, error) {
	return c.clientIn(ctx, vc, "")
}

// NamespaceClient is the Vault client of a VaultConnection for RedisClusters of namespace: with
// identity Namespace, one of that namespace's own, which logs in with the namespace's service
// account and keeps its tokens apart; with identity Operator, the connection's (Client).
func (c *Connector) NamespaceClient(ctx context.Context, vc *v1beta1.VaultConnection, namespace string) (Client, error) {
	if !vc.NamespaceIdentity() {
		namespace = ""
	}
	return c.clientIn(ctx, vc, namespace)
}

func (c *Connector) clientIn(ctx context.Context, vc *v1beta1.VaultConnection, namespace string) (Client, error) {
	cfg, err := c.config(ctx, vc, namespace)
	if err != nil {
		return nil, err
	}
	return c.Clients.Get(c.shared.key(vc.Name, namespace), cfg)
}

// Refusal says why a RedisCluster has no Vault client: the reason of its condition, and a message
// that names what to fix.
type Refusal struct{ Reason, Message string }

// Use is what a RedisCluster asks of a VaultConnection.
type Use struct {
	// Connection is the VaultConnection's name, and Field the spec field that names it.
	Connection, Field string
	// Namespace is the RedisCluster's.
	Namespace string
	// Path is the Vault path the RedisCluster issues credentials from, and PathField its field;
	// empty when it issues none itself (ExternalSecret mode, deletion).
	Path, PathField string
	// Delete says only revocations are to come: a namespace that is no longer allowed may still
	// have the leases revoked that lie under its allowed paths (see ForNamespace).
	Delete bool
}

// ClientFor is the Vault client of the VaultConnection u names (read through r) for a RedisCluster,
// confined to what its namespace may do (ForNamespace); or why there is none, decided before any
// Vault call.
func (c *Connector) ClientFor(ctx context.Context, r client.Reader, u Use) (vault.LeaseClient, *Refusal, error) {
	vc := &v1beta1.VaultConnection{}
	if err := r.Get(ctx, client.ObjectKey{Name: u.Connection}, vc); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, nil, fmt.Errorf("reading VaultConnection %s: %w", u.Connection, err)
		}
		return nil, &Refusal{v1beta1.ReasonConnectionNotFound, fmt.Sprintf("VaultConnection %q (%s) does not exist", u.Connection, u.Field)}, nil
	}
	if !u.Delete && !vc.AllowsNamespace(u.Namespace) {
		return nil, &Refusal{v1beta1.ReasonNamespaceNotAllowed, fmt.Sprintf("VaultConnection %q does not allow namespace %q (spec.allowedNamespaces)", u.Connection, u.Namespace)}, nil
	}
	if u.Path != "" && !vc.AllowsPath(u.Namespace, u.Path) {
		return nil, &Refusal{v1beta1.ReasonPathNotAllowed, fmt.Sprintf("%s %q: %s", u.PathField, u.Path, PathRefusal(vc, u.Namespace))}, nil
	}
	vcl, err := c.NamespaceClient(ctx, vc, u.Namespace)
	if err != nil {
		return nil, &Refusal{v1beta1.ReasonConnectionNotReady, fmt.Sprintf("VaultConnection %q cannot be used: %v", u.Connection, err)}, nil
	}
	t := forNamespace(vcl, vc, u.Namespace)
	t.turns = c.shared.rotationTurns(vc.Name, rateLimitOf(vc), c.clock())
	return t, nil, nil
}

func (c *Connector) clock() clock.PassiveClock {
	if c.Clock == nil {
		return clock.RealClock{}
	}
	return c.Clock
}

// ClientOf is the Vault client of the VaultConnection name (read through r) for the leases of a
// RedisCluster of namespace that came through it, confined to what the namespace may do there
// (ForNamespace).
func (c *Connector) ClientOf(ctx context.Context, r client.Reader, name, namespace string) (vault.LeaseClient, error) {
	vc := &v1beta1.VaultConnection{}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, vc); err != nil {
		return nil, fmt.Errorf("reading VaultConnection %s: %w", name, err)
	}
	vcl, err := c.NamespaceClient(ctx, vc, namespace)
	if err != nil {
		return nil, err
	}
	return ForNamespace(vcl, vc, namespace), nil
}

// Forget drops the clients of a deleted VaultConnection, its namespaces' included.
func (c *Connector) Forget(name string) {
	for _, key := range c.shared.forget(name) {
		c.Clients.Forget(key)
	}
}

// rateLimitOf is vc's spec.rateLimit (the zero value, the defaults, when unset).
func rateLimitOf(vc *v1beta1.VaultConnection) vault.RateLimit {
	if rl := vc.Spec.RateLimit; rl != nil {
		return vault.RateLimit{QPS: float64(rl.QPS), Burst: int(rl.Burst)}
	}
	return vault.RateLimit{}
}

// config is the Vault client configuration of vc for namespace ("": the connection's own).
func (c *Connector) config(ctx context.Context, vc *v1beta1.VaultConnection, namespace string) (vault.Config, error) {
	spec := vc.Spec
	log := ctrl.Log.WithName("vault").WithValues("vaultConnection", vc.Name)
	if namespace != "" {
		log = log.WithValues("identityNamespace", namespace)
	}
	// Not the reconcile's logger: the client outlives the reconcile that created it and serves
	// every RedisCluster behind this connection (or its namespace).
	cfg := vault.Config{Address: spec.Address, Namespace: spec.Namespace, Clock: c.Clock, Logger: log}
	if c.Observer != nil {
		name := vc.Name // the client outlives vc, which its caller goes on using
		cfg.Observer = func(op, outcome string, d time.Duration) { c.Observer(name, op, outcome, d.Seconds()) }
	}
	if c.TokenNamespace != "" && c.Writer != nil {
		cfg.Tokens = newTokenStore(c.Writer, c.Reader, c.TokenNamespace, vc, namespace)
	}
	cfg.RateLimit = rateLimitOf(vc)
	if vc.NamespaceIdentity() {
		// One budget for the connection, however many namespaces log in through it.
		cfg.Limiter = c.shared.limiter(vc.Name, cfg.RateLimit)
	}
	if tls := spec.TLS; tls != nil {
		cfg.TLSServerName = tls.ServerName
		cfg.CABundle = []byte(tls.CABundle)
		if tls.CASecretRef != nil {
			ca, err := c.secretValue(ctx, *tls.CASecretRef, "tls.caSecretRef")
			if err != nil {
				return cfg, err
			}
			cfg.CABundle = ca
		}
	}
	auth, err := c.auth(ctx, vc, namespace)
	cfg.Auth = auth
	return cfg, err
}

func (c *Connector) auth(ctx context.Context, vc *v1beta1.VaultConnection, namespace string) (vault.Auth, error) {
	switch a := vc.Spec.Auth; {
	case a.Kubernetes != nil:
		k := a.Kubernetes
		role, sa := k.Role, c.ServiceAccount
		jwt := c.serviceAccountToken(sa, k.Audiences, k.TokenExpirationSeconds)
		switch {
		case vc.NamespaceIdentity() && namespace == "": // the connection's own client: health only, never a login
			jwt = func(context.Context) (string, error) {
				return "", errors.New("identity Namespace: the connection itself never logs in, each namespace does")
			}
		case vc.NamespaceIdentity():
			role, sa = strings.ReplaceAll(k.Role, v1beta1.NamespacePlaceholder, namespace), types.NamespacedName{Namespace: namespace, Name: k.ServiceAccountName}
			jwt = c.serviceAccountToken(sa, k.Audiences, k.TokenExpirationSeconds)
		}
		return vault.Auth{Kubernetes: &vault.KubernetesAuth{Mount: k.Mount, Role: role, JWT: jwt,
			Audiences: k.Audiences, TokenExpiration: time.Duration(k.TokenExpirationSeconds) * time.Second}}, nil
	case a.AppRole != nil:
		id, err := c.secretValue(ctx, a.AppRole.SecretIDRef, "auth.appRole.secretIDRef")
		if err != nil {
			return vault.Auth{}, err
		}
		return vault.Auth{AppRole: &vault.AppRoleAuth{Mount: a.AppRole.Mount, RoleID: a.AppRole.RoleID, SecretID: string(id)}}, nil
	case a.Token != nil:
		tok, err := c.secretValue(ctx, a.Token.SecretRef, "auth.token.secretRef")
		if err != nil {
			return vault.Auth{}, err
		}
		return vault.Auth{Token: &vault.TokenAuth{Token: string(tok)}}, nil
	}
	return vault.Auth{}, errors.New("auth: no method set")
}

// serviceAccountToken returns a token source for a service account: the operator's own, or with
// identity Namespace the namespace's. Each token is reviewed before it is handed out: one the API
// server accepts is refused (refuseAPIToken).
func (c *Connector) serviceAccountToken(sa types.NamespacedName, audiences []string, seconds int64) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}
		if seconds > 0 {
			tr.Spec.ExpirationSeconds = &seconds
		}
		out, err := c.Tokens.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, tr, metav1.CreateOptions{})
		if err != nil {
			return "", fmt.Errorf("requesting a token for service account %s: %w", sa, err)
		}
		if err := c.refuseAPIToken(ctx, out.Status.Token, audiences); err != nil {
			return "", err
		}
		return out.Status.Token, nil
	}
}

// secretValue reads one key of a Secret. Errors name the field and the Secret, never the value.
func (c *Connector) secretValue(ctx context.Context, ref v1beta1.SecretKeyReference, field string) ([]byte, error) {
	if err := c.checkSecretRef(ref, field); err != nil {
		return nil, err
	}
	s := &corev1.Secret{}
	key := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	if err := c.Reader.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%s: Secret %s not found", field, key)
		}
		return nil, fmt.Errorf("%s: reading Secret %s: %w", field, key, err)
	}
	v, ok := s.Data[ref.Key]
	if !ok || len(v) == 0 {
		return nil, fmt.Errorf("%s: Secret %s has no key %q", field, key, ref.Key)
	}
	return v, nil
}
