package controllers

// The operator's permissions, from which controller-gen writes deploy/rbac/role.yaml. Each line is
// the least the reconcilers need; no wildcard verbs, resources or groups.

// Its own API.
// +kubebuilder:rbac:groups=keyroll.dev,resources=redisclusters;vaultconnections,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=keyroll.dev,resources=redisclusters/status;vaultconnections/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=keyroll.dev,resources=redisclusters/finalizers,verbs=update

// Objects owned by a RedisCluster.
// +kubebuilder:rbac:groups="",resources=secrets;services;configmaps,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=external-secrets.io,resources=externalsecrets,verbs=get;list;watch;create;update;patch;delete

// Rollouts: Redis pods are deleted one at a time; consumers get a pod-template annotation.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=apps,resources=deployments;daemonsets,verbs=get;list;watch;patch

// Vault's Kubernetes auth: a token for the operator's own service account.
// +kubebuilder:rbac:groups="",resources=serviceaccounts/token,verbs=create

// Events.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Leader election, in the operator's own namespace only.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=keyroll-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=keyroll-system
