package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What a RedisCluster reports: its phase, nodes, primary and rollout.

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

	// rotateNowAcknowledged is the last value of the keyroll.dev/rotate-now annotation acted upon;
	// a value over 256 characters is recorded as sha256:<its digest in hex>.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	RotateNowAcknowledged string `json:"rotateNowAcknowledged,omitempty"`

	// dataPlaneUpgradeAcknowledged is the last value of the keyroll.dev/upgrade-data-plane
	// annotation acted upon: every Redis pod was restarted onto this keyroll's data plane. A value
	// over 256 characters is recorded as sha256:<its digest in hex>.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	DataPlaneUpgradeAcknowledged string `json:"dataPlaneUpgradeAcknowledged,omitempty"`

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

	// oldUserClients are the clients keyroll found logged in on a Redis node as a superseded
	// credential's user, the rollout done, that are not listed consumers: while there are any, the
	// user is not retired (rollout.unlistedClients).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	OldUserClients []OldUserClient `json:"oldUserClients,omitempty"`

	// consumers are the workloads the last rollout of a credential used: the listed ones, those
	// rollout.discoverConsumers found, and those rollout.unlistedClients Restart restarted; and
	// the workloads found referencing the credentials Secret that keyroll does not restart.
	// +optional
	// +kubebuilder:validation:MaxItems=128
	Consumers []ConsumerInUse `json:"consumers,omitempty"`
}

// ConsumerInUse is a workload a rollout used, and how keyroll knows of it.
type ConsumerInUse struct {
	// kind of the workload (Deployment, StatefulSet, DaemonSet; CronJob, Job or Pod for one that
	// is only reported).
	// +kubebuilder:validation:MaxLength=64
	Kind string `json:"kind"`

	// name of the workload, in the RedisCluster's namespace.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// via is how keyroll knows it: Listed (spec.rollout.consumers), Discovered (its pod template
	// references the credentials Secret, rollout.discoverConsumers) or LoggedIn (its pods were
	// logged in with a superseded user, rollout.unlistedClients Restart).
	// +kubebuilder:validation:Enum=Listed;Discovered;LoggedIn
	Via ConsumerVia `json:"via"`

	// references say where a discovered workload's pod template uses the credentials Secret
	// (env, envFrom, volume, projected volume, with the container or volume named).
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=256
	References []string `json:"references,omitempty"`

	// restarted says that keyroll restarts it at a rollout; false for a workload it only reports
	// (a CronJob gets the new credential with its next Job; one running now keeps the old one).
	Restarted bool `json:"restarted"`
}

// ConsumerVia is how keyroll knows of a consumer.
type ConsumerVia string

// The ways keyroll knows of a consumer.
const (
	ConsumerListed     ConsumerVia = "Listed"
	ConsumerDiscovered ConsumerVia = "Discovered"
	ConsumerLoggedIn   ConsumerVia = "LoggedIn"
)

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

// OldUserClient is a client logged in on a Redis node as a user keyroll is about to retire.
type OldUserClient struct {
	// user is the superseded credential's user it is logged in as.
	// +kubebuilder:validation:MaxLength=256
	User string `json:"user"`

	// workload is what the client's pod belongs to (Deployment/api, CronJob/report, Pod/debug),
	// of the cluster's namespace; "a client of another namespace" for a pod of another (which
	// workload it is, is not this namespace's to know); empty when the address is no pod's; or
	// "unknown: ..." when a Redis node's clients could not be read (its CLIENT LIST over
	// keyroll's bound, or no answer), standing for whoever may be logged in there.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Workload string `json:"workload,omitempty"`

	// address is the client's IP address, as the Redis node sees it.
	// +kubebuilder:validation:MaxLength=64
	Address string `json:"address"`

	// connections is how many connections it has open as the user, over every node.
	Connections int32 `json:"connections"`

	// since is when keyroll first saw it.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}
