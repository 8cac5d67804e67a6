package rediscluster

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/keyroll/keyroll/controllers/rollout"

	"github.com/keyroll/keyroll/controllers/vaultconnection"

	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/conditions"
	"github.com/keyroll/keyroll/controllers/metrics"

	"github.com/keyroll/keyroll/controllers/render"

	esv1 "github.com/external-secrets/external-secrets/apis/externalsecrets/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault"
)

// Reconciler reconciles RedisClusters: credentials from Vault, the Redis StatefulSet and
// the Secrets it mounts, renewals, re-issues and revocation on delete.
type Reconciler struct {
	*deps
	Recorder events.EventRecorder
	// ExternalSecrets says that External Secrets Operator's ExternalSecret API was there when
	// keyroll started: only then does ExternalSecret mode work (and is the API watched).
	ExternalSecrets bool
	rollout         *rollout.Engine
	vaultLease      *vaultLease
	externalSecret  *externalSecret
}

// deps are what the phases of a reconcile share: the clients, the clock, the metrics, the Vault
// connector, and what is kept in memory between reconciles.
type deps struct {
	client.Client
	// APIReader reads past the cache, where a stale cache could make keyroll issue a second
	// credential or overwrite a Secret it does not own.
	APIReader   client.Reader
	Clock       clock.Clock
	Connector   *vaultconnection.Connector
	Metrics     *metrics.Metrics
	leaseChecks *leaseChecks
	sightings   *sightings
}

// source is where a RedisCluster's credential comes from: a Vault lease keyroll holds
// (vaultLease) or External Secrets Operator (externalSecret).
type source interface {
	// credential brings the credential up to date (issue, adopt, renew, look up, refresh) and
	// returns it; nil while there is none. It says when to look again. vcl is the Vault client of
	// the cluster's VaultConnection, nil when it has none.
	credential(ctx context.Context, s *scope, vcl vault.LeaseClient) (*render.Credential, time.Duration, error)
	// writesSecret says whether keyroll writes the credentials Secret (External Secrets Operator
	// writes it otherwise).
	writesSecret() bool
	// retire stops the source before the cluster's leases are revoked on delete, and says how
	// long to wait for it.
	retire(ctx context.Context, s *scope) (time.Duration, error)
}

// Config is what a Reconciler is made of.
type Config struct {
	Client          client.Client
	APIReader       client.Reader
	Recorder        events.EventRecorder
	Clock           clock.Clock
	Connector       *vaultconnection.Connector
	Metrics         *metrics.Metrics
	ExternalSecrets bool
	// LeaseCheckInterval is how often a live lease is looked up (zero: DefaultLeaseCheckInterval;
	// negative: never).
	LeaseCheckInterval time.Duration
}

// New returns a Reconciler for cfg.
func New(cfg Config) *Reconciler {
	interval := cfg.LeaseCheckInterval
	if interval == 0 {
		interval = DefaultLeaseCheckInterval
	}
	d := &deps{Client: cfg.Client, APIReader: cfg.APIReader, Clock: cfg.Clock, Connector: cfg.Connector,
		Metrics: cfg.Metrics, leaseChecks: newLeaseChecks(interval), sightings: &sightings{}}
	return &Reconciler{
		deps: d, Recorder: cfg.Recorder, ExternalSecrets: cfg.ExternalSecrets,
		rollout:    &rollout.Engine{Client: d.Client, APIReader: d.APIReader, Clock: d.Clock, Metrics: d.Metrics},
		vaultLease: &vaultLease{deps: d}, externalSecret: &externalSecret{deps: d},
	}
}

// WithClient returns a copy of r whose every phase writes through c (tests count the writes of a
// reconcile with it).
func (r *Reconciler) WithClient(c client.Client) *Reconciler {
	out := New(Config{Client: c, APIReader: r.APIReader, Recorder: r.Recorder, Clock: r.Clock, Connector: r.Connector,
		Metrics: r.Metrics, ExternalSecrets: r.ExternalSecrets})
	out.leaseChecks, out.sightings = r.leaseChecks, r.sightings // the same memory as r
	return out
}

// source is the cluster's credential source.
func (r *Reconciler) source(rc *v1alpha1.RedisCluster) source {
	if rc.Spec.Credentials.Source == v1alpha1.SourceExternalSecret {
		return r.externalSecret
	}
	return r.vaultLease
}

// vaultLease is the VaultLease source: keyroll reads the Vault path and holds the lease.
type vaultLease struct{ *deps }

