package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Where a RedisCluster's credential comes from: Vault directly (VaultLease) or External Secrets
// Operator (ExternalSecret).

// CredentialSource says where a RedisCluster's credential comes from.
// +kubebuilder:validation:Enum=VaultLease;ExternalSecret
type CredentialSource string

const (
	// SourceVaultLease: the operator reads the Vault path itself and holds the lease.
	SourceVaultLease CredentialSource = "VaultLease"
	// SourceExternalSecret: the operator creates an ExternalSecret and External Secrets Operator syncs it.
	SourceExternalSecret CredentialSource = "ExternalSecret"
)

// RevokedOutsidePolicy says what happens to the user of a lease revoked outside keyroll.
// +kubebuilder:validation:Enum=CutOff;RollOver
type RevokedOutsidePolicy string

const (
	// RevokedOutsideCutOff removes the revoked user from every Redis node at once.
	RevokedOutsideCutOff RevokedOutsidePolicy = "CutOff"
	// RevokedOutsideRollOver keeps the revoked user on the Redis nodes until the new credential
	// has rolled out.
	RevokedOutsideRollOver RevokedOutsidePolicy = "RollOver"
)

// CredentialsSpec is a union on source: vaultLease for VaultLease, externalSecret for ExternalSecret.
// +kubebuilder:validation:XValidation:rule="self.source == 'VaultLease' ? has(self.vaultLease) : !has(self.vaultLease)",message="credentials.vaultLease must be set when source is VaultLease, and only then"
// +kubebuilder:validation:XValidation:rule="self.source == 'ExternalSecret' ? has(self.externalSecret) : !has(self.externalSecret)",message="credentials.externalSecret must be set when source is ExternalSecret, and only then"
// +kubebuilder:validation:XValidation:rule="self.usernameKey != self.passwordKey",message="credentials.usernameKey and credentials.passwordKey must differ"
// +kubebuilder:validation:XValidation:rule="self.source == oldSelf.source",message="credentials.source cannot be changed; create a new RedisCluster to switch sources"
// +kubebuilder:validation:XValidation:rule="(has(self.unsafeAllowAdminCommands) && self.unsafeAllowAdminCommands) || !has(self.aclRules) || self.aclRules.all(r, r != '+@admin' && !r.matches('^[+](acl|config|replicaof|slaveof|sync|psync|replconf|failover|shutdown|module|debug|monitor|cluster)([|].*)?$'))",messageExpression="'spec.credentials.aclRules: ' + self.aclRules.filter(r, r == '+@admin' || r.matches('^[+](acl|config|replicaof|slaveof|sync|psync|replconf|failover|shutdown|module|debug|monitor|cluster)([|].*)?$'))[0] + ' would let the application user run commands that take Redis over from keyroll (ACL, replication, failover, configuration, shutdown, modules, debugging, cluster administration); set spec.credentials.unsafeAllowAdminCommands to grant them anyway'",fieldPath=".aclRules",reason=FieldValueForbidden
type CredentialsSpec struct {
	// source is where the credential comes from: VaultLease (the operator reads Vault and holds the
	// lease) or ExternalSecret (External Secrets Operator syncs it through an ExternalSecret the
	// operator creates).
	// +required
	Source CredentialSource `json:"source"`

	// vaultLease configures the VaultLease source.
	// +optional
	VaultLease *VaultLeaseSource `json:"vaultLease,omitempty"`

	// externalSecret configures the ExternalSecret source.
	// +optional
	ExternalSecret *ExternalSecretSource `json:"externalSecret,omitempty"`

	// secretName is the name of the credentials Secret for consumers; default <name>-credentials.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	SecretName string `json:"secretName,omitempty"`

	// usernameKey is the key of the username in the credentials Secret.
	// +optional
	// +kubebuilder:default=username
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	UsernameKey string `json:"usernameKey,omitempty"`

	// passwordKey is the key of the password in the credentials Secret.
	// +optional
	// +kubebuilder:default=password
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	PasswordKey string `json:"passwordKey,omitempty"`

	// onRevokedOutside says what keyroll does when the live lease is revoked outside keyroll (for
	// example `vault lease revoke` during an incident), which it detects within
	// the lease-check interval (a minute by default). Either way a new credential is issued and
	// rolled out at once. CutOff (the default) removes the revoked user from every Redis node at
	// once, honouring the revocation; RollOver keeps it on keyroll's Redis nodes until the new
	// credential has rolled out, trading the cut-off for availability.
	// +optional
	// +kubebuilder:default=CutOff
	// +kubebuilder:validation:Enum=CutOff;RollOver
	OnRevokedOutside RevokedOutsidePolicy `json:"onRevokedOutside,omitempty"`

	// aclRules are the Redis ACL rules the credential's user gets on every node; they should match
	// the Vault role's creation statements. The default allows all keys, channels and commands.
	// Whatever they say, keyroll appends rules that deny the application user the commands that
	// would take Redis over from keyroll: -acl -config -replicaof -slaveof -sync -psync -replconf
	// -failover -shutdown -module -debug -monitor -cluster (unless unsafeAllowAdminCommands is set);
	// a rule that grants one of them by name, or +@admin, is refused.
	// +optional
	// +kubebuilder:default={"~*","&*","+@all"}
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:Pattern=`^[~&%+\-@a-zA-Z0-9_:*?|\[\]{}./]+$`
	// +kubebuilder:validation:XValidation:rule="self.all(r, !(r in ['on', 'off', 'nopass', 'reset', 'resetpass']) && !r.startsWith('>') && !r.startsWith('<') && !r.startsWith('#'))",message="aclRules may hold only key, channel and command rules; passwords and user state are managed by keyroll"
	// +kubebuilder:validation:XValidation:rule="self.all(r, r in ['allkeys', 'allchannels', 'allcommands', 'nocommands', 'resetkeys', 'resetchannels'] || r.matches('^(~|%R~|%W~|%RW~|&).+$') || r.matches('^[+-]@[a-z]+$') || r.matches('^[+-][a-z][a-z0-9_-]*([|][a-z][a-z0-9_-]*)?$'))",message="aclRules: each rule must be a key pattern (~, %R~, %W~, %RW~), a channel pattern (&), a category (+@name, -@name), a command (+name, -name, +name|subcommand) or one of allkeys, allchannels, allcommands, nocommands, resetkeys, resetchannels"
	ACLRules []string `json:"aclRules,omitempty"`

	// unsafeAllowAdminCommands gives the application user whatever aclRules grant, without the
	// rules keyroll appends to deny it ACL, replication, failover, configuration, shutdown,
	// module, debug and cluster commands. Unsafe: with them, anyone holding the credential can
	// change or add Redis users, replicate the data elsewhere or stop Redis. keyroll still
	// removes users that are not its own and puts its own back, but cannot stop what is done
	// between two of its checks.
	// +optional
	UnsafeAllowAdminCommands bool `json:"unsafeAllowAdminCommands,omitempty"`
}

