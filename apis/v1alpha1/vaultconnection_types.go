package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VaultIdentity is whose Vault login a RedisCluster's requests go out with.
// +kubebuilder:validation:Enum=Operator;Namespace
type VaultIdentity string

const (
	// IdentityOperator: the operator's own login, one for every namespace (keyroll's guard,
	// allowedPaths, keeps the namespaces apart).
	IdentityOperator VaultIdentity = "Operator"
	// IdentityNamespace: a login per namespace, with a service account of the RedisCluster's
	// namespace (auth.kubernetes.serviceAccountName), so that Vault's role and policy for that
	// namespace decide what it may read, renew and revoke.
	IdentityNamespace VaultIdentity = "Namespace"
)

// VaultConnectionSpec describes how the operator reaches one Vault server and which namespaces'
// RedisClusters may use it.
// +kubebuilder:validation:XValidation:rule="!has(self.identity) || self.identity != 'Namespace' || has(self.auth.kubernetes)",message="identity Namespace needs auth.kubernetes: each namespace logs in with a service account of its own"
// +kubebuilder:validation:XValidation:rule="(has(self.identity) && self.identity == 'Namespace') || !has(self.auth.kubernetes) || !self.auth.kubernetes.role.contains('{namespace}')",message="auth.kubernetes.role may hold {namespace} only with identity Namespace"
type VaultConnectionSpec struct {
	// address is the URL of the Vault server, for example https://vault.vault.svc:8200.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="address must be an http:// or https:// URL with a host"
	Address string `json:"address"`

	// tls configures how the Vault server's certificate is verified. Verification is never
	// skipped: without a CA here the system's trust store is used.
	// +optional
	TLS *VaultTLS `json:"tls,omitempty"`

	// namespace is the Vault Enterprise namespace to send requests to (X-Vault-Namespace).
	// Leave empty for Vault Community Edition or the root namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$`
	Namespace string `json:"namespace,omitempty"`

	// auth is how the operator logs in to Vault: exactly one of kubernetes, appRole or token.
	// +required
	Auth VaultAuth `json:"auth"`

	// identity is whose Vault login a RedisCluster's requests go out with: Operator (the
	// default), the operator's own service account, for every namespace; or Namespace, a service
	// account of the RedisCluster's namespace (auth.kubernetes.serviceAccountName), logging in to
	// auth.kubernetes.role with {namespace} replaced, so that Vault's role and policy for each
	// namespace decide which paths and leases it may use. Tokens are then kept per namespace.
	// +optional
	// +kubebuilder:default=Operator
	Identity VaultIdentity `json:"identity,omitempty"`

	// allowedNamespaces lists the namespaces whose RedisClusters may use this connection.
	// Empty means none; ["*"] means all.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`
	// +kubebuilder:validation:XValidation:rule="!self.exists(n, n == '*') || self.size() == 1",message="allowedNamespaces: \"*\" must be the only entry"
	AllowedNamespaces []string `json:"allowedNamespaces,omitempty"`

	// allowedPaths lists the Vault paths that RedisClusters of an allowed namespace may read
	// credentials from (credentials.vaultLease.path), and so the leases keyroll may renew, look up
	// and revoke for them: a lease is touched only when its ID lies under an allowed path. In each
	// entry {namespace} stands for the RedisCluster's namespace, and a trailing * matches any
	// rest, as in a Vault policy: database/creds/{namespace} (one role per namespace, named after
	// it) or database/creds/{namespace}.* (several). Empty means no path: every RedisCluster is
	// refused (PathNotAllowed) without a Vault call. {namespace} must be followed by /, ., _ or the
	// end, characters a namespace name cannot hold, so that namespace a never matches the paths of
	// namespace a-b.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:items:Pattern=`^([A-Za-z0-9_.-]|[{]namespace[}])+(/([A-Za-z0-9_.-]|[{]namespace[}])+)*(/?[*])?$`
	// +kubebuilder:validation:XValidation:rule="self.all(p, !p.matches('[{]namespace[}][^/._]'))",message="allowedPaths: {namespace} must be followed by /, ., _ or the end of the path, or one namespace's paths would match another's (a and a-b)"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !p.split('/').exists(s, s == '.' || s == '..'))",message="allowedPaths: the segments . and .. are not allowed"
	AllowedPaths []string `json:"allowedPaths,omitempty"`

	// externalSecrets lists the cluster-scoped stores and generators of External Secrets Operator
	// that ExternalSecret-mode RedisClusters of an allowed namespace may use through this connection
	// (credentials.externalSecret.connectionRef). A RedisCluster that names a ClusterSecretStore or
	// a ClusterGenerator must name a connection that lists it; one in its own namespace (SecretStore,
	// VaultDynamicSecret) needs none.
	// +optional
	ExternalSecrets *ExternalSecretsAccess `json:"externalSecrets,omitempty"`

	// rateLimit bounds the requests the operator sends to this Vault, for all RedisClusters together.
	// Rotations that replace a credential still good (rotate-now, scheduled) wait their turn within
	// a share of it: a quarter of qps and burst per namespace, half for all namespaces together, so
	// that renewals and lookups, which keep leases alive, always find the other half.
	// +optional
	// +kubebuilder:default={qps: 20, burst: 40}
	RateLimit *VaultRateLimit `json:"rateLimit,omitempty"`

	// orphanLeases sets up the sweep for leases that Vault holds under the credential paths of this
	// connection's RedisClusters but that no RedisCluster's ledger knows (a lease issued just before
	// the operator was killed, before it reached the ledger). Only the allowed paths of allowed
	// namespaces are swept, and only a lease whose issue this install recorded beforehand (an
	// intent, in its own namespace) is revoked: one that another install, Vault Agent or a person
	// obtained on the same role is reported and left alone. The sweep needs a Vault policy with list
	// and sudo on sys/leases/lookup/<path>/ (deploy/vault); without it, the sweep reports that it is
	// not permitted and such a lease lives until its TTL.
	// +optional
	OrphanLeases *OrphanLeases `json:"orphanLeases,omitempty"`
}

