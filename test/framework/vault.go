package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/testground"
)

// SetupVault gives the package's operator what a Vault administrator would: the package's Redis
// roles (named by Role) on the ground's Redis, the policy of deploy/vault/policy.hcl plus extra
// policy files of deploy/vault, and Kubernetes auth for its service account in OperatorNS, with
// hour-long tokens. Run calls it for Config.Roles.
func (f *Framework) SetupVault(ctx context.Context, roles ...testground.RedisRole) error {
	g := f.Ground
	named := make([]testground.RedisRole, len(roles))
	for i, r := range roles {
		r.Name = f.Role(r.Name)
		named[i] = r
	}
	if shared := g.Attached() && f.ownVault == nil; shared {
		// The shared Vault's connection to Redis allows every role, and its Kubernetes auth is
		// configured: the package writes roles of its own only.
		for _, r := range named {
			if err := g.Vault.WriteRedisRole(ctx, r); err != nil {
				return err
			}
		}
	} else if err := g.Vault.ConfigureRedis(ctx, g.Redis, named...); err != nil {
		return err
	}
	if err := f.WriteOperatorPolicy(ctx); err != nil {
		return err
	}
	if err := g.CP.EnsureServiceAccount(ctx, f.OperatorNS, OperatorSA); err != nil {
		return err
	}
	if g.Attached() && f.ownVault == nil {
		return g.Vault.WriteKubernetesAuthRole(ctx, f.OperatorAuthRole(time.Hour))
	}
	return g.Vault.EnableKubernetesAuth(ctx, g.CP, f.OperatorAuthRole(time.Hour))
}

// startOwnVault replaces the shared ground's Vault, for this package, with a server of its own,
// reachable from pods through the node's bridge as the shared one is.
func (f *Framework) startOwnVault(ctx context.Context) error {
	v, err := testground.StartVault(f.Ground.Dir)
	if err != nil {
		return err
	}
	f.ownVault = v
	if f.Ground.Node != nil {
		addr, err := f.Ground.Node.Expose(fmt.Sprintf("127.0.0.1:%d", v.Port))
		if err != nil {
			return err
		}
		v.PodAddr = "http://" + addr
	}
	f.Ground.Vault = v
	return nil
}

// WriteOperatorPolicy writes the operator's Vault policy (named OperatorRole): the policy files of
// deploy/vault named (default: policy.hcl alone), joined.
func (f *Framework) WriteOperatorPolicy(ctx context.Context, files ...string) error {
	if len(files) == 0 {
		files = []string{"policy.hcl"}
	}
	var hcl []byte
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "vault", name))
		if err != nil {
			return err
		}
		hcl = append(append(hcl, b...), '\n')
	}
	return f.Ground.Vault.WritePolicy(ctx, f.OperatorRole, string(hcl))
}

// OperatorAuthRole is a Kubernetes auth role of the operator's service account with its policy,
// named OperatorRole, whose tokens live tokenTTL; rename it for roles of other lifetimes.
func (f *Framework) OperatorAuthRole(tokenTTL time.Duration) testground.KubernetesAuthRole {
	return testground.KubernetesAuthRole{
		Name: f.OperatorRole, ServiceAccounts: []string{OperatorSA}, Namespaces: []string{f.OperatorNS},
		Policies: []string{f.OperatorRole}, TokenTTL: tokenTTL,
	}
}

// VaultLeases lists, as root, the lease IDs Vault holds under a credential path, sorted.
func (f *Framework) VaultLeases(t testing.TB, path string) []string {
	t.Helper()
	ids, err := f.ListLeases(path)
	if err != nil {
		t.Fatalf("listing the leases of %s as root: %v", path, err)
	}
	return ids
}

// ListLeases is VaultLeases for a goroutine other than the test's, or after the tests.
func (f *Framework) ListLeases(path string) ([]string, error) {
	s, err := f.Ground.Vault.Root.Logical().List("sys/leases/lookup/" + path + "/")
	if err != nil || s == nil {
		return nil, err
	}
	var ids []string
	keys, _ := s.Data["keys"].([]any)
	for _, k := range keys {
		ids = append(ids, path+"/"+fmt.Sprint(k))
	}
	slices.Sort(ids)
	return ids, nil
}

// LeaseExists asks Vault (as root) whether a lease exists, and when it expires.
func (f *Framework) LeaseExists(id string) (bool, time.Time) { return f.Ground.Vault.LeaseExpiry(id) }

// EnableAudit enables a file audit device of the package's on the ground's Vault and returns its
// file (in the ground's directory), which ReadAudit reads. Vault writes every request and
// response there from then on, the package's and any other's.
func (f *Framework) EnableAudit(ctx context.Context) (string, error) {
	path := filepath.Join(f.Ground.Dir, f.Name("vault-audit.log"))
	err := f.Ground.Vault.Root.Sys().EnableAuditWithOptionsWithContext(ctx, f.Name("file"), &vaultapi.EnableAuditOptions{
		Type: "file", Options: map[string]string{"file_path": path},
	})
	if err != nil {
		return "", fmt.Errorf("enabling Vault's file audit device: %w", err)
	}
	return path, nil
}

// AuditEntry is one line of Vault's audit log: a request, or the response to one. Vault writes
// secrets in it as HMACs only.
type AuditEntry struct {
	Time  time.Time `json:"time"`
	Type  string    `json:"type"` // "request" or "response"
	Error string    `json:"error"`
	Auth  struct {
		DisplayName string            `json:"display_name"`
		Accessor    string            `json:"accessor"`
		Policies    []string          `json:"policies"`
		Metadata    map[string]string `json:"metadata"`
	} `json:"auth"`
	Request struct {
		ID            string         `json:"id"`
		Path          string         `json:"path"`
		Operation     string         `json:"operation"`
		RemoteAddress string         `json:"remote_address"`
		Data          map[string]any `json:"data"`
	} `json:"request"`
}