// VaultLeaseSource reads a dynamic credential from Vault directly.
type VaultLeaseSource struct {
	// connectionRef names the VaultConnection to use. A change replaces the credential with one
	// issued through the new connection (rolled out as a rotation); the leases obtained through
	// the old one are revoked through it.
	// +required
	ConnectionRef ConnectionReference `json:"connectionRef"`

	// path is the Vault path that issues the credential, for example database/creds/orders. A
	// change replaces the credential with one from the new path, rolled out as a rotation.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$`
	// +kubebuilder:validation:XValidation:rule="!self.split('/').exists(s, s == '.' || s == '..')",message="vaultLease.path: the segments . and .. are not allowed"
	Path string `json:"path"`

	// renewalPercent is how far into the lease's duration it is renewed, in percent.
	// +optional
	// +kubebuilder:default=67
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=90
	RenewalPercent int32 `json:"renewalPercent,omitempty"`

	// minTTL: when a renewal would leave less than this, a new credential is issued instead.
	// +optional
	// +kubebuilder:default="1m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$')",message="vaultLease.minTTL must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || (duration(self) >= duration('0s') && duration(self) <= duration('720h'))",message="vaultLease.minTTL must be between 0s and 720h"
	MinTTL *metav1.Duration `json:"minTTL,omitempty"`
}

