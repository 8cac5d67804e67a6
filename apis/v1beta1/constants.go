package v1beta1

// Finalizer is set on every RedisCluster before anything is created in Vault; it is removed only
// once every lease in the ledger is revoked (or deletionPolicy is Retain).
const Finalizer = "keyroll.dev/revoke-leases"

// ConnectionFinalizer is set on every VaultConnection; it is removed only once no RedisCluster
// uses the connection or holds a lease obtained through it, so that the tokens that keep those
// leases alive are renewed until then.
const ConnectionFinalizer = "keyroll.dev/in-use"

// Annotations and labels.
const (
	// AnnotationRotateNow on a RedisCluster asks for one rotation now. Any new value asks again;
	// the value acted upon is acknowledged in status.rotateNowAcknowledged.
	AnnotationRotateNow = "keyroll.dev/rotate-now"

	// AnnotationCredentialVersion on Redis pods and on consumers' pod templates holds the version
	// hash of the credential they run with (never a timestamp).
	AnnotationCredentialVersion = "keyroll.dev/credential-version"

	// AnnotationRefreshRequested on an ExternalSecret keyroll owns holds when keyroll last asked
	// External Secrets Operator for a new credential; a new value makes it refresh at once.
	AnnotationRefreshRequested = "keyroll.dev/refresh-requested"

	// LabelCluster names the RedisCluster an object belongs to.
	LabelCluster = "keyroll.dev/cluster"

	// LabelRole on a Redis pod says whether it is the cluster's primary (RolePrimary) or a
	// replica (RoleReplica); keyroll keeps it, and the client Service selects the primary by it.
	LabelRole   = "keyroll.dev/role"
	RolePrimary = "primary"
	RoleReplica = "replica"

	// AnnotationPodTemplate on the Redis pods' template is a hash of the template (the credential
	// version apart): a pod whose value differs was made from an older template, and is restarted.
	AnnotationPodTemplate = "keyroll.dev/pod-template"

	// AnnotationDataPlane on the Redis pods' template is the data-plane contract version it was
	// rendered under (the start script, the probe protocol, the probe sidecar's flags); a pod
	// without it was made by keyroll v0.1.0, whose contract is version 1.
	AnnotationDataPlane = "keyroll.dev/data-plane"

	// AnnotationProbeSwappedFrom on a Redis pod names the probe sidecar container that keyroll last
	// replaced by changing the sidecar's image in place: until another one runs, the change is in
	// flight.
	AnnotationProbeSwappedFrom = "keyroll.dev/probe-swapped-from"

	// AnnotationUpgradeDataPlane on a RedisCluster asks for a pending data-plane change now, outside
	// the maintenance window (and, with one replica and no storage, at all). Any new value asks
	// again; the value acted upon is acknowledged in status.dataPlaneUpgradeAcknowledged.
	AnnotationUpgradeDataPlane = "keyroll.dev/upgrade-data-plane"

	// LabelVaultPluginPassword marks the Secret that spec.vaultPlugin.passwordSecretRef names as
	// meant for that use; its value is the RedisCluster's name. keyroll uses no other Secret there.
	LabelVaultPluginPassword = "keyroll.dev/vault-plugin-password"

	// LabelTLSCertificate marks the Secret that spec.tls.certificateSecretRef names as meant for
	// that use; its value is the RedisCluster's name. keyroll uses no other Secret there.
	LabelTLSCertificate = "keyroll.dev/tls-certificate"

	// LabelVaultConnection names the VaultConnection a token Secret belongs to.
	LabelVaultConnection = "keyroll.dev/vault-connection"

	// AnnotationVaultNamespaceIdentity on a token Secret names the namespace whose login's Vault
	// tokens it holds (identity Namespace); empty: the VaultConnection's own tokens.
	AnnotationVaultNamespaceIdentity = "keyroll.dev/vault-namespace-identity"

	// LabelManagedBy marks the objects keyroll creates; the operator's Secret cache sees only these.
	LabelManagedBy = "app.kubernetes.io/managed-by"

	// ManagedByValue is the value of LabelManagedBy on objects keyroll creates.
	ManagedByValue = "keyroll"
)

