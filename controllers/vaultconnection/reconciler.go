package vaultconnection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/vault"
)

// connectionCheckInterval is how often a VaultConnection's login and Vault's health are checked
// when nothing else happens.
const connectionCheckInterval = 5 * time.Minute

// reconcileTimeout bounds one reconcile, Vault calls and API requests included.
const reconcileTimeout = 2 * time.Minute

// deletionRecheck is how often a VaultConnection being deleted looks again for its users.
const deletionRecheck = 10 * time.Second

// Reconciler reconciles VaultConnections: it logs in to Vault, keeps alive every
// token that owns a lease in a RedisCluster's ledger, and reports the login, the tokens and
// Vault's version and seal state. It never writes a token anywhere but the connection's token
// Secret. A VaultConnection that RedisClusters use is not deleted under them.
type Reconciler struct {
	client.Client
	// APIReader reads the ledgers again from the API server before the sweep revokes an orphan.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Clock     clock.Clock
	Connector *connection.Connector
	Metrics   *metrics.Metrics
}

// Reconcile checks one VaultConnection.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	vc := &v1beta1.VaultConnection{}
	if err := r.Get(ctx, req.NamespacedName, vc); err != nil {
		if client.IgnoreNotFound(err) == nil {
			r.forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if vc.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(vc, v1beta1.ConnectionFinalizer) {
		patch := client.MergeFrom(vc.DeepCopy())
		controllerutil.AddFinalizer(vc, v1beta1.ConnectionFinalizer)
		if err := r.Patch(ctx, vc, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	before := vc.DeepCopy()
	defer func() {
		reterr = errors.Join(reterr, client.IgnoreNotFound(apply.PatchStatus(ctx, r.Client, before, vc, func(o client.Object) any {
			return o.(*v1beta1.VaultConnection).Status
		})))
	}()
	users, needs, err := r.users(ctx, vc)
	if err != nil {
		return ctrl.Result{}, err
	}
	res, err := r.check(ctx, vc, needs)
	if err != nil {
		return res, err
	}
	if vc.DeletionTimestamp.IsZero() {
		next, err := r.sweepOrphans(ctx, vc)
		if next > 0 && next < res.RequeueAfter {
			res.RequeueAfter = next
		}
		return res, err
	}
	return r.reconcileDelete(ctx, vc, users, res)
}

// forget drops what the reconciler keeps of a deleted VaultConnection.
func (r *Reconciler) forget(name string) {
	r.Connector.Forget(name)
	r.Metrics.SetTokenExpiry(name, time.Time{})
	r.Metrics.SetTokens(name, 0)
	r.Metrics.SetOrphanLeases(name, -1)
}

// tokenNeeds is what the leases of one token need: the latest expiry among them, and how many.
type tokenNeeds struct {
	until  map[string]time.Time
	leases map[string]int32
	// byNamespace is until per namespace of the RedisClusters: with identity Namespace, each
	// namespace's login keeps its own tokens.
	byNamespace map[string]map[string]time.Time
}

// users lists the RedisClusters of the namespaces vc allows that use it or hold a lease obtained
// through it, and what every cluster's leases need of vc's tokens.
func (r *Reconciler) users(ctx context.Context, vc *v1beta1.VaultConnection) ([]string, tokenNeeds, error) {
	needs := tokenNeeds{until: map[string]time.Time{}, leases: map[string]int32{}, byNamespace: map[string]map[string]time.Time{}}
	list := &v1beta1.RedisClusterList{}
	if err := r.List(ctx, list, client.MatchingFields{connection.ClusterIndex: vc.Name}); err != nil {
		return nil, needs, fmt.Errorf("listing the RedisClusters of VaultConnection %s: %w", vc.Name, err)
	}
	users := make([]string, 0, len(list.Items))
	for i := range list.Items {
		rc := &list.Items[i]
		if vc.AllowsNamespace(rc.Namespace) { // a cluster the connection does not allow cannot hold its deletion up
			users = append(users, rc.Namespace+"/"+rc.Name)
		}
		for _, l := range rc.Status.Leases {
			if l.TokenAccessor == "" || rc.LeaseConnection(l) != vc.Name {
				continue
			}
			needs.leases[l.TokenAccessor]++
			if exp := status.Of(l.ExpiresAt); exp.After(needs.until[l.TokenAccessor]) {
				needs.until[l.TokenAccessor] = exp
			}
			if needs.byNamespace[rc.Namespace] == nil {
				needs.byNamespace[rc.Namespace] = map[string]time.Time{}
			}
			needs.byNamespace[rc.Namespace][l.TokenAccessor] = needs.until[l.TokenAccessor]
		}
	}
	slices.Sort(users)
	return users, needs, nil
}

// check reads Vault's health, keeps the tokens alive (logging in when there is no valid one) and
// sets the status.
func (r *Reconciler) check(ctx context.Context, vc *v1beta1.VaultConnection, needs tokenNeeds) (ctrl.Result, error) {
	conds := status.Setter{Obj: vc, Conditions: &vc.Status.Conditions, Recorder: r.Recorder}
	now := metav1.NewTime(r.Clock.Now())
	vc.Status.LastCheckedAt = &now
	err := r.Connector.CheckSettings(ctx, vc)
	var vcl connection.Client
	if err == nil {
		vcl, err = r.Connector.Client(ctx, vc)
	}
	var held []vault.TokenStatus
	if err == nil && vc.NamespaceIdentity() {
		held, err = r.observeNamespaces(ctx, vc, vcl, needs)
	} else if err == nil {
		held, err = r.observe(ctx, vc, vcl, needs)
	}
	if err != nil {
		reason, event := v1beta1.ReasonLoginFailed, v1beta1.ReasonLoginFailed
		if vault.IsUnavailable(err) {
			reason, event = v1beta1.ReasonVaultUnavailable, v1beta1.ReasonVaultUnavailable
		}
		if vault.IsSealed(err) || (vc.Status.Sealed != nil && *vc.Status.Sealed) {
			reason, event = v1beta1.ReasonVaultSealed, v1beta1.ReasonVaultSealed
		}
		if connection.IsSettingsError(err) {
			reason, event = v1beta1.ReasonSettingsRefused, v1beta1.ReasonSettingsRefused
		}
		if conds.Set(v1beta1.ConditionReady, metav1.ConditionFalse, reason, err.Error()) {
			conds.Event(true, event, "Login", "Vault connection not ready: %v", err)
		}
		log.FromContext(ctx).V(1).Info("Vault connection not ready", "reason", reason, "error", err.Error())
		return ctrl.Result{RequeueAfter: retryWait(held, r.Clock.Now())}, nil
	}
	ready := "Logged in to Vault " + vc.Status.VaultVersion
	if vc.NamespaceIdentity() {
		ready = "Vault " + vc.Status.VaultVersion + " answers; each namespace logs in with its own identity (identity Namespace)"
	}
	if conds.Set(v1beta1.ConditionReady, metav1.ConditionTrue, v1beta1.ReasonLoggedIn, ready) {
		conds.Event(false, v1beta1.ReasonLoggedIn, "Login", "Logged in to Vault %s", vc.Status.VaultVersion)
	}
	if !vc.NamespaceIdentity() {
		r.reportTokenLifetime(vc, conds, vcl.TokenInfo(), held, needs)
	}
	vc.Status.ObservedGeneration = vc.Generation
	return ctrl.Result{RequeueAfter: r.nextCheck(held)}, nil
}

// health reads Vault's health into the status; a sealed Vault is an error.
func health(ctx context.Context, vc *v1beta1.VaultConnection, vcl vault.ConnectionClient) error {
	h, err := vcl.Health(ctx)
	if err != nil {
		return err
	}
	vc.Status.VaultVersion = h.Version
	vc.Status.Sealed = &h.Sealed
	if h.Sealed {
		return errors.New("the Vault server is sealed")
	}
	return nil
}

// observe reads Vault's health and keeps the tokens alive. It returns the tokens held.
func (r *Reconciler) observe(ctx context.Context, vc *v1beta1.VaultConnection, vcl vault.ConnectionClient, needs tokenNeeds) ([]vault.TokenStatus, error) {
	if err := health(ctx, vc, vcl); err != nil {
		return nil, err
	}
	held, err := vcl.KeepTokens(ctx, needs.until)
	vc.Status.Tokens = tokenStatuses(held, needs)
	r.Metrics.SetTokens(vc.Name, len(held))
	ti := vcl.TokenInfo()
	r.Metrics.SetTokenExpiry(vc.Name, ti.ExpiresAt)
	vc.Status.TokenExpiresAt = status.At(ti.ExpiresAt)
	return held, err
}

// tokenStatuses turns the held tokens into the status list (never the tokens themselves).
func tokenStatuses(held []vault.TokenStatus, needs tokenNeeds) []v1beta1.TokenStatus {
	if len(held) == 0 {
		return nil
	}
	out := make([]v1beta1.TokenStatus, 0, min(len(held), 64))
	for _, t := range held[:min(len(held), 64)] {
		out = append(out, v1beta1.TokenStatus{
			Accessor: t.Accessor, Current: t.Current, Leases: needs.leases[t.Accessor],
			ExpiresAt: status.At(t.ExpiresAt), EndsAt: status.At(t.EndsAt),
		})
	}
	return out
}

// reportTokenLifetime sets Degraded when the connection's tokens end (their max TTL) before the
// leases they created: Vault would revoke those leases with them, so keyroll rotates the
// credentials early, once per token lifetime. It names the auth role setting to change.
func (r *Reconciler) reportTokenLifetime(vc *v1beta1.VaultConnection, conds status.Setter, ti vault.TokenInfo, held []vault.TokenStatus, needs tokenNeeds) {
	var short *vault.TokenStatus
	for i, t := range held {
		if !t.EndsAt.IsZero() && needs.until[t.Accessor].After(t.EndsAt) {
			short = &held[i]
			break
		}
	}
	if short == nil {
		conds.Set(v1beta1.ConditionDegraded, metav1.ConditionFalse, v1beta1.ReasonTokensOutliveLeases,
			"The Vault tokens of this connection outlive the leases they created, or are renewed for as long as they live")
		return
	}
	maxTTL := ti.MaxTTL
	if maxTTL <= 0 {
		maxTTL = short.EndsAt.Sub(short.IssuedAt)
	}
	msg := fmt.Sprintf("Vault tokens of this connection end %s after login (the auth role's token max TTL), before the leases they created "+
		"(one lives until %s): Vault would revoke those leases with their token, so keyroll rotates the credentials early, once per token lifetime. "+
		"Give the auth role a periodic token (%s) or a token_max_ttl longer than the leases' max TTL",
		maxTTL.Round(time.Second), needs.until[short.Accessor].UTC().Format(time.RFC3339), roleCommand(vc.Spec.Auth))
	if conds.Set(v1beta1.ConditionDegraded, metav1.ConditionTrue, v1beta1.ReasonTokenMaxTTLTooShort, msg) {
		conds.Event(true, v1beta1.EventTokenMaxTTLTooShort, "KeepTokens", "%s", msg)
	}
}

// roleCommand is the vault command that makes the auth role's tokens periodic.
func roleCommand(a v1beta1.VaultAuth) string {
	switch {
	case a.Kubernetes != nil:
		return fmt.Sprintf("vault write auth/%s/role/%s token_period=1h ...", strings.Trim(a.Kubernetes.Mount, "/"), a.Kubernetes.Role)
	case a.AppRole != nil:
		return fmt.Sprintf("vault write auth/%s/role/<role> token_period=1h ...", strings.Trim(a.AppRole.Mount, "/"))
	}
	return "a periodic token: vault token create -period=1h ..."
}

// nextCheck is the next periodic check: when the first token is due for renewal, at the latest
// after connectionCheckInterval, and not sooner than a second.
func (r *Reconciler) nextCheck(held []vault.TokenStatus) time.Duration {
	next := connectionCheckInterval
	now := r.Clock.Now()
	for _, t := range held {
		if !t.RenewAt.IsZero() {
			next = min(next, max(t.RenewAt.Sub(now), time.Second))
		}
	}
	return next
}

// retryWait is how soon a failed check is tried again: 30 s, or sooner when a held token expires
// before that, so that a short outage does not cost a lease.
func retryWait(held []vault.TokenStatus, now time.Time) time.Duration {
	wait := 30 * time.Second
	for _, t := range held {
		if !t.ExpiresAt.IsZero() {
			wait = min(wait, max(t.ExpiresAt.Sub(now)/3, time.Second))
		}
	}
	return wait
}

// reconcileDelete removes the finalizer of a VaultConnection being deleted once no RedisCluster
// uses it or holds a lease obtained through it; until then it keeps its tokens alive and says which
// RedisClusters it waits for.
func (r *Reconciler) reconcileDelete(ctx context.Context, vc *v1beta1.VaultConnection, users []string, res ctrl.Result) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(vc, v1beta1.ConnectionFinalizer) {
		return res, nil
	}
	conds := status.Setter{Obj: vc, Conditions: &vc.Status.Conditions, Recorder: r.Recorder}
	if len(users) > 0 {
		msg := fmt.Sprintf("VaultConnection is used by %d RedisCluster(s) (%s): it is deleted once none uses it or holds a lease obtained through it",
			len(users), listSome(users, 10))
		if conds.Set(v1beta1.ConditionDeletionBlocked, metav1.ConditionTrue, v1beta1.ReasonInUse, msg) {
			conds.Event(true, v1beta1.ReasonInUse, "Delete", "%s", msg)
		}
		return ctrl.Result{RequeueAfter: min(res.RequeueAfter, deletionRecheck)}, nil
	}
	patch := client.MergeFrom(vc.DeepCopy())
	controllerutil.RemoveFinalizer(vc, v1beta1.ConnectionFinalizer)
	if err := r.Patch(ctx, vc, patch); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.forget(vc.Name)
	log.FromContext(ctx).Info("VaultConnection no longer used; deleted")
	return ctrl.Result{}, nil
}

// listSome joins the first n names, saying how many more there are.
func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// SetupWithManager registers the reconciler. Spec changes and deletions trigger it (its own status
// writes do not); the periodic check comes from RequeueAfter. A deleted RedisCluster wakes the
// VaultConnections it used, one of which may be waiting to be deleted.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1beta1.VaultConnection{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1beta1.RedisCluster{}, handler.EnqueueRequestsFromMapFunc(connectionsOf),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})).
		Named("vaultconnection").
		WithOptions(controller.Options{ReconciliationTimeout: reconcileTimeout}).
		Complete(r)
}

// connectionsOf maps a RedisCluster to the VaultConnections it uses or holds leases from.
func connectionsOf(_ context.Context, o client.Object) []ctrl.Request {
	var reqs []ctrl.Request
	for _, name := range o.(*v1beta1.RedisCluster).VaultConnections() {
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKey{Name: name}})
	}
	return reqs
}