// ExternalSecretsAccess names the cluster-scoped stores and generators a connection allows.
type ExternalSecretsAccess struct {
	// clusterSecretStores are the names of the ClusterSecretStores allowed.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	ClusterSecretStores []string `json:"clusterSecretStores,omitempty"`

	// clusterGenerators are the names of the ClusterGenerators allowed.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	ClusterGenerators []string `json:"clusterGenerators,omitempty"`
}

// OrphanLeaseAction is what the sweep does with a lease no ledger knows.
// +kubebuilder:validation:Enum=Off;Report;Revoke
type OrphanLeaseAction string

const (
	// OrphanLeasesOff: no sweep.
	OrphanLeasesOff OrphanLeaseAction = "Off"
	// OrphanLeasesReport: orphans are counted (status, metric) and announced by an event.
	OrphanLeasesReport OrphanLeaseAction = "Report"
	// OrphanLeasesRevoke: orphans are reported and revoked.
	OrphanLeasesRevoke OrphanLeaseAction = "Revoke"
)

// OrphanLeases configures the orphan-lease sweep.
type OrphanLeases struct {
	// action is what is done with an orphan: Off (no sweep), Report (the default) or Revoke.
	// +optional
	// +kubebuilder:default=Report
	Action OrphanLeaseAction `json:"action,omitempty"`

	// gracePeriod is how old a lease must be before it can count as an orphan: a lease issued just
	// now may be on its way into a ledger. At least 10s.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$')",message="orphanLeases.gracePeriod must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || (duration(self) >= duration('10s'))",message="orphanLeases.gracePeriod must be at least 10s"
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`

	// interval is how often the sweep runs. At least 10s.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$')",message="orphanLeases.interval must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || (duration(self) >= duration('10s'))",message="orphanLeases.interval must be at least 10s"
	Interval *metav1.Duration `json:"interval,omitempty"`
}

// OrphanLeaseStatus is the outcome of the last orphan-lease sweep.
type OrphanLeaseStatus struct {
	// lastSweepAt is when the sweep last ran.
	// +optional
	LastSweepAt *metav1.Time `json:"lastSweepAt,omitempty"`

	// paths are the credential paths swept.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=512
	Paths []string `json:"paths,omitempty"`

	// found is how many orphans the last sweep found.
	// +optional
	Found int32 `json:"found,omitempty"`

	// foreign is how many of the orphans found this install did not issue (no record of its own
	// matches them: another install, Vault Agent, a person): they are reported, never revoked.
	// +optional
	Foreign int32 `json:"foreign,omitempty"`

	// revoked is how many orphans the sweeps of this connection have revoked in all.
	// +optional
	Revoked int32 `json:"revoked,omitempty"`

	// orphans are the lease IDs of the orphans the last sweep found (at most 16).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=512
	Orphans []string `json:"orphans,omitempty"`

	// error says why the last sweep could not finish, when it could not (a missing policy, for one).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Error string `json:"error,omitempty"`
}

// VaultTLS configures the verification of the Vault server's certificate.
// +kubebuilder:validation:XValidation:rule="!(has(self.caBundle) && has(self.caSecretRef))",message="tls: set at most one of caBundle and caSecretRef"
type VaultTLS struct {
	// caBundle is a PEM bundle of the CA certificates that sign the Vault server's certificate.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=65536
	// +kubebuilder:validation:XValidation:rule="self.contains('-----BEGIN CERTIFICATE-----')",message="caBundle must hold PEM certificates"
	CABundle string `json:"caBundle,omitempty"`

	// caSecretRef names a Secret key holding a PEM bundle of CA certificates.
	// +optional
	CASecretRef *SecretKeyReference `json:"caSecretRef,omitempty"`

	// tlsServerName is the name expected in the server's certificate when it differs from the
	// host of address.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	TLSServerName string `json:"tlsServerName,omitempty"`
}

// SecretKeyReference names one key of a Secret in a given namespace.
type SecretKeyReference struct {
	// namespace of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`

	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// key within the Secret's data.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// VaultAuth selects exactly one way of logging in to Vault.
// +kubebuilder:validation:XValidation:rule="[has(self.kubernetes), has(self.appRole), has(self.token)].filter(x, x).size() == 1",message="auth: set exactly one of kubernetes, appRole or token"
type VaultAuth struct {
	// kubernetes logs in with the operator's own service-account token, obtained through the
	// TokenRequest API for the given audiences.
	// +optional
	Kubernetes *KubernetesAuth `json:"kubernetes,omitempty"`

	// appRole logs in with a role ID and a secret ID read from a Secret.
	// +optional
	AppRole *AppRoleAuth `json:"appRole,omitempty"`

	// token uses a Vault token read from a Secret. Meant for development: the token is not renewed
	// beyond what Vault allows and cannot be re-issued by the operator.
	// +optional
	Token *TokenAuth `json:"token,omitempty"`
}

// KubernetesAuth configures Vault's Kubernetes auth method.
type KubernetesAuth struct {
	// mount is the path the Kubernetes auth method is enabled at.
	// +optional
	// +kubebuilder:default=kubernetes
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`
	Mount string `json:"mount,omitempty"`

	// role is the Vault role to log in as; with identity Namespace, {namespace} in it stands for
	// the RedisCluster's namespace (keyroll-{namespace}, say).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^([A-Za-z0-9_.@-]|[{]namespace[}])+$`
	Role string `json:"role"`

	// serviceAccountName is, with identity Namespace, the service account of each RedisCluster's
	// namespace that keyroll requests tokens for (the namespace's administrator creates it, and
	// lets keyroll's manager create its tokens: docs/vault-administrators.md).
	// +optional
	// +kubebuilder:default=keyroll-vault
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// audiences the service-account token is requested for; they must match the role's audience.
	// +optional
	// +listType=set
	// +kubebuilder:default={vault}
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Audiences []string `json:"audiences,omitempty"`

	// tokenExpirationSeconds is the lifetime requested for the service-account token used to log in.
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=600
	// +kubebuilder:validation:Maximum=86400
	TokenExpirationSeconds int64 `json:"tokenExpirationSeconds,omitempty"`
}

// AppRoleAuth configures Vault's AppRole auth method.
type AppRoleAuth struct {
	// mount is the path the AppRole auth method is enabled at.
	// +optional
	// +kubebuilder:default=approle
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`
	Mount string `json:"mount,omitempty"`

	// roleID is the AppRole's role ID (not a secret on its own).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	RoleID string `json:"roleID"`

	// secretIDRef names the Secret key holding the AppRole's secret ID.
	// +required
	SecretIDRef SecretKeyReference `json:"secretIDRef"`
}

// TokenAuth uses a static Vault token.
type TokenAuth struct {
	// secretRef names the Secret key holding the Vault token.
	// +required
	SecretRef SecretKeyReference `json:"secretRef"`
}

// VaultRateLimit is a token bucket for the requests sent to Vault.
// +kubebuilder:validation:XValidation:rule="self.burst >= self.qps",message="rateLimit.burst must be at least rateLimit.qps"
type VaultRateLimit struct {
	// qps is the sustained number of requests per second.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	QPS int32 `json:"qps"`

	// burst is the number of requests that may be sent at once above the sustained rate.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Burst int32 `json:"burst"`
}

// VaultConnectionStatus is what the operator last saw of the Vault server and its login there.
// It never holds the token itself.
type VaultConnectionStatus struct {
	// observedGeneration is the generation last reconciled successfully.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready says whether the operator is logged in to Vault.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// tokenExpiresAt is when the operator's current Vault token expires.
	// +optional
	TokenExpiresAt *metav1.Time `json:"tokenExpiresAt,omitempty"`

	// tokens are the Vault tokens the operator holds through this connection: the current one,
	// which creates new leases, and earlier ones kept alive because leases they created are live
	// (Vault revokes a lease with its token). Identified by accessor, never by the token.
	// +optional
	// +listType=map
	// +listMapKey=accessor
	// +kubebuilder:validation:MaxItems=64
	Tokens []TokenStatus `json:"tokens,omitempty"`

	// vaultVersion is the Vault server version as last seen.
	// +optional
	VaultVersion string `json:"vaultVersion,omitempty"`

	// sealed is Vault's seal state as last seen.
	// +optional
	Sealed *bool `json:"sealed,omitempty"`

	// lastCheckedAt is when the operator last talked to this Vault.
	// +optional
	LastCheckedAt *metav1.Time `json:"lastCheckedAt,omitempty"`

	// orphanLeases is the outcome of the last orphan-lease sweep (spec.orphanLeases).
	// +optional
	OrphanLeases *OrphanLeaseStatus `json:"orphanLeases,omitempty"`
}

// TokenStatus is one Vault token the operator holds, without the token.
type TokenStatus struct {
	// accessor identifies the token without revealing it (vault token lookup -accessor).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Accessor string `json:"accessor"`

	// current says new leases are created with this token.
	// +optional
	Current bool `json:"current,omitempty"`

	// namespace is, with identity Namespace, the namespace whose login the token is.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// leases is how many leases in RedisClusters' ledgers this token created.
	// +optional
	Leases int32 `json:"leases,omitempty"`

	// expiresAt is when the token expires unless renewed.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`

	// endsAt is when the token ends for good (its max TTL), if it has one; its leases end with it.
	// +optional
	EndsAt *metav1.Time `json:"endsAt,omitempty"`
}

// VaultConnection describes how keyroll reaches a Vault server and logs in there, and which
// namespaces may use it. It is cluster-scoped and meant for Vault administrators.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:deprecatedversion:warning="keyroll.dev/v1alpha1 VaultConnection is deprecated: use keyroll.dev/v1beta1 (docs/redis-cluster-owners.md, API versions)"
// +kubebuilder:resource:scope=Cluster,shortName=vc;vconn,categories=keyroll
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Vault",type=string,JSONPath=`.status.vaultVersion`
// +kubebuilder:printcolumn:name="Token-Expires",type=string,JSONPath=`.status.tokenExpiresAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VaultConnection struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is how to reach and log in to Vault.
	// +required
	Spec VaultConnectionSpec `json:"spec"`

	// status is what the operator last saw.
	// +optional
	Status VaultConnectionStatus `json:"status,omitempty"`
}

// VaultConnectionList is a list of VaultConnections.
//
// +kubebuilder:object:root=true
type VaultConnectionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VaultConnection `json:"items"`
}
