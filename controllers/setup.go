package controllers

import (
	"context"
	"errors"
	"net/http"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/rediscluster"
	"github.com/keyroll/keyroll/controllers/vaultconnection"
)

// Options are what the reconcilers share.
type Options struct {
	Recorder events.EventRecorder
	Clock    clock.Clock
	// Tokens requests the operator's service-account tokens for Vault's Kubernetes auth.
	Tokens kubernetes.Interface
	// ServiceAccount is the operator's own service account.
	ServiceAccount types.NamespacedName
	// VaultSecretsNamespace is the only namespace whose Secrets VaultConnections may name (empty:
	// the service account's).
	VaultSecretsNamespace string
	// VaultObserver, when set, sees every Vault request (VaultConnection, operation, outcome, duration).
	VaultObserver func(connection, op, outcome string, seconds float64)
	// LeaseCheckInterval is how often a live lease is looked up in Vault besides its renewals
	// (zero: DefaultLeaseCheckInterval; negative: never).
	LeaseCheckInterval time.Duration
	// UsersCheckInterval is how often every Redis node's ACL is compared with what keyroll
	// confirmed there (zero: DefaultUsersCheckInterval; negative: never).
	UsersCheckInterval time.Duration
	// Workers is how many RedisClusters are reconciled at once (zero: rediscluster.DefaultWorkers).
	Workers int
	// ProbeImage is the image of the Redis pods' probe sidecar (cmd/keyroll-probe); required.
	ProbeImage string
}

// CacheOptions are the manager's cache settings: of Secrets, ConfigMaps, Services, StatefulSets,
// PodDisruptionBudgets, NetworkPolicies and ExternalSecrets only those keyroll labels, of pods and
// ControllerRevisions only the Redis pods' and their StatefulSets';
// never every object of the cluster. (Consumer workloads are watched by their metadata only.)
// With a selector (--watch-selector), only the RedisClusters and VaultConnections it matches are
// seen: the manager leaves every other one, and what belongs to it, alone.
func CacheOptions(cfg *rest.Config, selector labels.Selector) cache.Options {
	managed := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{v1beta1.LabelManagedBy: v1beta1.ManagedByValue})}
	redisPods, _ := labels.Parse(v1beta1.LabelCluster)
	opts := cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}: managed, &corev1.ConfigMap{}: managed, &corev1.Service{}: managed,
		&appsv1.StatefulSet{}: managed, &policyv1.PodDisruptionBudget{}: managed, &networkingv1.NetworkPolicy{}: managed,
		// Only the Redis pods keyroll restarts, not every pod of the cluster.
		&corev1.Pod{}: {Label: redisPods},
		// The StatefulSet controller labels its ControllerRevisions as the pod template: only the
		// Redis StatefulSets' revisions, which say which pods the StatefulSet made (nodes_members.go).
		&appsv1.ControllerRevision{}: {Label: redisPods},
	}, DefaultTransform: apply.KeepOwnManagedFields}
	if selector != nil && !selector.Empty() {
		opts.ByObject[&v1beta1.RedisCluster{}] = cache.ByObject{Label: selector}
		opts.ByObject[&v1beta1.VaultConnection{}] = cache.ByObject{Label: selector}
	}
	if ExternalSecretsServed(cfg) { // a cache setting for a kind the API server does not serve fails
		opts.ByObject[&externalsecrets.ExternalSecret{}] = managed
	}
	return opts
}

// ExternalSecretsServed says whether the API server serves External Secrets Operator's
// external-secrets.io/v1 ExternalSecrets.
func ExternalSecretsServed(cfg *rest.Config) bool {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false
	}
	list, err := dc.ServerResourcesForGroupVersion(externalsecrets.GroupVersion.String())
	if err != nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Kind == externalsecrets.Kind {
			return true
		}
	}
	return false
}

// DefaultLeaseCheckInterval is how often a live lease is looked up in Vault besides its renewals.
const DefaultLeaseCheckInterval = rediscluster.DefaultLeaseCheckInterval

// DefaultUsersCheckInterval is how often every Redis node's ACL is compared with what keyroll
// confirmed there.
const DefaultUsersCheckInterval = rediscluster.DefaultUsersCheckInterval

// Setup registers keyroll's reconcilers with a manager. Both share one Connector, and so one Vault
// client (one login, one rate limit) per VaultConnection. It returns the RedisCluster reconciler.
func Setup(mgr ctrl.Manager, o Options) (*rediscluster.Reconciler, error) {
	if o.ProbeImage == "" {
		return nil, errors.New("no image for the Redis pods' probe sidecar (Options.ProbeImage)")
	}
	m := metrics.For(o.Clock)
	observe := func(conn, op, outcome string, seconds float64) {
		m.ObserveVault(op, outcome, seconds)
		if o.VaultObserver != nil {
			o.VaultObserver(conn, op, outcome, seconds)
		}
	}
	conn := &connection.Connector{
		Reader: mgr.GetAPIReader(), Tokens: o.Tokens, ServiceAccount: o.ServiceAccount,
		Writer: mgr.GetClient(), TokenNamespace: o.ServiceAccount.Namespace, SecretNamespace: o.VaultSecretsNamespace,
		Clients: connection.NewClients(), Clock: o.Clock, Observer: observe,
	}
	if ns := o.ServiceAccount.Namespace; ns != "" {
		conn.Intents = &connection.Intents{Writer: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: ns, Clock: o.Clock}
	}
	if err := connection.IndexClusters(mgr); err != nil {
		return nil, err
	}
	if err := (&vaultconnection.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: o.Recorder, Clock: o.Clock, Connector: conn, Metrics: m,
	}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := addProbes(mgr); err != nil {
		return nil, err
	}
	rcr := rediscluster.New(rediscluster.Config{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: o.Recorder, Clock: o.Clock,
		Connector: conn, Metrics: m, ExternalSecrets: externalSecretModeAvailable(mgr), LeaseCheckInterval: o.LeaseCheckInterval,
		UsersCheckInterval: o.UsersCheckInterval, Workers: o.Workers, OperatorNamespace: o.ServiceAccount.Namespace, ProbeImage: o.ProbeImage,
	})
	mgr.GetLogger().Info("External Secrets Operator's API", "served", rcr.ExternalSecrets)
	return rcr, rcr.SetupWithManager(mgr)
}

// externalSecretModeAvailable says whether the API server serves external-secrets.io/v1 ExternalSecrets
// and the manager's scheme knows them: ExternalSecret mode needs both.
func externalSecretModeAvailable(mgr ctrl.Manager) bool {
	gvk := externalsecrets.GroupVersion.WithKind(externalsecrets.Kind)
	if !mgr.GetScheme().Recognizes(gvk) {
		return false
	}
	_, err := mgr.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	return err == nil
}

// addProbes registers /healthz (the process answers) and /readyz (ready only once the informer
// caches have synced).
func addProbes(mgr ctrl.Manager) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("caches-synced", cachesSynced(mgr.GetCache()))
}

// cachesSynced is a readiness check that passes only once the informer caches have synced.
func cachesSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), 100*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches have not synced yet")
		}
		return nil
	}
}