// Condition types.
const (
	// ConditionReady: the object does what it was asked to do; on a RedisCluster, the summary of
	// CredentialsReady and the Redis pods' readiness.
	ConditionReady = "Ready"
	// ConditionCredentialsReady: a live credential is issued and written to the credentials Secret.
	ConditionCredentialsReady = "CredentialsReady"
	// ConditionRolloutProgressing: pods or consumers are being moved to a new credential.
	ConditionRolloutProgressing = "RolloutProgressing"
	// ConditionDegraded: something needs attention: on a RedisCluster, the summary of ScheduleValid,
	// RolloutHealthy, LeasesRevoked, SourceHealthy and TLSReady (True when one of them is False
	// for a problem), and of
	// UsersApplied when a node cannot be brought to the users (unreachable, not Ready in time,
	// refused rules).
	ConditionDegraded = "Degraded"
	// ConditionScheduleValid: spec.rotation (schedule and maintenance window) parses.
	ConditionScheduleValid = "ScheduleValid"
	// ConditionRolloutHealthy: the rollout (if one runs) moves on: no pod stuck not Ready, no consumer
	// missing or paused.
	ConditionRolloutHealthy = "RolloutHealthy"
	// ConditionLeasesRevoked: every superseded lease that should be revoked is.
	ConditionLeasesRevoked = "LeasesRevoked"
	// ConditionSourceHealthy: the credential source needs no attention (ExternalSecret mode: External
	// Secrets Operator syncs, its refresh interval and tokens fit the credential's life; VaultLease
	// mode: the ledger has room for a new lease).
	ConditionSourceHealthy = "SourceHealthy"
	// ConditionUsersApplied: every Redis node has the cluster's users (the current credential's
	// among them, confirmed by logging in as it on each node) and none of the retired ones; the
	// credentials Secret is written only once it is True for that credential.
	ConditionUsersApplied = "UsersApplied"
	// ConditionDeletionBlocked: a VaultConnection being deleted waits for the RedisClusters that
	// still use it.
	ConditionDeletionBlocked = "DeletionBlocked"
	// ConditionDataPlaneCurrent: every Redis pod runs the data-plane contract of this keyroll; when
	// False (RestartPending), the pods that do not are restarted in the maintenance window or when
	// asked (keyroll.dev/upgrade-data-plane), never by an upgrade of keyroll alone.
	ConditionDataPlaneCurrent = "DataPlaneCurrent"
	// ConditionTLSReady (spec.tls only): the owner's certificate is valid for the cluster, copied
	// into <name>-tls, and served by every Redis node that runs.
	ConditionTLSReady = "TLSReady"
)

