package v1beta1

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What a RedisCluster asks for: its Redis, storage, rotation schedule, rollout and network policy.

// DeletionPolicy says what happens to Vault leases when a RedisCluster is deleted.
// +kubebuilder:validation:Enum=Revoke;Retain
type DeletionPolicy string

const (
	// DeletionRevoke revokes every lease in the ledger before the RedisCluster goes away.
	DeletionRevoke DeletionPolicy = "Revoke"
	// DeletionRetain leaves the leases to expire on their own.
	DeletionRetain DeletionPolicy = "Retain"
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

// RedisClusterSpec is the desired state of a RedisCluster.
// +kubebuilder:validation:XValidation:rule="!has(self.tls) || !has(self.tls.clientAuth) || self.tls.clientAuth != 'Required' || !has(self.vaultPlugin)",message="spec.tls.clientAuth Required cannot go with spec.vaultPlugin: Vault's Redis plugin shows no client certificate",fieldPath=".tls.clientAuth"
// +kubebuilder:validation:XValidation:rule="has(self.tls) == has(oldSelf.tls)",message="spec.tls cannot be added or removed after creation: every client would lose the cluster at once; create a new RedisCluster",fieldPath=".tls"
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

	// tls makes Redis speak TLS only: clients, replication, keyroll and the probes all connect
	// with TLS, and a plaintext connection is refused. The certificate is the owner's
	// (certificateSecretRef) or, without one, made by keyroll from a CA of the cluster's own. It is
	// set when the RedisCluster is created and cannot be added or removed afterwards (clients
	// would lose the cluster at once); a renewed certificate is taken by every node without a
	// restart.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// TLSSpec is the certificate the Redis nodes serve.
// +kubebuilder:validation:XValidation:rule="!has(self.clientAuth) || self.clientAuth != 'Required' || has(self.certificateSecretRef)",message="spec.tls.clientAuth Required needs certificateSecretRef: your clients' certificates come from your CA, which must sign the nodes' too",fieldPath=".clientAuth"
// +kubebuilder:validation:XValidation:rule="has(self.certificateSecretRef) == has(oldSelf.certificateSecretRef)",message="spec.tls.certificateSecretRef cannot be added or removed after creation: the clients trust the CA of the certificate they were given; create a new RedisCluster",fieldPath=".certificateSecretRef"
type TLSSpec struct {
	// certificateSecretRef names a Secret in the RedisCluster's namespace with tls.crt (the
	// serving certificate, intermediates after it), tls.key (its private key) and ca.crt (the
	// CA that signed it), as cert-manager writes a Certificate's Secret. The Secret must carry
	// the label keyroll.dev/tls-certificate=<RedisCluster's name>: keyroll uses no other Secret
	// of the namespace. The certificate must name <name>.<namespace>.svc (the client Service;
	// keyroll and the probes verify this name) and *.<name>-headless.<namespace>.svc (each node).
	// keyroll checks it and copies it into Secret <name>-tls, which the Redis pods mount. Without
	// it keyroll makes a CA for the cluster (Secret <name>-tls-ca, which no pod mounts) and signs
	// the nodes' certificate with it: the certificate is replaced at two thirds of its 90 days,
	// the CA at two thirds of its year, and a replaced CA stays trusted (in ca.crt) until it
	// expires.
	// +optional
	CertificateSecretRef *LocalSecretReference `json:"certificateSecretRef,omitempty"`

	// clientAuth Required makes every client show a certificate of the cluster's CA (Redis's
	// tls-auth-clients yes) besides its user and password: keyroll, the probes and the replicas
	// show the nodes' certificate; your clients need certificates of their own from your CA, so
	// it needs certificateSecretRef, and it cannot go with vaultPlugin (Vault's Redis plugin shows
	// none). None (the default) asks clients for no certificate. Set at creation.
	// +optional
	// +kubebuilder:default=None
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.tls.clientAuth cannot change after creation: clients without a certificate would be cut off at once; create a new RedisCluster"
	ClientAuth TLSClientAuth `json:"clientAuth,omitempty"`
}

// TLSClientAuth says whether Redis asks TLS clients for a certificate.
// +kubebuilder:validation:Enum=None;Required
type TLSClientAuth string

const (
	// TLSClientAuthNone asks clients for no certificate: they log in with their user and password.
	TLSClientAuthNone TLSClientAuth = "None"
	// TLSClientAuthRequired refuses a client without a certificate of the cluster's CA.
	TLSClientAuthRequired TLSClientAuth = "Required"
)

// LocalSecretReference names a Secret in the object's own namespace.
type LocalSecretReference struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
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

	// discoverConsumers makes consumers, without listing them, of every Deployment, StatefulSet and
	// DaemonSet in the namespace whose pod template references the credentials Secret (env,
	// envFrom, a volume or a projected volume): at the start of each rollout keyroll looks them
	// up, restarts them as it restarts the listed ones, and lists in status.consumers what it used.
	// Other workloads that reference the Secret (a CronJob, a Job, a bare pod) are listed there
	// too, and never restarted.
	// +optional
	DiscoverConsumers bool `json:"discoverConsumers,omitempty"`

	// unlistedClients says what happens when, the rollout done, a superseded credential's user is
	// still logged in on a Redis node from a client that is not one of the consumers' pods (a
	// CronJob, another team's service, a port-forward). keyroll looks (CLIENT LIST on every node)
	// before it retires the user, and names each such client in status.oldUserClients, in the
	// condition LeasesRevoked and in an event.
	// +optional
	UnlistedClients UnlistedClientsSpec `json:"unlistedClients,omitempty"`
}

