package testground

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
)

// Vault is a Vault dev server (in memory, unsealed, loopback only) with a known root token.
type Vault struct {
	Addr string
	// PodAddr is Vault's address for pods on the real node (a proxy on the node's bridge), when
	// the ground runs one.
	PodAddr   string
	Port      int
	RootToken string
	// Root is a client logged in with the root token.
	Root    *vaultapi.Client
	proc    *Process
	logPath string
	dir     string
}

// StartVault starts `vault server -dev` on a free loopback port and waits until it is unsealed.
func StartVault(dir string) (*Vault, error) {
	bin, err := Binary("vault")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	v := &Vault{Port: port, Addr: fmt.Sprintf("http://127.0.0.1:%d", port), RootToken: "root-" + randomHex(12), dir: dir}
	args := []string{"server", "-dev", "-dev-root-token-id=" + v.RootToken,
		"-dev-listen-address=127.0.0.1:" + strconv.Itoa(port), "-dev-no-store-token"}
	// HOME keeps Vault's token helper and caches inside the test directory.
	v.proc, err = StartProcess(dir, fmt.Sprintf("vault-%d", port), bin, args, []string{"HOME=" + dir, "VAULT_LOG_LEVEL=warn"})
	if err != nil {
		return nil, err
	}
	v.logPath = v.proc.LogPath
	if v.Root, err = v.NewClient(v.RootToken); err != nil {
		v.Stop()
		return nil, err
	}
	if err := waitFor(v.proc, 30*time.Second, v.healthy); err != nil {
		v.Stop()
		return nil, err
	}
	return v, nil
}

func (v *Vault) healthy() error {
	resp, err := http.Get(v.Addr + "/v1/sys/health")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("vault health: %s", resp.Status)
	}
	return nil
}

// NewClient returns a Vault client for this server with the given token.
func (v *Vault) NewClient(token string) (*vaultapi.Client, error) {
	cfg := vaultapi.DefaultConfig()
	cfg.Address = v.Addr
	cfg.MaxRetries = 0
	c, err := vaultapi.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	c.SetToken(token)
	return c, nil
}

// Process is the Vault server process.
func (v *Vault) Process() *Process { return v.proc }

// Stop ends the server.
func (v *Vault) Stop() { v.proc.Stop() }

// RedisRole is a dynamic-credential role of the database secrets engine.
type RedisRole struct {
	Name       string
	ACLRules   []string // default: all keys, channels and commands
	DefaultTTL time.Duration
	MaxTTL     time.Duration
	// Connection is the database engine's connection the role issues from (default "redis", the
	// ground's own Redis).
	Connection string
}

// ConfigureRedis enables the database secrets engine at database/, connects it to the Redis server
// through redis-database-plugin with the Redis admin user, and writes the roles.
func (v *Vault) ConfigureRedis(ctx context.Context, r *Redis, roles ...RedisRole) error {
	err := v.Root.Sys().MountWithContext(ctx, "database", &vaultapi.MountInput{Type: "database"})
	if err != nil && !strings.Contains(err.Error(), "path is already in use") {
		return fmt.Errorf("enabling the database secrets engine: %w", err)
	}
	return v.ConnectRedis(ctx, "redis", "127.0.0.1", r.Port, r.AdminUser, r.AdminPassword, roles...)
}

// WriteRedisRole writes one role of the database secrets engine, on role.Connection ("redis" by default).
func (v *Vault) WriteRedisRole(ctx context.Context, role RedisRole) error {
	rules := role.ACLRules
	if len(rules) == 0 {
		rules = []string{"~*", "&*", "+@all"}
	}
	// creation_statements is one string holding a JSON array; the plugin takes its first element
	// as the list of ACL rules.
	stmt, _ := json.Marshal(rules)
	conn := role.Connection
	if conn == "" {
		conn = "redis"
	}
	data := map[string]any{"db_name": conn, "creation_statements": string(stmt)}
	if role.DefaultTTL > 0 {
		data["default_ttl"] = role.DefaultTTL.String()
	}
	if role.MaxTTL > 0 {
		data["max_ttl"] = role.MaxTTL.String()
	}
	if _, err := v.Root.Logical().WriteWithContext(ctx, "database/roles/"+role.Name, data); err != nil {
		return fmt.Errorf("writing role %s: %w", role.Name, err)
	}
	return nil
}

// ConnectRedis points a connection of the database engine (enabled by ConfigureRedis) at another
// Redis, such as a RedisCluster's client Service, as the plugin user user, and writes roles that
// issue from it. Without roles the connection allows every role (a shared ground's, whose
// packages write roles of their own).
func (v *Vault) ConnectRedis(ctx context.Context, conn, host string, port int, user, password string, roles ...RedisRole) error {
	names := make([]string, 0, len(roles))
	for _, role := range roles {
		names = append(names, role.Name)
	}
	if len(names) == 0 {
		names = []string{"*"}
	}
	_, err := v.Root.Logical().WriteWithContext(ctx, "database/config/"+conn, map[string]any{
		"plugin_name": "redis-database-plugin", "host": host, "port": port,
		"username": user, "password": password,
		"allowed_roles": strings.Join(names, ","), "verify_connection": true,
	})
	if err != nil {
		return fmt.Errorf("configuring the connection %s: %w", conn, err)
	}
	for _, role := range roles {
		role.Connection = conn
		if err := v.WriteRedisRole(ctx, role); err != nil {
			return err
		}
	}
	return nil
}