// Condition reasons.
const (
	ReasonReconciling = "Reconciling"
	ReasonAvailable   = "Available"
	ReasonLoggedIn    = "LoggedIn"
	ReasonLoginFailed = "LoginFailed"
	// ReasonSettingsRefused: keyroll refuses a VaultConnection's settings (an audience the API
	// server accepts, a Secret outside the operator's namespace) and sends nothing to its address.
	ReasonSettingsRefused     = "SettingsRefused"
	ReasonVaultUnavailable    = "VaultUnavailable"
	ReasonVaultSealed         = "VaultSealed"
	ReasonConnectionNotFound  = "ConnectionNotFound"
	ReasonConnectionNotReady  = "ConnectionNotReady"
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	ReasonPathNotAllowed      = "PathNotAllowed"
	ReasonSourceNotAllowed    = "SourceNotAllowed"
	ReasonPermissionDenied    = "PermissionDenied"
	ReasonIssued              = "Issued"
	ReasonIssueFailed         = "IssueFailed"
	ReasonSecretConflict      = "SecretConflict"
	ReasonLeasesNotTracked    = "LeasesNotTracked"
	// ReasonLedgerFull: status.leases holds as many leases as it can; no new credential is
	// issued until superseded leases are revoked (ExternalSecret mode: External Secrets
	// Operator's refreshes are paused before the ledger is full).
	ReasonLedgerFull                  = "LedgerFull"
	ReasonExternalSecretNotReady      = "ExternalSecretNotReady"
	ReasonExternalSecretsNotInstalled = "ExternalSecretsNotInstalled"
	ReasonInvalidCredentialSecret     = "InvalidCredentialSecret"
	ReasonRefreshIntervalTooLong      = "RefreshIntervalTooLong"
	ReasonLeasesTracked               = "LeasesTracked"
	ReasonRolloutInProgress           = "RolloutInProgress"
	ReasonRolloutComplete             = "RolloutComplete"
	ReasonRolloutStalled              = "RolloutStalled"
	// ReasonClientsStillLoggedIn: the rollout is done, and clients that are not listed consumers are
	// still logged in with a superseded credential: its user and lease stay (rollout.unlistedClients).
	ReasonClientsStillLoggedIn = "ClientsStillLoggedIn"
	// ReasonRestartPending: Redis pods run an older data-plane contract than this keyroll renders;
	// their restart waits for the maintenance window or the owner's ask.
	ReasonRestartPending = "RestartPending"
	// ReasonNewerDataPlane: a newer keyroll rendered the Redis pods' template; this one leaves it
	// and the pods alone.
	ReasonNewerDataPlane       = "NewerDataPlane"
	ReasonConsumerMissing      = "ConsumerMissing"
	ReasonConsumerPaused       = "ConsumerPaused"
	ReasonConsumerRefused      = "ConsumerRefused"
	ReasonRevocationPending    = "RevocationPending"
	ReasonInvalidSchedule      = "InvalidSchedule"
	ReasonTokenMaxTTLTooShort  = "TokenMaxTTLTooShort"
	ReasonTokensOutliveLeases  = "TokensOutliveLeases"
	ReasonNamespaceLoginFailed = "NamespaceLoginFailed"
	ReasonNamespacesLoggedIn   = "NamespacesLoggedIn"
	ReasonInUse                = "InUse"
	ReasonLeaseEndedEarly      = "LeaseEndedEarly"
	ReasonApplied              = "Applied"
	ReasonApplying             = "Applying"
	ReasonNodeUnreachable      = "NodeUnreachable"
	ReasonNodeNotReady         = "NodeNotReady"
	ReasonInvalidACLRules      = "InvalidACLRules"
	// ReasonUsersChanged: a Redis node's users were changed outside keyroll (a user added, or one
	// of the cluster's changed); keyroll puts the node back to the cluster's users.
	ReasonUsersChanged = "UsersChanged"
	// ReasonAdminLockedOut: neither of keyroll's administrative users can log in on a node.
	ReasonAdminLockedOut    = "AdminLockedOut"
	ReasonSecretNotFound    = "SecretNotFound"
	ReasonSecretNotLabelled = "SecretNotLabelled"
	// TLSReady's reasons: the certificate cannot be used (InvalidCertificate, with why), is
	// written and waits for a node to serve it (CertificatePending), or is served everywhere.
	ReasonInvalidCertificate = "InvalidCertificate"
	ReasonCertificatePending = "CertificatePending"
	ReasonCertificateServed  = "CertificateServed"
	// ReasonCertificateIssued (an event): keyroll made a cluster's own CA or nodes' certificate.
	ReasonCertificateIssued = "CertificateIssued"
)

