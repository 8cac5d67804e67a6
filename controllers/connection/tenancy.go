// The tenancy guard keeps each namespace to what a VaultConnection allows it: which namespaces may
// use the connection, which Vault paths they may read credentials from, and so which leases keyroll
// may renew, look up and revoke for them. It decides before any request is sent.

package connection

import (
	"context"
	"fmt"
	"time"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/vault"
)

// tenantClient is a Vault client confined to what one namespace may do through a
// VaultConnection. It is keyroll's own guard, whatever Vault's policies allow the login: a
// request outside the namespace's rights is refused (vault.IsRefused) and never sent.
//
//   - Issue and the orphan sweep's ListLeases: the namespace is in spec.allowedNamespaces and the
//     path in spec.allowedPaths.
//   - Renew and Lookup: the namespace is allowed and the lease ID lies under an allowed path.
//   - Revoke: the lease ID lies under an allowed path of the namespace, allowed or no longer: a
//     namespace that lost its permission can still have the leases revoked that keyroll obtained
//     there, and nothing else.
//
// Token reads only what the client already knows and is never refused.
type tenantClient struct {
	vault.LeaseClient
	namespace string
	vc        *v1beta1.VaultConnection
	// turns, when set, ration the namespace's deferrable rotations within the connection's rate.
	turns *rotationTurns
}

// ForNamespace confines vcl to what RedisClusters of namespace may do through vc.
func ForNamespace(vcl vault.LeaseClient, vc *v1beta1.VaultConnection, namespace string) vault.LeaseClient {
	return forNamespace(vcl, vc, namespace)
}

func forNamespace(vcl vault.LeaseClient, vc *v1beta1.VaultConnection, namespace string) *tenantClient {
	return &tenantClient{LeaseClient: vcl, namespace: namespace, vc: vc.DeepCopy()}
}

// RotationTurn says how long a rotation of the namespace's RedisCluster cluster that may wait (a
// rotation.Decision that is Deferrable) waits for its turn within the connection's rate (turns.go);
// zero: it goes ahead now. Renewals, lookups and issues that may not wait take no turn.
func (t *tenantClient) RotationTurn(cluster string) time.Duration {
	if t.turns == nil {
		return 0
	}
	return t.turns.take(t.namespace, cluster)
}

func (t *tenantClient) Issue(ctx context.Context, path string) (*vault.Lease, error) {
	if err := t.checkPath("issue", path); err != nil {
		return nil, err
	}
	return t.LeaseClient.Issue(ctx, path)
}

func (t *tenantClient) Renew(ctx context.Context, leaseID string, increment time.Duration) (*vault.Renewal, error) {
	if err := t.checkLease("renew", leaseID, true); err != nil {
		return nil, err
	}
	return t.LeaseClient.Renew(ctx, leaseID, increment)
}

func (t *tenantClient) Lookup(ctx context.Context, leaseID string) (*vault.LeaseInfo, error) {
	if err := t.checkLease("lookup", leaseID, true); err != nil {
		return nil, err
	}
	return t.LeaseClient.Lookup(ctx, leaseID)
}

func (t *tenantClient) Revoke(ctx context.Context, leaseID string) error {
	if err := t.checkLease("revoke", leaseID, false); err != nil {
		return err
	}
	return t.LeaseClient.Revoke(ctx, leaseID)
}

func (t *tenantClient) ListLeases(ctx context.Context, prefix string) ([]string, error) {
	if err := t.checkPath("list-leases", prefix); err != nil {
		return nil, err
	}
	return t.LeaseClient.ListLeases(ctx, prefix)
}

func (t *tenantClient) checkPath(op, path string) error {
	if !t.vc.AllowsNamespace(t.namespace) {
		return vault.Refused(op, path, t.namespaceRefusal())
	}
	if !t.vc.AllowsPath(t.namespace, path) {
		return vault.Refused(op, path, PathRefusal(t.vc, t.namespace))
	}
	return nil
}

func (t *tenantClient) checkLease(op, leaseID string, needNamespace bool) error {
	if needNamespace && !t.vc.AllowsNamespace(t.namespace) {
		return vault.Refused(op, leaseID, t.namespaceRefusal())
	}
	if !t.vc.AllowsLease(t.namespace, leaseID) {
		return vault.Refused(op, leaseID, fmt.Sprintf("the lease does not lie under a path that namespace %q may use (VaultConnection %q, spec.allowedPaths)", t.namespace, t.vc.Name))
	}
	return nil
}

func (t *tenantClient) namespaceRefusal() string {
	return fmt.Sprintf("VaultConnection %q does not allow namespace %q (spec.allowedNamespaces)", t.vc.Name, t.namespace)
}

// PathRefusal says why a path is not one that namespace may use.
func PathRefusal(vc *v1beta1.VaultConnection, namespace string) string {
	if len(vc.Spec.AllowedPaths) == 0 {
		return fmt.Sprintf("VaultConnection %q allows no path (spec.allowedPaths is empty)", vc.Name)
	}
	return fmt.Sprintf("VaultConnection %q allows namespace %q only the paths %v (spec.allowedPaths, {namespace} = %s)", vc.Name, namespace, vc.Spec.AllowedPaths, namespace)
}

// AllowsClusterScoped says whether RedisClusters of the namespace may use the cluster-scoped
// store or generator of kind named name through this connection (nil), or why not.
func (t *tenantClient) AllowsClusterScoped(kind, name, field string) error {
	if t.vc.AllowsClusterScoped(kind, name) {
		return nil
	}
	return fmt.Errorf("%s: %s %q is not one that VaultConnection %q allows (spec.externalSecrets)", field, kind, name, t.vc.Name)
}

// AllowsLease says whether the lease may be renewed, looked up and revoked through this client
// (nil), or why not.
func (t *tenantClient) AllowsLease(leaseID string) error {
	return t.checkLease("lookup", leaseID, true)
}
