package controllers

// The operator's permissions, from which controller-gen writes deploy/rbac/role.yaml. Each line is
// the least the reconcilers need; no wildcard verbs, resources or groups.

// Its own API: the finalizers and status are patched (never updated); finalizers/update lets the
// owner references keyroll sets block their owner's deletion.
// +kubebuilder:rbac:groups=keyroll.dev,resources=redisclusters;vaultconnections,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=keyroll.dev,resources=redisclusters/status;vaultconnections/status,verbs=patch
// +kubebuilder:rbac:groups=keyroll.dev,resources=redisclusters/finalizers,verbs=update

// Objects owned by a RedisCluster, written by server-side apply (create, patch) and read through
// the cache (get, list, watch); the garbage collector deletes them with their owner, and keyroll
// itself deletes only a NetworkPolicy or an ExternalSecret the spec no longer asks for.
// +kubebuilder:rbac:groups="",resources=secrets;services;configmaps,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=external-secrets.io,resources=externalsecrets,verbs=get;list;watch;create;patch;delete

// Rollouts: Redis pods are deleted one at a time; consumers get a pod-template annotation.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=apps,resources=deployments;daemonsets,verbs=get;list;watch;patch

// A Redis pod is a node only if its revision is one of its StatefulSet's (nodes_members.go); the
// ControllerRevisions are read through the cache, which holds only the Redis StatefulSets'.
// +kubebuilder:rbac:groups=apps,resources=controllerrevisions,verbs=get;list;watch

// rollout.unlistedClients: a client pod's owner is taken for its workload only if it exists and
// selects the pod (podowner.go); a Deployment's pods name its ReplicaSet, read past the cache.
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=get

// rollout.discoverConsumers: workloads that reference the credentials Secret and that keyroll
// reports but never restarts.
// +kubebuilder:rbac:groups=batch,resources=cronjobs;jobs,verbs=list

// Vault's Kubernetes auth: a token for the operator's own service account, and no other (the
// Helm chart puts its service account's name in resourceNames); TokenReviews (in main.go's
// markers) refuse a token the API server would accept before it is sent to Vault.
// +kubebuilder:rbac:groups="",resources=serviceaccounts/token,verbs=create,namespace=keyroll-system,resourceNames=keyroll-manager

// Events.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Leader election, in the operator's own namespace only.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=keyroll-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=keyroll-system
