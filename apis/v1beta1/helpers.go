package v1beta1

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
)

// VaultConnectionName is the VaultConnection the RedisCluster uses: always in VaultLease mode, in
// ExternalSecret mode only to renew and revoke the leases External Secrets Operator obtains ("" if
// none).
func (rc *RedisCluster) VaultConnectionName() string {
	c := rc.Spec.Credentials
	switch {
	case c.VaultLease != nil:
		return c.VaultLease.ConnectionRef.Name
	case c.ExternalSecret != nil && c.ExternalSecret.ConnectionRef != nil:
		return c.ExternalSecret.ConnectionRef.Name
	}
	return ""
}

// VaultConnectionField names the spec field of VaultConnectionName, for messages.
func (rc *RedisCluster) VaultConnectionField() string {
	if rc.Spec.Credentials.ExternalSecret != nil {
		return "credentials.externalSecret.connectionRef.name"
	}
	return "credentials.vaultLease.connectionRef.name"
}

// LeaseConnection is the VaultConnection a lease of the ledger was obtained through: the one its
// record names, or (records made before keyroll recorded it) the one the cluster uses.
func (rc *RedisCluster) LeaseConnection(l LeaseRecord) string {
	if l.Connection != "" {
		return l.Connection
	}
	return rc.VaultConnectionName()
}

// VaultConnections lists the VaultConnections the RedisCluster uses or holds leases from.
func (rc *RedisCluster) VaultConnections() []string {
	var names []string
	add := func(n string) {
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	add(rc.VaultConnectionName())
	for _, l := range rc.Status.Leases {
		add(rc.LeaseConnection(l))
	}
	return names
}

// AllowsNamespace says whether RedisClusters in ns may use the VaultConnection: listed, or "*".
func (vc *VaultConnection) AllowsNamespace(ns string) bool {
	return slices.Contains(vc.Spec.AllowedNamespaces, "*") || slices.Contains(vc.Spec.AllowedNamespaces, ns)
}

// AllowsClusterScoped says whether the connection lets RedisClusters use the cluster-scoped
// store or generator of kind (ClusterSecretStore, ClusterGenerator) named name.
func (vc *VaultConnection) AllowsClusterScoped(kind, name string) bool {
	es := vc.Spec.ExternalSecrets
	if es == nil {
		return false
	}
	switch kind {
	case "ClusterSecretStore":
		return slices.Contains(es.ClusterSecretStores, name)
	case "ClusterGenerator":
		return slices.Contains(es.ClusterGenerators, name)
	}
	return false
}

// ClusterScopedSource is the cluster-scoped store or generator an ExternalSecret-mode RedisCluster
// names (kind, name and the field that names it), if any.
func (rc *RedisCluster) ClusterScopedSource() (kind, name, field string) {
	src := rc.Spec.Credentials.ExternalSecret
	switch {
	case src == nil:
	case src.StoreRef != nil && src.StoreRef.Kind == "ClusterSecretStore":
		return src.StoreRef.Kind, src.StoreRef.Name, "credentials.externalSecret.storeRef"
	case src.GeneratorRef != nil && src.GeneratorRef.Kind == "ClusterGenerator":
		return src.GeneratorRef.Kind, src.GeneratorRef.Name, "credentials.externalSecret.generatorRef"
	}
	return "", "", ""
}

// NamespaceIdentity says whether each namespace logs in to Vault with an identity of its own.
func (vc *VaultConnection) NamespaceIdentity() bool {
	return vc.Spec.Identity == IdentityNamespace && vc.Spec.Auth.Kubernetes != nil
}

// NamespacePlaceholder stands for a RedisCluster's namespace in spec.allowedPaths.
const NamespacePlaceholder = "{namespace}"

// AllowsPath says whether RedisClusters in ns may read credentials from path: it matches one of
// spec.allowedPaths with {namespace} replaced by ns, exactly or, for an entry ending in *, by
// its prefix. A path with an empty, . or .. segment never matches.
func (vc *VaultConnection) AllowsPath(ns, path string) bool {
	if ns == "" || !cleanVaultPath(path) {
		return false
	}
	for _, p := range vc.Spec.AllowedPaths {
		p = strings.ReplaceAll(p, NamespacePlaceholder, ns)
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(path, prefix) {
				return true
			}
		} else if path == p {
			return true
		}
	}
	return false
}