// Issued says whether the entry is Vault's successful answer to a read of path: a credential it
// issued there.
func (e AuditEntry) Issued(path string) bool {
	return e.Type == "response" && e.Error == "" && e.Request.Operation == "read" && e.Request.Path == path
}

// ByRole says whether the entry is a request made with a token that logged in through the
// Kubernetes auth role role: the operator's requests, when role is OperatorRole.
func (e AuditEntry) ByRole(role string) bool {
	return e.Type == "request" && e.Auth.Metadata["role"] == role
}

// Names says whether the entry's request names the lease id: in its path (sys/leases/revoke/<id>,
// sys/leases/renew/<id>) or as its lease_id, which the audit log holds as hashed (AuditHash).
func (e AuditEntry) Names(id, hashed string) bool {
	if strings.Contains(e.Request.Path, id) {
		return true
	}
	v, _ := e.Request.Data["lease_id"].(string)
	return v != "" && (v == hashed || v == id)
}

// AuditHash is what the package's audit device (EnableAudit) writes in place of s: its HMAC.
func (f *Framework) AuditHash(ctx context.Context, s string) (string, error) {
	out, err := f.Ground.Vault.Root.Logical().WriteWithContext(ctx, "sys/audit-hash/"+f.Name("file"), map[string]any{"input": s})
	if err != nil {
		return "", fmt.Errorf("hashing with the audit device: %w", err)
	}
	h, _ := out.Data["hash"].(string)
	if h == "" {
		return "", errors.New("the audit device returned no hash")
	}
	return h, nil
}

// ReadAudit reads the audit log at path (lines that are not entries are passed over).
func ReadAudit(path string) ([]AuditEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading Vault's audit log: %w", err)
	}
	var out []AuditEntry
	for line := range strings.Lines(string(b)) {
		var e AuditEntry
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// AuditIssues counts, in the audit log at auditLog, the credentials Vault issued under path. Unlike
// sampling the leases, it misses none.
func AuditIssues(t testing.TB, auditLog, path string) int {
	t.Helper()
	entries, err := ReadAudit(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Issued(path) {
			n++
		}
	}
	return n
}

// WriteExternalSecretsPolicy writes External Secrets Operator's Vault policy of
// deploy/vault/external-secrets-policy.hcl, named name.
func (f *Framework) WriteExternalSecretsPolicy(ctx context.Context, name string) error {
	b, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "vault", "external-secrets-policy.hcl"))
	if err != nil {
		return err
	}
	return f.Ground.Vault.WritePolicy(ctx, name, string(b))
}

// ExternalSecretsAuth lets External Secrets Operator's generators of namespace ns log in to Vault
// as that namespace's service account external-secrets (created here): a Kubernetes auth role
// named role with the policy policy, whose tokens live tokenTTL.
func (f *Framework) ExternalSecretsAuth(ctx context.Context, ns, role, policy string, tokenTTL time.Duration) error {
	if err := f.Ground.CP.EnsureServiceAccount(ctx, ns, "external-secrets"); err != nil {
		return err
	}
	return f.Ground.Vault.WriteKubernetesAuthRole(ctx, testground.KubernetesAuthRole{
		Name: role, ServiceAccounts: []string{"external-secrets"}, Namespaces: []string{ns},
		Policies: []string{policy}, TokenTTL: tokenTTL,
	})
}

// NamespaceServiceAccount is the service account of a namespace that keyroll logs in with for
// VaultConnections with identity Namespace (the API's default).
const NamespaceServiceAccount = "keyroll-vault"

// NamespaceIdentity gives namespace ns a Vault identity of its own, as the Vault administrators'
// guide sets one up for identity Namespace: the service account keyroll-vault in ns, a Kubernetes
// auth role named after the namespace bound to it, and a policy that lets it read the roles named
// after the namespace (<ns>.<role>), renew, revoke and (for the orphan-lease sweep) list their
// leases, and nothing else.
func (f *Framework) NamespaceIdentity(t testing.TB, ns string) {
	t.Helper()
	ctx := context.Background()
	if err := f.Ground.CP.EnsureServiceAccount(ctx, ns, NamespaceServiceAccount); err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf(`
path "database/creds/%[1]s.*" { capabilities = ["read"] }
path "sys/leases/renew/database/creds/%[1]s.*" { capabilities = ["update"] }
path "sys/leases/revoke/database/creds/%[1]s.*" { capabilities = ["update"] }
path "sys/leases/lookup/database/creds/%[1]s.*" { capabilities = ["list", "sudo"] }
path "sys/leases/lookup" { capabilities = ["update"] }
path "auth/token/renew-self" { capabilities = ["update"] }
path "auth/token/lookup-self" { capabilities = ["read"] }
`, ns)
	if err := f.Ground.Vault.WritePolicy(ctx, ns, policy); err != nil {
		t.Fatal(err)
	}
	if err := f.Ground.Vault.WriteKubernetesAuthRole(ctx, testground.KubernetesAuthRole{Name: ns, ServiceAccounts: []string{NamespaceServiceAccount},
		Namespaces: []string{ns}, Policies: []string{ns}, TokenPeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
}

// NamespaceIdentityOption makes a VaultConnection log in per namespace (identity Namespace), to
// the Vault role named after the namespace (NamespaceIdentity).
func NamespaceIdentityOption(vc *v1beta1.VaultConnection) {
	vc.Spec.Identity = v1beta1.IdentityNamespace
	vc.Spec.Auth = v1beta1.VaultAuth{Kubernetes: &v1beta1.KubernetesAuth{Role: v1beta1.NamespacePlaceholder, ServiceAccountName: NamespaceServiceAccount}}
}