// ConnectionReference names a cluster-scoped VaultConnection.
type ConnectionReference struct {
	// name of the VaultConnection.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// ExternalSecretSource has External Secrets Operator sync the credential: either remoteKey from a
// store, or a generator (such as a VaultDynamicSecret).
// +kubebuilder:validation:XValidation:rule="has(self.generatorRef) != has(self.remoteKey)",message="externalSecret: set exactly one of remoteKey (with storeRef) and generatorRef"
// +kubebuilder:validation:XValidation:rule="has(self.remoteKey) == has(self.storeRef)",message="externalSecret.storeRef is required with remoteKey, and only with it"
// +kubebuilder:validation:XValidation:rule="!has(self.credentialLifetime) || !has(self.refreshInterval) || !self.refreshInterval.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || !self.credentialLifetime.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || duration(self.refreshInterval) < duration(self.credentialLifetime)",message="externalSecret.refreshInterval must be shorter than externalSecret.credentialLifetime, or External Secrets Operator leaves an expired credential in place"
type ExternalSecretSource struct {
	// storeRef names the SecretStore or ClusterSecretStore that remoteKey is read from.
	// +optional
	StoreRef *StoreReference `json:"storeRef,omitempty"`

	// remoteKey is the key in the store that holds the username and password.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	RemoteKey string `json:"remoteKey,omitempty"`

	// generatorRef names a generator, such as a VaultDynamicSecret, that mints the credential.
	// +optional
	GeneratorRef *GeneratorReference `json:"generatorRef,omitempty"`

	// refreshInterval is how often External Secrets Operator refreshes the Secret.
	// +optional
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$')",message="externalSecret.refreshInterval must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || (duration(self) >= duration('0s'))",message="externalSecret.refreshInterval must not be negative"
	RefreshInterval *metav1.Duration `json:"refreshInterval,omitempty"`

	// refreshPolicy is External Secrets Operator's refresh policy.
	// +optional
	// +kubebuilder:default=Periodic
	// +kubebuilder:validation:Enum=Periodic;OnChange;CreatedOnce
	RefreshPolicy string `json:"refreshPolicy,omitempty"`

	// connectionRef names the VaultConnection keyroll uses to renew and revoke the leases External
	// Secrets Operator obtains. It takes effect when the generator hands over the raw Vault response
	// (VaultDynamicSecret resultType Raw, which includes the lease id); without it, or without Raw,
	// keyroll tracks no lease and status.credential.externalSecret.leasesTracked is false.
	// +optional
	ConnectionRef *ConnectionReference `json:"connectionRef,omitempty"`

	// credentialLifetime is how long a credential from this source lives (the Vault role's TTL).
	// keyroll reads it from the lease when the generator hands the lease over; otherwise it cannot
	// see it, and this field lets the API server refuse a refreshInterval that is not shorter.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$')",message="externalSecret.credentialLifetime must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || (duration(self) > duration('0s'))",message="externalSecret.credentialLifetime must be positive"
	CredentialLifetime *metav1.Duration `json:"credentialLifetime,omitempty"`
}

// StoreReference names a SecretStore (in the RedisCluster's namespace) or a ClusterSecretStore.
type StoreReference struct {
	// name of the store.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// kind of the store.
	// +optional
	// +kubebuilder:default=SecretStore
	// +kubebuilder:validation:Enum=SecretStore;ClusterSecretStore
	Kind string `json:"kind,omitempty"`
}

// GeneratorReference names an External Secrets generator in the RedisCluster's namespace.
type GeneratorReference struct {
	// apiVersion of the generator.
	// +optional
	// +kubebuilder:default="generators.external-secrets.io/v1alpha1"
	// +kubebuilder:validation:Enum="generators.external-secrets.io/v1alpha1"
	APIVersion string `json:"apiVersion,omitempty"`

	// kind of the generator.
	// +optional
	// +kubebuilder:default=VaultDynamicSecret
	// +kubebuilder:validation:Enum=VaultDynamicSecret;ClusterGenerator
	Kind string `json:"kind,omitempty"`

	// name of the generator.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}