func (*vaultLease) writesSecret() bool { return true }

func (*vaultLease) retire(context.Context, *scope) (time.Duration, error) { return 0, nil }

// externalSecret is the ExternalSecret source: External Secrets Operator syncs the credential
// through an ExternalSecret keyroll owns.
type externalSecret struct{ *deps }

func (*externalSecret) writesSecret() bool { return false }

// scope is one reconcile's view of a RedisCluster: the object, its status as last written, and
// its conditions.
type scope struct {
	rc     *v1alpha1.RedisCluster
	before *v1alpha1.RedisCluster
	conds  conditions.Setter
	// conflict names an owned object that exists and is not keyroll's, when one does.
	conflict string
	// schedule and window are the parsed spec.rotation (nil when unset or invalid).
	schedule rotation.Schedule
	window   *rotation.Window
}

// Reconcile brings one RedisCluster towards its spec. Status is written once, at the end, except
// that a newly issued lease is written to the ledger before anything uses it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	rc := &v1alpha1.RedisCluster{}
	if err := r.Get(ctx, req.NamespacedName, rc); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			r.sightings.forget(req.NamespacedName, nil)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	s := &scope{rc: rc, before: rc.DeepCopy(), conds: conditions.Setter{Obj: rc, Conditions: &rc.Status.Conditions, Recorder: r.Recorder}}
	defer func() {
		err := r.writeStatus(ctx, s)
		if apierrors.IsNotFound(err) && !rc.DeletionTimestamp.IsZero() {
			err = nil // deleted meanwhile: its finalizer was removed
		}
		if apierrors.IsConflict(reterr) && err == nil {
			// An owned object changed after the cache saw it (kube-controller-manager writes the
			// StatefulSet's status, for one): the next look uses the newer version.
			log.FromContext(ctx).V(1).Info("An object changed meanwhile; reconciling again", "error", reterr.Error())
			res, reterr = ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if apierrors.IsConflict(err) && reterr == nil {
			// The cache lagged behind a newer version: look again from that one. Nothing is lost:
			// every step is recomputed from the cluster and Vault, and repeating one is harmless.
			log.FromContext(ctx).V(1).Info("Status changed meanwhile; reconciling again")
			res, err = ctrl.Result{RequeueAfter: time.Second}, nil
		}
		reterr = errors.Join(reterr, err)
	}()
	if !rc.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}
	if added, err := r.ensureFinalizer(ctx, rc); err != nil {
		return ctrl.Result{}, err
	} else if added {
		// The finalizer patch starts no reconcile (the watch ignores metadata-only changes): look
		// again at once, from the patched object.
		s.before = rc.DeepCopy()
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}
	return r.reconcileNormal(ctx, s)
}

// ensureFinalizer adds the finalizer before anything is created in Vault.
func (r *Reconciler) ensureFinalizer(ctx context.Context, rc *v1alpha1.RedisCluster) (bool, error) {
	if controllerutil.ContainsFinalizer(rc, v1alpha1.Finalizer) {
		return false, nil
	}
	patch := client.MergeFrom(rc.DeepCopy())
	controllerutil.AddFinalizer(rc, v1alpha1.Finalizer)
	return true, r.Patch(ctx, rc, patch)
}

// reconcileNormal runs the phases in order; each returns early when it cannot go on.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	rc := s.rc
	external := rc.Spec.Credentials.Source == v1alpha1.SourceExternalSecret
	if external && !r.ExternalSecrets {
		r.externalSecretsMissing(s)
		return ctrl.Result{}, nil
	}
	r.parseRotation(s)
	if free, err := r.checkSecretsFree(ctx, s); !free || err != nil {
		return ctrl.Result{RequeueAfter: waitForConnection}, err
	}
	var vcl vault.LeaseClient // none in ExternalSecret mode without connectionRef
	if rc.VaultConnectionName() != "" {
		c, wait, err := r.connect(ctx, s, false)
		if c == nil {
			return ctrl.Result{RequeueAfter: wait}, err
		}
		vcl = c
	}
	cred, next, err := r.source(rc).credential(ctx, s, vcl)
	if err != nil || cred == nil {
		return ctrl.Result{RequeueAfter: next}, err
	}
	if err := r.reconcileObjects(ctx, s, cred); err != nil {
		return ctrl.Result{}, err
	}
	rolledOut, wait, err := r.rollout.Roll(ctx, s.rc, s.conds, cred.Version, pending(s.rc))
	if err != nil {
		return ctrl.Result{}, err
	}
	if rolledOut {
		if err := r.retireSuperseded(ctx, s, vcl, cred); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.readyReplicas(ctx, s)
	rc.Status.ObservedGeneration = rc.Generation
	return ctrl.Result{RequeueAfter: soonest(next, wait)}, nil
}