// UnlistedClientsSpec says what keyroll does about clients still logged in with a superseded
// credential that are not listed consumers.
type UnlistedClientsSpec struct {
	// action is Wait (the default): the user stays on every node, and its lease live, while such a
	// client is logged in with it, for maxHold at most; Proceed:
	// the retirement waits for grace, then the user leaves the nodes, which cuts those clients off,
	// and an event says whom; or Restart: a client's Deployment, StatefulSet or DaemonSet in the
	// cluster's namespace is restarted as a listed consumer is, one at a time, each only while
	// the previous one is Ready (status.consumers lists it); any other client is reported and
	// waited for, as with Wait. A user whose lease is gone from Vault (revoked outside keyroll,
	// or ended) never waits for clients: it leaves the nodes once the rollout is done.
	// +optional
	// +kubebuilder:validation:Enum=Wait;Proceed;Restart
	Action UnlistedClientsAction `json:"action,omitempty"`

	// grace is how long Proceed waits for such clients to log in with the new credential, from
	// when keyroll first saw them (default 10m). Between 0s and 24h.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$')",message="rollout.unlistedClients.grace must be a duration such as 30s, 10m or 1h"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+)$') || duration(self) <= duration('24h')",message="rollout.unlistedClients.grace must be at most 24h"
	Grace *metav1.Duration `json:"grace,omitempty"`

	// maxHold is how long Wait and Restart keep a superseded user, and renew its lease, for
	// clients that are not listed consumers, from when keyroll first saw them (default 6h); then
	// the user is retired as Proceed retires it, cutting them off, and an event says whom. Each
	// superseded user is held, and retired, on its own. Between 1m and 168h.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+$')",message="rollout.unlistedClients.maxHold must be a duration such as 30m or 6h"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]*)?(ns|us|ms|s|m|h))+$') || (duration(self) >= duration('1m') && duration(self) <= duration('168h'))",message="rollout.unlistedClients.maxHold must be between 1m and 168h"
	MaxHold *metav1.Duration `json:"maxHold,omitempty"`
}

// UnlistedClientsAction is what keyroll does about unlisted clients of a superseded credential.
type UnlistedClientsAction string

// The actions about unlisted clients.
const (
	UnlistedClientsWait    UnlistedClientsAction = "Wait"
	UnlistedClientsProceed UnlistedClientsAction = "Proceed"
	UnlistedClientsRestart UnlistedClientsAction = "Restart"
)

// DefaultUnlistedClientsGrace is how long Proceed waits when rollout.unlistedClients.grace is not set.
const DefaultUnlistedClientsGrace = 10 * time.Minute

// DefaultUnlistedClientsMaxHold is how long Wait and Restart hold a superseded user for unlisted
// clients when rollout.unlistedClients.maxHold is not set.
const DefaultUnlistedClientsMaxHold = 6 * time.Hour

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