// Event reasons (UpperCamelCase; events fire on transitions only).
const (
	EventCredentialsIssued = "CredentialsIssued"
	EventRotationStarted   = "RotationStarted"
	EventRotationFinished  = "RotationFinished"
	EventPodRestarted      = "PodRestarted"
	// EventProbeSidecarUpdated: a Redis pod's probe sidecar was given this keyroll's image in
	// place; the kubelet restarts the sidecar alone, and Redis runs on.
	EventProbeSidecarUpdated = "ProbeSidecarUpdated"
	// EventUsersApplied: a credential's user is on every Redis node, confirmed on each.
	EventUsersApplied = "UsersApplied"
	// EventUsersRetired: superseded users are gone from every Redis node.
	EventUsersRetired      = "UsersRetired"
	EventConsumerRestarted = "ConsumerRestarted"
	EventRolloutStalled    = "RolloutStalled"
	// EventPodsRolloutStarted and EventPodsRolloutFinished: the Redis pods are restarted onto a
	// new pod template (spec.version, image, resources, ...), one at a time.
	EventPodsRolloutStarted  = "PodsRolloutStarted"
	EventPodsRolloutFinished = "PodsRolloutFinished"
	// EventOldCredentialInUse: clients that are not listed consumers are still logged in with a
	// superseded credential; its retirement waits (rollout.unlistedClients).
	EventOldCredentialInUse = "OldCredentialInUse"
	// EventUnlistedClientsCutOff: with rollout.unlistedClients Proceed, the grace is over and the
	// superseded user was retired: the clients named were cut off.
	EventUnlistedClientsCutOff = "UnlistedClientsCutOff"
	// EventClientsCutOff: a user cut off at once (its lease revoked outside keyroll, onRevokedOutside
	// CutOff) leaves the nodes; the event names the clients logged in as it, which lose their
	// connections.
	EventClientsCutOff = "ClientsCutOff"
	// EventConsumersDiscovered: at a rollout's start, rollout.discoverConsumers found workloads
	// that reference the credentials Secret; the event names those restarted and those only
	// reported (a CronJob).
	EventConsumersDiscovered = "ConsumersDiscovered"
	// EventConsumerDiscoveryBounded: at a rollout's start, rollout.discoverConsumers reached the
	// number of workloads keyroll examines and left the rest of the namespace unexamined.
	EventConsumerDiscoveryBounded = "ConsumerDiscoveryBounded"
	// EventUnlistedClientRestarting: with rollout.unlistedClients Restart, a workload whose pods
	// are logged in with a superseded user becomes a consumer and is restarted.
	EventUnlistedClientRestarting = "UnlistedClientRestarting"
	// EventDataPlaneChangePending: this keyroll renders a newer data-plane contract than some Redis
	// pods run; they are restarted in the maintenance window or when asked.
	EventDataPlaneChangePending = "DataPlaneChangePending"
	// EventPrimaryHandedOver: before the primary's restart, its role went to an in-sync replica
	// (FAILOVER).
	EventPrimaryHandedOver = "PrimaryHandedOver"
	// EventPrimaryPromoted: the primary was lost (not Ready); the replica with the most data was
	// made the primary.
	EventPrimaryPromoted   = "PrimaryPromoted"
	EventLeaseRevoked      = "LeaseRevoked"
	EventRevocationFailed  = "RevocationFailed"
	EventRevocationSkipped = "RevocationSkipped"
	EventLeaseDisowned     = "LeaseDisowned"
	EventSecretConflict    = "SecretConflict"
	EventAccessDenied      = "AccessDenied"
	EventRefreshRequested  = "RefreshRequested"
	EventLeasesNotTracked  = "LeasesNotTracked"
	// EventLeaseRevokedOutside: the live lease was revoked outside keyroll; a new credential is
	// issued and rolled out at once.
	EventLeaseRevokedOutside = "LeaseRevokedOutside"
	// EventTokenEnding: the Vault token that owns the live lease ends (max TTL) before the lease;
	// the credential is rotated early enough to be replaced in time.
	EventTokenEnding = "TokenEnding"
	// EventTokenMaxTTLTooShort: a VaultConnection's tokens end before the leases they create.
	EventTokenMaxTTLTooShort = "TokenMaxTTLTooShort"
	// EventOrphanLeasesFound: the sweep found leases under the connection's credential paths that
	// no RedisCluster's ledger knows.
	EventOrphanLeasesFound = "OrphanLeasesFound"
	// EventOrphanLeaseRevoked: the sweep revoked an orphan lease (orphanLeases.action Revoke).
	EventOrphanLeaseRevoked = "OrphanLeaseRevoked"
	// EventOrphanSweepFailed: the sweep could not list or look up leases (a missing policy, for one).
	EventOrphanSweepFailed = "OrphanSweepFailed"
	// EventSupersededLeaseEnding: a superseded lease that the rollout still needs cannot be renewed
	// past its max TTL; the rollout must be done by then.
	EventSupersededLeaseEnding = "SupersededLeaseEnding"
	// EventSupersededLeaseEnded: a superseded lease reached the end SupersededLeaseEnding
	// announced (its max TTL, or its token's end) before the rollout was done: it left the
	// ledger, and its user is treated as onRevokedOutside says.
	EventSupersededLeaseEnded = "SupersededLeaseEnded"
	// EventUnknownUserRemoved: a Redis user that is not the cluster's was removed from a node.
	EventUnknownUserRemoved = "UnknownUserRemoved"
	// EventUserRestored: one of the cluster's users had been changed on a node outside keyroll and
	// was set back.
	EventUserRestored = "UserRestored"
	// EventLookAlikePod: a pod carries the cluster's Redis pod labels but is not one of its
	// StatefulSet's pods; keyroll sends it nothing and does not count it.
	EventLookAlikePod = "LookAlikePod"

	// An event of a condition's change carries the condition's reason (the Reason constants).
)