// retireSuperseded revokes the leases the current credential replaced, once it runs everywhere,
// and then drops their users (and those of replaced credentials without a tracked lease) from the
// ACL Secret. vcl is nil when no lease is tracked.
func (r *deps) retireSuperseded(ctx context.Context, s *scope, vcl vault.LeaseClient, cred *render.Credential) error {
	c := s.rc.Status.Credential
	if len(supersededLeases(s.rc)) == 0 && len(c.SupersededUsers) == 0 {
		return nil
	}
	if vcl != nil && len(supersededLeases(s.rc)) > 0 {
		if err := r.revokeSuperseded(ctx, s, vcl); err != nil {
			return err
		}
	}
	c.SupersededUsers = nil
	return r.ensureACLSecret(ctx, s.rc, cred)
}

// forget drops what the reconciler keeps of a deleted cluster: its scheduler entry and metrics.
func (r *Reconciler) forget(key types.NamespacedName) {
	r.leaseChecks.forget(key)
	r.Metrics.Forget(key)
}

// soonest is the shorter of two non-zero requeue delays.
func soonest(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// readyReplicas records how many Redis pods are Ready (the StatefulSet's count).
func (r *Reconciler) readyReplicas(ctx context.Context, s *scope) {
	sts := &appsv1.StatefulSet{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: s.rc.Namespace, Name: s.rc.Name}, sts); err == nil {
		s.rc.Status.ReadyReplicas = sts.Status.ReadyReplicas
	}
}

// externalSecretsMissing reports that ExternalSecret mode cannot work in this operator.
func (r *Reconciler) externalSecretsMissing(s *scope) {
	msg := "credentials.source is ExternalSecret, but External Secrets Operator's API (external-secrets.io/v1 ExternalSecret) was not installed when keyroll started: install External Secrets Operator, then restart keyroll"
	s.credentialsNotReady(v1alpha1.ReasonExternalSecretsNotInstalled, v1alpha1.ReasonExternalSecretsNotInstalled, "Sync", msg, true)
}

// writeStatus sums the conditions up (Ready, Degraded), derives the phase and writes the status if
// it changed.
func (r *deps) writeStatus(ctx context.Context, s *scope) error {
	s.summarize()
	s.rc.Status.Phase = phaseOf(s.rc)
	err := apply.PatchStatus(ctx, r.Client, s.before, s.rc, func(o client.Object) any { return o.(*v1alpha1.RedisCluster).Status })
	if err == nil {
		s.before = s.rc.DeepCopy()
	}
	return err
}

// phaseOf summarises the conditions for kubectl get.
func phaseOf(rc *v1alpha1.RedisCluster) v1alpha1.Phase {
	c := rc.Status.Conditions
	switch {
	case !rc.DeletionTimestamp.IsZero():
		return v1alpha1.PhaseDeleting
	case meta.IsStatusConditionTrue(c, v1alpha1.ConditionDegraded):
		return v1alpha1.PhaseDegraded
	case meta.IsStatusConditionTrue(c, v1alpha1.ConditionRolloutProgressing):
		return v1alpha1.PhaseRolling
	case meta.IsStatusConditionTrue(c, v1alpha1.ConditionReady):
		return v1alpha1.PhaseReady
	case rc.Status.Credential == nil:
		return v1alpha1.PhaseIssuing
	}
	return v1alpha1.PhasePending
}

// SetupWithManager registers the reconciler: it watches RedisClusters, what they own, and the
// VaultConnections they use.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := indexConsumers(mgr); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.RedisCluster{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Secret{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ConfigMap{}).
		Watches(&v1alpha1.VaultConnection{}, handler.EnqueueRequestsFromMapFunc(r.clustersUsing),
			builder.WithPredicates(connectionChanged())).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(clusterOfPod)).
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(r.clustersConsuming("Deployment"))).
		Watches(&appsv1.StatefulSet{}, handler.EnqueueRequestsFromMapFunc(r.clustersConsuming("StatefulSet"))).
		Watches(&appsv1.DaemonSet{}, handler.EnqueueRequestsFromMapFunc(r.clustersConsuming("DaemonSet"))).
		Named("rediscluster").
		WithOptions(controller.Options{ReconciliationTimeout: reconcileTimeout})
	if r.ExternalSecrets {
		// The ExternalSecret keyroll owns, and the Secret External Secrets Operator writes for it
		// (controlled by the ExternalSecret, so it is watched by its label).
		b = b.Owns(&esv1.ExternalSecret{}).
			Watches(&corev1.Secret{}, r.syncedSecretEvents())
	}
	return b.Complete(r)
}

