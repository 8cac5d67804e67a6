package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The ledger in a RedisCluster's status: the current credential and every lease keyroll holds.

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

	// deliveredAt is when the credential had reached every Redis node and the consumers' Secret,
	// and every consumer had rolled out onto it; unset until then. A scheduled rotation waits for
	// it and comes at the schedule's first activation after it, so that no credential is replaced
	// before anyone could use it.
	// +optional
	DeliveredAt *metav1.Time `json:"deliveredAt,omitempty"`

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