// KubernetesAuthRole is a role of Vault's Kubernetes auth method.
type KubernetesAuthRole struct {
	Name            string
	ServiceAccounts []string
	Namespaces      []string
	Audience        string // default "vault"
	Policies        []string
	TokenTTL        time.Duration
	TokenMaxTTL     time.Duration
	// TokenPeriod makes the role's tokens periodic: renewable for ever, each renewal for this long.
	TokenPeriod time.Duration
}

// EnableKubernetesAuth enables the Kubernetes auth method at kubernetes/ and points it at the
// control plane's API server, with a token reviewer ServiceAccount (system:auth-delegator).
func (v *Vault) EnableKubernetesAuth(ctx context.Context, cp *ControlPlane, roles ...KubernetesAuthRole) error {
	err := v.Root.Sys().EnableAuthWithOptionsWithContext(ctx, "kubernetes", &vaultapi.EnableAuthOptions{Type: "kubernetes"})
	if err != nil && !strings.Contains(err.Error(), "path is already in use") {
		return fmt.Errorf("enabling kubernetes auth: %w", err)
	}
	const reviewerNS, reviewer = "kube-system", "vault-token-reviewer"
	if err := cp.EnsureServiceAccount(ctx, reviewerNS, reviewer); err != nil {
		return err
	}
	if err := cp.BindClusterRole(ctx, "system:auth-delegator", reviewerNS, reviewer); err != nil {
		return err
	}
	// Without a reviewer token Vault reviews with the login token itself, whose audience ("vault")
	// the API server does not accept.
	jwt, err := cp.ServiceAccountToken(ctx, reviewerNS, reviewer, 24*time.Hour)
	if err != nil {
		return err
	}
	_, err = v.Root.Logical().WriteWithContext(ctx, "auth/kubernetes/config", map[string]any{
		"kubernetes_host":    cp.Config.Host,
		"kubernetes_ca_cert": string(cp.Config.CAData),
		"token_reviewer_jwt": jwt,
	})
	if err != nil {
		return fmt.Errorf("configuring kubernetes auth: %w", err)
	}
	for _, role := range roles {
		if err := v.WriteKubernetesAuthRole(ctx, role); err != nil {
			return err
		}
	}
	return nil
}

// WriteKubernetesAuthRole writes one role of the Kubernetes auth method.
func (v *Vault) WriteKubernetesAuthRole(ctx context.Context, role KubernetesAuthRole) error {
	aud := role.Audience
	if aud == "" {
		aud = "vault"
	}
	data := map[string]any{
		"bound_service_account_names":      strings.Join(role.ServiceAccounts, ","),
		"bound_service_account_namespaces": strings.Join(role.Namespaces, ","),
		"audience":                         aud,
		"token_policies":                   strings.Join(role.Policies, ","),
	}
	if role.TokenTTL > 0 {
		data["token_ttl"] = role.TokenTTL.String()
	}
	if role.TokenMaxTTL > 0 {
		data["token_max_ttl"] = role.TokenMaxTTL.String()
	}
	if role.TokenPeriod > 0 {
		data["token_period"] = role.TokenPeriod.String()
	}
	if _, err := v.Root.Logical().WriteWithContext(ctx, "auth/kubernetes/role/"+role.Name, data); err != nil {
		return fmt.Errorf("writing kubernetes auth role %s: %w", role.Name, err)
	}
	return nil
}

// WritePolicy writes an ACL policy.
func (v *Vault) WritePolicy(ctx context.Context, name, hcl string) error {
	return v.Root.Sys().PutPolicyWithContext(ctx, name, hcl)
}

// LoginKubernetes logs in through the Kubernetes auth method with a service-account token and
// returns the Vault token's secret.
func (v *Vault) LoginKubernetes(ctx context.Context, role, jwt string) (*vaultapi.Secret, error) {
	c, err := v.NewClient("")
	if err != nil {
		return nil, err
	}
	return c.Logical().WriteWithContext(ctx, "auth/kubernetes/login", map[string]any{"role": role, "jwt": jwt})
}

// LeaseExpiry asks Vault (as root) whether a lease exists, and when it expires.
func (v *Vault) LeaseExpiry(id string) (bool, time.Time) {
	s, err := v.Root.Sys().Lookup(id)
	if err != nil || s == nil {
		return false, time.Time{}
	}
	exp, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(s.Data["expire_time"]))
	return true, exp
}

// Seal seals the dev server (as root): it answers every request but health with 503 until Unseal.
func (v *Vault) Seal(ctx context.Context) error {
	return v.Root.Sys().SealWithContext(ctx)
}

// Unseal unseals the dev server with the unseal key it printed when it started.
func (v *Vault) Unseal(ctx context.Context) error {
	b, err := os.ReadFile(v.logPath)
	if err != nil {
		return err
	}
	_, rest, ok := strings.Cut(string(b), "Unseal Key: ")
	if !ok {
		return fmt.Errorf("no unseal key in %s", v.logPath)
	}
	key, _, _ := strings.Cut(rest, "\n")
	st, err := v.Root.Sys().UnsealWithContext(ctx, strings.TrimSpace(key))
	if err != nil {
		return err
	}
	if st.Sealed {
		return errors.New("vault is still sealed after the unseal key")
	}
	return nil
}