// indexConsumers indexes RedisClusters by their consumers, "Kind/name".
func indexConsumers(mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.RedisCluster{}, rollout.ConsumerIndex, consumerKeys)
}

// consumerKeys are the rollout.ConsumerIndex values of a RedisCluster: "Kind/name" of each consumer.
func consumerKeys(o client.Object) []string {
	var keys []string
	for _, c := range o.(*v1alpha1.RedisCluster).Spec.Rollout.Consumers {
		keys = append(keys, c.Kind+"/"+c.Name)
	}
	return keys
}

// clustersConsuming maps a workload to the RedisClusters that list it as a consumer.
func (r *Reconciler) clustersConsuming(kind string) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		list := &v1alpha1.RedisClusterList{}
		if err := r.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{rollout.ConsumerIndex: kind + "/" + o.GetName()}); err != nil {
			return nil
		}
		reqs := make([]ctrl.Request, 0, len(list.Items))
		for _, rc := range list.Items {
			reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&rc)})
		}
		return reqs
	}
}

// clusterOfPod maps a Redis pod to its RedisCluster, named by its label.
func clusterOfPod(_ context.Context, o client.Object) []ctrl.Request {
	name := o.GetLabels()[v1alpha1.LabelCluster]
	if name == "" {
		return nil
	}
	return []ctrl.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
}

// clustersUsing maps a VaultConnection to the RedisClusters that use it.
func (r *Reconciler) clustersUsing(ctx context.Context, o client.Object) []ctrl.Request {
	list := &v1alpha1.RedisClusterList{}
	if err := r.List(ctx, list, client.MatchingFields{vaultconnection.ClusterIndex: o.GetName()}); err != nil {
		return nil
	}
	reqs := make([]ctrl.Request, 0, len(list.Items))
	for _, rc := range list.Items {
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&rc)})
	}
	return reqs
}

// connectionChanged passes VaultConnection events that can matter to a RedisCluster: a new spec,
// a change of its Ready condition, or a token whose end became known (its leases may have to be
// replaced before it).
func connectionChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() {
			return true
		}
		o, n := e.ObjectOld.(*v1alpha1.VaultConnection), e.ObjectNew.(*v1alpha1.VaultConnection)
		return readyStatus(o.Status.Conditions) != readyStatus(n.Status.Conditions) ||
			!maps.Equal(tokenEnds(o.Status.Tokens), tokenEnds(n.Status.Tokens))
	}}
}

// tokenEnds maps the accessors of tokens with a known end to that end.
func tokenEnds(tokens []v1alpha1.TokenStatus) map[string]time.Time {
	out := map[string]time.Time{}
	for _, t := range tokens {
		if t.EndsAt != nil {
			out[t.Accessor] = t.EndsAt.Time
		}
	}
	return out
}

func readyStatus(c []metav1.Condition) metav1.ConditionStatus {
	if cond := meta.FindStatusCondition(c, v1alpha1.ConditionReady); cond != nil {
		return cond.Status
	}
	return metav1.ConditionUnknown
}

// supersededLeases are the leases of the ledger that a newer credential replaced.
func supersededLeases(rc *v1alpha1.RedisCluster) []v1alpha1.LeaseRecord {
	var out []v1alpha1.LeaseRecord
	for _, l := range rc.Status.Leases {
		if l.State != v1alpha1.LeaseActive {
			out = append(out, l)
		}
	}
	return out
}

// pending says that a replaced credential is still out there: a superseded lease not revoked
// yet, or the user of a replaced credential whose lease is not tracked.
func pending(rc *v1alpha1.RedisCluster) bool {
	return len(supersededLeases(rc)) > 0 || (rc.Status.Credential != nil && len(rc.Status.Credential.SupersededUsers) > 0)
}

// reconcileTimeout bounds one reconcile, Vault calls and API requests included.
const reconcileTimeout = 2 * time.Minute
