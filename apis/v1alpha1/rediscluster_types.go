package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// CredentialSource says where a RedisCluster's credential comes from.
// +kubebuilder:validation:Enum=VaultLease;ExternalSecret
type CredentialSource string

const (
	// SourceVaultLease: the operator reads the Vault path itself and holds the lease.
	SourceVaultLease CredentialSource = "VaultLease"
	// SourceExternalSecret: the operator creates an ExternalSecret and External Secrets Operator syncs it.
	SourceExternalSecret CredentialSource = "ExternalSecret"
)

// DeletionPolicy says what happens to Vault leases when a RedisCluster is deleted.
// +kubebuilder:validation:Enum=Revoke;Retain
type DeletionPolicy string

const (
	// DeletionRevoke revokes every lease in the ledger before the RedisCluster goes away.
	DeletionRevoke DeletionPolicy = "Revoke"
	// DeletionRetain leaves the leases to expire on their own.
	DeletionRetain DeletionPolicy = "Retain"
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

// RedisPodsPolicy says what a rotation does to the Redis pods.
type RedisPodsPolicy string

const (
	// RedisPodsLive changes the users on the running Redis nodes; no pod restarts.
	RedisPodsLive RedisPodsPolicy = "Live"
	// RedisPodsRestart also restarts the Redis pods, one at a time.
	RedisPodsRestart RedisPodsPolicy = "Restart"
)

// PodAntiAffinityPolicy says how the Redis pods of a cluster are kept off each other's nodes.
// +kubebuilder:validation:Enum=Preferred;Required;None
type PodAntiAffinityPolicy string

const (
	// PodAntiAffinityPreferred asks the scheduler to put each Redis pod on a node (hostname) without
	// another pod of the cluster, and lets pods share a node when no other fits.
	PodAntiAffinityPreferred PodAntiAffinityPolicy = "Preferred"
	// PodAntiAffinityRequired never puts two Redis pods of the cluster on one node: a pod with no
	// node left stays Pending.
	PodAntiAffinityRequired PodAntiAffinityPolicy = "Required"
	// PodAntiAffinityNone sets no pod anti-affinity.
	PodAntiAffinityNone PodAntiAffinityPolicy = "None"
)

// LeaseState is the state of one lease in the ledger.
// +kubebuilder:validation:Enum=Active;Superseded;Revoking
type LeaseState string

const (
	// LeaseActive is the lease of the current credential.
	LeaseActive LeaseState = "Active"
	// LeaseSuperseded is a lease replaced by a newer one; it stays live until the rollout is done.
	LeaseSuperseded LeaseState = "Superseded"
	// LeaseRevoking is a lease whose revocation has been asked for and not yet confirmed.
	LeaseRevoking LeaseState = "Revoking"
)

// Phase summarises a RedisCluster's state for kubectl get.
// +kubebuilder:validation:Enum=Pending;Issuing;Ready;Rolling;Degraded;Deleting
type Phase string

const (
	PhasePending  Phase = "Pending"
	PhaseIssuing  Phase = "Issuing"
	PhaseReady    Phase = "Ready"
	PhaseRolling  Phase = "Rolling"
	PhaseDegraded Phase = "Degraded"
	PhaseDeleting Phase = "Deleting"
)

// RedisClusterSpec is the desired state of a RedisCluster.
// +kubebuilder:validation:XValidation:rule="has(self.storage) == has(oldSelf.storage) && (!has(self.storage) || self.storage == oldSelf.storage)",message="spec.storage cannot be added, removed or changed after creation: a StatefulSet cannot change its volume claims; create a new RedisCluster",fieldPath=".storage"
type RedisClusterSpec struct {
	// replicas is the number of Redis pods: one primary, the rest its replicas.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=15
	Replicas int32 `json:"replicas,omitempty"`

	// image is the Redis image repository, without a tag; the tag is version.
	// +optional
	// +kubebuilder:default="docker.io/library/redis"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$`
	Image string `json:"image,omitempty"`

	// version is the Redis version, used as the image tag (for example 7.2, 7.2.5 or 7.2-alpine).
	// Redis 6.2 or later is needed (ACLs, and FAILOVER). (The rule leaves a value the pattern
	// refuses to the pattern's message.)
	// +optional
	// +kubebuilder:default="7.2"
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?(-[a-z0-9]+)?$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[0-9]{1,4}[.][0-9]{1,4}([.][0-9]{1,4})?(-[a-z0-9]+)?$') || int(self.split('-')[0].split('.')[0]) > 6 || (int(self.split('-')[0].split('.')[0]) == 6 && int(self.split('-')[0].split('.')[1]) >= 2)",message="version: Redis 6.2 or later is required (ACLs, and FAILOVER to hand the primary role over before a restart)"
	Version string `json:"version,omitempty"`

	// resources of the Redis container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// storage for Redis data: a PersistentVolumeClaim per pod. Without it, pods use an emptyDir,
	// which goes with the pod. It is set when the RedisCluster is created and cannot be added,
	// removed or changed afterwards (a StatefulSet cannot change its volume claims).
	// +optional
	Storage *StorageSpec `json:"storage,omitempty"`

	// podAntiAffinity keeps the Redis pods on different nodes (kubernetes.io/hostname), so that
	// losing a node loses one of them only. Preferred (the default) asks the scheduler for it and
	// lets pods share a node when no other fits; Required never puts two on one node (a pod with
	// no node left stays Pending); None sets no anti-affinity. A change restarts the Redis pods,
	// one at a time.
	// +optional
	// +kubebuilder:default=Preferred
	PodAntiAffinity PodAntiAffinityPolicy `json:"podAntiAffinity,omitempty"`

	// networkPolicy, when enabled, makes keyroll keep a NetworkPolicy <name>-redis that admits
	// traffic to the Redis pods (TCP 6379) only from keyroll's manager, the cluster's own Redis
	// pods, the pods of the consumers in rollout.consumers, and the peers in from.
	// +optional
	NetworkPolicy *NetworkPolicySpec `json:"networkPolicy,omitempty"`

	// credentials says where the Redis credential comes from and where it is written.
	// +required
	Credentials CredentialsSpec `json:"credentials"`

	// rotation schedules credential rotations.
	// +optional
	Rotation RotationSpec `json:"rotation,omitempty"`

	// rollout says how pods and consumer workloads move to a new credential.
	// +optional
	Rollout RolloutSpec `json:"rollout,omitempty"`

	// deletionPolicy says whether the leases are revoked when the RedisCluster is deleted.
	// +optional
	// +kubebuilder:default=Revoke
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`

	// vaultPlugin keeps the administrative user of Vault's Redis database plugin on every Redis
	// node, so that a Vault administrator can point the database secrets engine at this cluster's
	// client Service: Vault creates and deletes users on the primary, and keyroll carries them to
	// every node.
	// +optional
	VaultPlugin *VaultPluginSpec `json:"vaultPlugin,omitempty"`
}

// VaultPluginSpec is the Redis user of Vault's database plugin.
type VaultPluginSpec struct {
	// username of the plugin's Redis user.
	// +optional
	// +kubebuilder:default=vault
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.@-]+$`
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('keyroll-') && self != 'default'",message="vaultPlugin.username must not be default or start with keyroll-: those users are keyroll's own"
	Username string `json:"username,omitempty"`

	// passwordSecretRef names a Secret in the RedisCluster's namespace, and the key in it, that
	// holds the user's password (the administrator keeps it, and gives the same password to
	// Vault). The Secret must carry the label keyroll.dev/vault-plugin-password=<RedisCluster's
	// name>: keyroll uses no other Secret of the namespace. Without it keyroll generates a password and keeps it, with the username, in Secret
	// <name>-vault-plugin (keys username and password) for the administrator to read.
	// +optional
	PasswordSecretRef *LocalSecretKeyReference `json:"passwordSecretRef,omitempty"`
}

// LocalSecretKeyReference names one key of a Secret in the object's own namespace.
type LocalSecretKeyReference struct {
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

// StorageSpec is a persistent volume per Redis pod.
type StorageSpec struct {
	// size of each pod's volume.
	// +required
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="storage.size must be greater than zero"
	Size resource.Quantity `json:"size"`

	// storageClassName of the volumes; empty uses the cluster's default class.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	StorageClassName *string `json:"storageClassName,omitempty"`
}

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
	// keyroll tracks no lease and status.credential.leasesTracked is false.
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

// RotationSpec schedules rotations: a new credential, a rollout, then revocation of the old lease.
type RotationSpec struct {
	// schedule is a cron schedule (robfig/cron syntax: five fields, or a descriptor such as
	// @daily or @every 6h), optionally prefixed with CRON_TZ=<zone>. Without it the credential
	// rotates only when its lease cannot be renewed or on request (annotation keyroll.dev/rotate-now).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^((CRON_TZ|TZ)=[A-Za-z0-9_/+-]+ +)?(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|@every +([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+|[^ ]+( +[^ ]+){4})$`
	Schedule string `json:"schedule,omitempty"`

	// paused stops scheduled and requested rotations; renewals go on.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// maintenanceWindow restricts scheduled rotations to a daily window.
	// +optional
	MaintenanceWindow *MaintenanceWindow `json:"maintenanceWindow,omitempty"`
}

// MaintenanceWindow is a daily time window.
type MaintenanceWindow struct {
	// start is the time of day the window opens, HH:MM in timeZone.
	// +required
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	Start string `json:"start"`

	// duration is how long the window stays open.
	// +required
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$')",message="maintenanceWindow.duration must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || (duration(self) >= duration('10m') && duration(self) <= duration('24h'))",message="maintenanceWindow.duration must be between 10m and 24h"
	Duration metav1.Duration `json:"duration"`

	// timeZone is an IANA time zone name; default UTC.
	// +optional
	// +kubebuilder:default=UTC
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_/+-]+$`
	TimeZone string `json:"timeZone,omitempty"`
}

// RolloutSpec says how pods and consumers move to a new credential.
type RolloutSpec struct {
	// readinessTimeout is how long each restarted Redis pod may take to become Ready and in sync,
	// and each restarted consumer to roll out, before the rollout is reported stalled (it goes on
	// once they are). Between 10s and 1h.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$')",message="rollout.readinessTimeout must be a duration such as 90s, 5m or 1h30m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|-?([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || (duration(self) >= duration('10s') && duration(self) <= duration('1h'))",message="rollout.readinessTimeout must be between 10s and 1h"
	ReadinessTimeout *metav1.Duration `json:"readinessTimeout,omitempty"`

	// redisPods says what a rotation does to the Redis pods. Live (the default) changes the users
	// on the running nodes and restarts no pod: connections and data stay. Restart also restarts
	// the pods, one at a time, once the new user is on every node and before the consumers.
	// +optional
	// +kubebuilder:default=Live
	// +kubebuilder:validation:Enum=Live;Restart
	RedisPods RedisPodsPolicy `json:"redisPods,omitempty"`

	// consumers are workloads in the same namespace restarted, one after the other, once the Redis
	// pods run the new credential.
	// +optional
	// +listType=map
	// +listMapKey=kind
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Consumers []ConsumerReference `json:"consumers,omitempty"`
}

// NetworkPolicySpec is the NetworkPolicy keyroll keeps for the Redis pods.
type NetworkPolicySpec struct {
	// enabled makes keyroll keep the NetworkPolicy; false (the default) keeps none, and removes
	// the one it kept.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// from are further peers admitted to the Redis pods: clients that are not consumers.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	From []networkingv1.NetworkPolicyPeer `json:"from,omitempty"`
}

// ConsumerReference names a workload that uses the credentials Secret.
type ConsumerReference struct {
	// kind of the workload.
	// +required
	// +kubebuilder:validation:Enum=Deployment;StatefulSet;DaemonSet
	Kind string `json:"kind"`

	// name of the workload, in the RedisCluster's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// RedisClusterStatus is the observed state of a RedisCluster. It never holds a password.
type RedisClusterStatus struct {
	// observedGeneration is the generation last reconciled successfully.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase summarises the state.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// readyReplicas is the number of Redis pods that are Ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// conditions: Ready, CredentialsReady, RolloutProgressing, Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// credential is the current credential (never its password).
	// +optional
	Credential *CredentialStatus `json:"credential,omitempty"`

	// leases is the ledger: every lease obtained and not yet revoked.
	// +optional
	// +listType=map
	// +listMapKey=leaseID
	// +kubebuilder:validation:MaxItems=64
	Leases []LeaseRecord `json:"leases,omitempty"`

	// rollout is the progress of the rollout to a new credential, while one runs.
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`

	// rotateNowAcknowledged is the last value of the keyroll.dev/rotate-now annotation acted upon.
	// +optional
	RotateNowAcknowledged string `json:"rotateNowAcknowledged,omitempty"`

	// primary is the Redis pod that is the cluster's primary: the client Service selects it.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Primary string `json:"primary,omitempty"`

	// nodes are the Redis nodes and the set of users each was last confirmed to have.
	// +optional
	// +listType=map
	// +listMapKey=pod
	// +kubebuilder:validation:MaxItems=15
	Nodes []NodeStatus `json:"nodes,omitempty"`

	// retiringUsers are Redis users being removed from every node: those of superseded
	// credentials once the rollout is done, or of a lease revoked outside keyroll. It holds the
	// users of every superseded lease and credential at once (at most 64 and 16), and of leases
	// revoked outside keyroll.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=128
	RetiringUsers []string `json:"retiringUsers,omitempty"`
}

// NodeStatus is what keyroll last confirmed on one Redis node (one run of a pod's Redis).
type NodeStatus struct {
	// pod is the Redis pod.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Pod string `json:"pod"`

	// podUID and startedAt identify the run of Redis that was confirmed: a restarted Redis is
	// confirmed again.
	// +optional
	PodUID types.UID `json:"podUID,omitempty"`
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// usersVersion identifies (as a hash) the set of users the node was confirmed to have.
	// +optional
	UsersVersion string `json:"usersVersion,omitempty"`

	// aclDigest identifies (as a hash) the node's whole ACL (ACL LIST) as keyroll confirmed it:
	// keyroll compares it with the node's every --redis-users-check-interval, and a user added,
	// changed or removed outside keyroll shows as a difference.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	ACLDigest string `json:"aclDigest,omitempty"`

	// confirmedAt is when keyroll last confirmed the node.
	// +optional
	ConfirmedAt *metav1.Time `json:"confirmedAt,omitempty"`
}

// CredentialStatus describes the current credential.
type CredentialStatus struct {
	// version is a hash that identifies the credential (not derived from the password alone).
	// +optional
	Version string `json:"version,omitempty"`

	// source the credential came from.
	// +optional
	Source CredentialSource `json:"source,omitempty"`

	// path is the Vault path the credential was read from (VaultLease mode): a change of
	// vaultLease.path replaces the credential with one from the new path.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Path string `json:"path,omitempty"`

	// username is the Redis user of the credential.
	// +optional
	Username string `json:"username,omitempty"`

	// refreshRequestedAt is when keyroll last asked External Secrets Operator for a new credential
	// (ExternalSecret mode: a rotation, or a lease that can no longer be renewed).
	// +optional
	RefreshRequestedAt *metav1.Time `json:"refreshRequestedAt,omitempty"`

	// leaseID is the Vault lease of the credential, when one is tracked.
	// +optional
	LeaseID string `json:"leaseID,omitempty"`

	// issuedAt is when the credential was issued.
	// +optional
	IssuedAt *metav1.Time `json:"issuedAt,omitempty"`

	// expiresAt is when the lease expires unless renewed.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`

	// renewable says whether Vault allows renewing the lease.
	// +optional
	Renewable bool `json:"renewable,omitempty"`

	// leaseDuration is the duration Vault granted when the lease was issued; renewals ask for it again.
	// +optional
	LeaseDuration *metav1.Duration `json:"leaseDuration,omitempty"`

	// renewalCapped says Vault granted less than asked at the last renewal: the lease has reached
	// its max TTL and is replaced before it lapses.
	// +optional
	RenewalCapped bool `json:"renewalCapped,omitempty"`

	// tokenAccessor identifies (without revealing it) the Vault token that created the lease:
	// Vault revokes the lease with that token, so keyroll keeps the token alive while the lease
	// lives.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	TokenAccessor string `json:"tokenAccessor,omitempty"`

	// tokenEndsAt is when the token that created the lease ends for good (the auth role's token
	// max TTL), when it has one: Vault revokes the lease then, so keyroll rotates the credential
	// early enough that the new one is rolled out and this lease revoked before.
	// +optional
	TokenEndsAt *metav1.Time `json:"tokenEndsAt,omitempty"`

	// lastRenewal is when the lease was last renewed.
	// +optional
	LastRenewal *metav1.Time `json:"lastRenewal,omitempty"`

	// nextRenewal is when the lease will next be renewed.
	// +optional
	NextRenewal *metav1.Time `json:"nextRenewal,omitempty"`

	// lastRotation is when the credential was last rotated (or first issued).
	// +optional
	LastRotation *metav1.Time `json:"lastRotation,omitempty"`

	// nextRotation is when the next scheduled rotation is due.
	// +optional
	NextRotation *metav1.Time `json:"nextRotation,omitempty"`

	// rotationReason says why keyroll replaced the previous credential with this one, in
	// keyroll's rotation reasons: NoCredential for the first, ScheduledRotation, MissedRotation,
	// RotateNowRequested, TokenEnding (the Vault token that created the previous lease was to end before
	// it), RenewalCapped, NotRenewable, LeaseGone, LeaseExpired or SourceChanged. In ExternalSecret
	// mode it is why keyroll last asked External Secrets Operator for a new credential (with
	// refreshRequestedAt), kept by the credential that answers the request; empty for a credential
	// External Secrets Operator refreshed on its own.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	RotationReason string `json:"rotationReason,omitempty"`

	// leasesTracked is false in ExternalSecret mode when the generator does not hand over the
	// lease: keyroll then can neither renew nor revoke it.
	// +optional
	LeasesTracked *bool `json:"leasesTracked,omitempty"`

	// leaseEndedEarlyAfter (ExternalSecret mode): a tracked lease was found gone from Vault this long
	// after it was issued, before its expiry, most likely with External Secrets Operator's own Vault
	// token, which keyroll cannot keep alive. Cleared once a later lease outlives that age.
	// +optional
	LeaseEndedEarlyAfter *metav1.Duration `json:"leaseEndedEarlyAfter,omitempty"`

	// cutOff (ExternalSecret mode): this credential's lease is gone from Vault before its expiry
	// (revoked outside keyroll, or ended with External Secrets Operator's token) and, with
	// onRevokedOutside CutOff, its user was taken off every Redis node. keyroll delivers it no
	// more and waits for the new credential it asked External Secrets Operator for.
	// +optional
	CutOff bool `json:"cutOff,omitempty"`

	// supersededUsers are the Redis users of replaced credentials whose leases are not tracked
	// (ExternalSecret mode): they stay in the Redis pods' aclfile until the rollout is done.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	SupersededUsers []string `json:"supersededUsers,omitempty"`
}

// LeaseRecord is one lease in the ledger.
type LeaseRecord struct {
	// leaseID is the Vault lease ID.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	LeaseID string `json:"leaseID"`

	// state of the lease.
	// +required
	State LeaseState `json:"state"`

	// version of the credential the lease belongs to.
	// +optional
	Version string `json:"version,omitempty"`

	// username of the credential the lease belongs to.
	// +optional
	Username string `json:"username,omitempty"`

	// connection is the VaultConnection the lease was obtained through; it is renewed and revoked
	// through it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Connection string `json:"connection,omitempty"`

	// tokenAccessor identifies the Vault token that created the lease (never the token itself).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	TokenAccessor string `json:"tokenAccessor,omitempty"`

	// issuedAt is when the lease was obtained.
	// +optional
	IssuedAt *metav1.Time `json:"issuedAt,omitempty"`

	// expiresAt is when the lease expires unless renewed.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`

	// lastRenewal is when a superseded lease was last renewed: keyroll keeps the leases of
	// credentials that consumers not yet restarted still use alive until the rollout ends.
	// +optional
	LastRenewal *metav1.Time `json:"lastRenewal,omitempty"`

	// renewalCapped says that Vault renews a superseded lease no further (its max TTL): the
	// rollout must be done by expiresAt.
	// +optional
	RenewalCapped bool `json:"renewalCapped,omitempty"`

	// supersededBy is the version of the credential that superseded this lease's.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	SupersededBy string `json:"supersededBy,omitempty"`
}

// RolloutStatus is the progress of a rollout.
type RolloutStatus struct {
	// targetVersion is the credential version being rolled out.
	// +optional
	TargetVersion string `json:"targetVersion,omitempty"`

	// cause is what the rollout is for: a new credential (Credential), or a new pod template of
	// the Redis pods (PodTemplate: spec.version, image, resources, ...), which restarts them only.
	// +optional
	// +kubebuilder:validation:Enum=Credential;PodTemplate
	Cause RolloutCause `json:"cause,omitempty"`

	// podsUpdated is the number of Redis pods running targetVersion and Ready.
	// +optional
	PodsUpdated int32 `json:"podsUpdated,omitempty"`

	// podInFlight is the pod restarted last and not yet Ready on targetVersion.
	// +optional
	PodInFlight string `json:"podInFlight,omitempty"`

	// podRestartedAt is when podInFlight was restarted.
	// +optional
	PodRestartedAt *metav1.Time `json:"podRestartedAt,omitempty"`

	// consumersUpdated is the number of consumers whose rollout to targetVersion is complete.
	// +optional
	ConsumersUpdated int32 `json:"consumersUpdated,omitempty"`

	// consumerRestartedAt is when the consumer being rolled out was restarted: it must have
	// rolled out within readinessTimeout, or the rollout is reported stalled.
	// +optional
	ConsumerRestartedAt *metav1.Time `json:"consumerRestartedAt,omitempty"`

	// startedAt is when the rollout started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
}

// RolloutCause is what a rollout is for.
type RolloutCause string

const (
	RolloutForCredential  RolloutCause = "Credential"
	RolloutForPodTemplate RolloutCause = "PodTemplate"
)

// RedisCluster runs Redis with a credential from Vault that is renewed, rotated on a schedule and
// rolled out to its pods and consumers one at a time, each only while the previous one is Ready.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=rdc,categories=keyroll
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 52",message="metadata.name must be at most 52 characters: the Redis pods' controller-revision-hash label is the name and 11 more characters, and must fit in 63"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.credentials.secretName) || !(self.spec.credentials.secretName in [self.metadata.name + '-acl', self.metadata.name + '-keyroll', self.metadata.name + '-eso', self.metadata.name + '-vault-plugin'])",message="spec.credentials.secretName must not be <name>-acl, <name>-keyroll, <name>-eso or <name>-vault-plugin: keyroll writes those Secrets itself",fieldPath=".spec.credentials.secretName"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.status.credential.expiresAt`
// +kubebuilder:printcolumn:name="Next-Rotation",type=string,JSONPath=`.status.credential.nextRotation`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.credentials.source`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RedisCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state.
	// +required
	Spec RedisClusterSpec `json:"spec"`

	// status is the observed state.
	// +optional
	Status RedisClusterStatus `json:"status,omitempty"`
}

// RedisClusterList is a list of RedisClusters.
//
// +kubebuilder:object:root=true
type RedisClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RedisCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&RedisCluster{}, &RedisClusterList{})
}