// AllowsLease says whether a lease ID lies under a path that RedisClusters in ns may use: Vault
// names a lease <path>/<id>, so the ID less its last segment must be an allowed path.
func (vc *VaultConnection) AllowsLease(ns, leaseID string) bool {
	i := strings.LastIndexByte(leaseID, '/')
	if i <= 0 || i == len(leaseID)-1 || !cleanVaultPath(leaseID) {
		return false
	}
	return vc.AllowsPath(ns, leaseID[:i])
}

// cleanVaultPath says whether p is a relative path without empty, . or .. segments.
func cleanVaultPath(p string) bool {
	if p == "" {
		return false
	}
	for s := range strings.SplitSeq(p, "/") {
		if s == "" || s == "." || s == ".." {
			return false
		}
	}
	return true
}

// SummaryPhase summarises the conditions for kubectl get (status.phase).
func (rc *RedisCluster) SummaryPhase() Phase {
	c := rc.Status.Conditions
	switch {
	case !rc.DeletionTimestamp.IsZero():
		return PhaseDeleting
	case meta.IsStatusConditionTrue(c, ConditionDegraded):
		return PhaseDegraded
	case meta.IsStatusConditionTrue(c, ConditionRolloutProgressing):
		return PhaseRolling
	case meta.IsStatusConditionTrue(c, ConditionReady):
		return PhaseReady
	case rc.Status.Credential == nil:
		return PhaseIssuing
	}
	return PhasePending
}

// TokenEnds maps the accessors of the tokens with a known end to that end.
func (s *VaultConnectionStatus) TokenEnds() map[string]time.Time {
	out := map[string]time.Time{}
	for _, t := range s.Tokens {
		if t.EndsAt != nil {
			out[t.Accessor] = t.EndsAt.Time
		}
	}
	return out
}

// MaxAcknowledgement is the longest annotation value status records as it is
// (status.rotateNowAcknowledged, dataPlaneUpgradeAcknowledged).
const MaxAcknowledgement = 256

// Acknowledgement is what status records of a request annotation's value: the value, or for one
// over MaxAcknowledgement characters its SHA-256 digest (sha256:<hex>). An annotation may hold up
// to 256 KiB, and copied whole into status it could take the object past what etcd stores, after
// which no status write of the cluster would succeed; the digest still tells a new request from
// the one acted upon.
func Acknowledgement(value string) string {
	if len(value) <= MaxAcknowledgement {
		return value
	}
	sum := sha256.Sum256([]byte(value))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// RotateNowRequest is the rotate-now annotation's value as status acknowledges it (Acknowledgement).
func (rc *RedisCluster) RotateNowRequest() string {
	return Acknowledgement(rc.Annotations[AnnotationRotateNow])
}

// DataPlaneUpgradeRequest is the upgrade-data-plane annotation's value as status acknowledges it
// (Acknowledgement).
func (rc *RedisCluster) DataPlaneUpgradeRequest() string {
	return Acknowledgement(rc.Annotations[AnnotationUpgradeDataPlane])
}

// DataPlaneUpgradeAsked says that the upgrade-data-plane annotation asks for a pending data-plane
// change that keyroll has not yet acknowledged.
func (rc *RedisCluster) DataPlaneUpgradeAsked() bool {
	v := rc.DataPlaneUpgradeRequest()
	return v != "" && v != rc.Status.DataPlaneUpgradeAcknowledged
}

// RotationAsked says that the rotate-now annotation asks for a rotation keyroll has not yet
// acknowledged, and rotations are not paused (a paused cluster's request waits for the pause to end).
func (rc *RedisCluster) RotationAsked() bool {
	v := rc.RotateNowRequest()
	return v != "" && v != rc.Status.RotateNowAcknowledged && !rc.Spec.Rotation.Paused
}

// SupersededUsernames are the Redis users of the credentials the current one replaced and that are
// not retired yet: those of the superseded leases, then those of superseded credentials without a
// tracked lease (status.credential.externalSecret.supersededUsers), each once.
func (rc *RedisCluster) SupersededUsernames() []string {
	var out []string
	add := func(name string) {
		if name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, l := range rc.Status.Leases {
		if l.State == LeaseSuperseded {
			add(l.Username)
		}
	}
	if c := rc.Status.Credential; c != nil {
		for _, name := range c.SupersededUsers {
			add(name)
		}
	}
	return out
}
