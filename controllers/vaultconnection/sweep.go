package vaultconnection

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/vault"
)

// The orphan-lease sweep's defaults (spec.orphanLeases).
const (
	defaultOrphanGrace    = 5 * time.Minute
	defaultOrphanInterval = 10 * time.Minute
	// maxListedOrphans bounds the lease IDs kept in status and named in an event.
	maxListedOrphans = 16
)

// sweepSettings are spec.orphanLeases with the defaults filled in.
func sweepSettings(vc *v1beta1.VaultConnection) (v1beta1.OrphanLeaseAction, time.Duration, time.Duration) {
	action, grace, interval := v1beta1.OrphanLeasesReport, defaultOrphanGrace, defaultOrphanInterval
	if o := vc.Spec.OrphanLeases; o != nil {
		if o.Action != "" {
			action = o.Action
		}
		if o.GracePeriod != nil {
			grace = o.GracePeriod.Duration
		}
		if o.Interval != nil {
			interval = o.Interval.Duration
		}
	}
	return action, grace, interval
}

// sweepOrphans runs the orphan-lease sweep when it is due and the connection is logged in, and
// says when it is due next (0: never, the sweep is off). It lists the leases Vault holds under
// the credential paths of the connection's RedisClusters and compares them with every ledger
// (see findOrphans); orphans are reported, and revoked when spec.orphanLeases.action is Revoke.
// Before a revocation the ledgers are read again from the API server, not the cache, so that a
// lease that reached a ledger meanwhile is never taken for an orphan. With identity Namespace each
// namespace's paths are listed, and its orphans revoked, through that namespace's own login.
func (r *Reconciler) sweepOrphans(ctx context.Context, vc *v1beta1.VaultConnection) (time.Duration, error) {
	action, grace, interval := sweepSettings(vc)
	if action == v1beta1.OrphanLeasesOff {
		vc.Status.OrphanLeases = nil
		return 0, nil
	}
	now := r.Clock.Now()
	st := vc.Status.OrphanLeases
	if st != nil && st.LastSweepAt != nil {
		if due := st.LastSweepAt.Add(interval); now.Before(due) {
			return due.Sub(now), nil
		}
	}
	if !meta.IsStatusConditionTrue(vc.Status.Conditions, v1beta1.ConditionReady) {
		return 0, nil // the next successful check sweeps
	}
	if st == nil {
		st = &v1beta1.OrphanLeaseStatus{}
		vc.Status.OrphanLeases = st
	}
	byNamespace, known, err := r.ledgers(ctx, r.Client, vc)
	if err != nil {
		return 0, err
	}
	found, through, sweepErr := r.listOrphans(ctx, vc, byNamespace, known, grace, now)
	var prefixes []string
	for _, paths := range byNamespace {
		prefixes = append(prefixes, paths...)
	}
	slices.Sort(prefixes)
	prefixes = slices.Compact(prefixes)
	var intents []connection.Intent
	if r.Connector.Intents != nil {
		if intents, err = r.Connector.Intents.Open(ctx, vc.Name); err != nil {
			return 0, err
		}
	}
	ours, others, matched, stale := claim(found, intents, grace, now)
	left := ids(ours)
	if action == v1beta1.OrphanLeasesRevoke && len(ours) > 0 {
		if left, err = r.revokeOrphans(ctx, vc, through, left, matched); err != nil {
			return 0, err
		}
	}
	if sweepErr == nil && len(stale) > 0 && r.Connector.Intents != nil {
		if err := r.Connector.Intents.Drop(ctx, vc.Name, stale...); err != nil {
			return 0, err
		}
	}
	orphans := append(left, ids(others)...)
	slices.Sort(orphans)
	last := metav1.NewTime(now)
	prevError := st.Error
	st.LastSweepAt, st.Paths, st.Found = &last, prefixes[:min(len(prefixes), 64)], int32(len(orphans))
	st.Foreign = int32(len(others))
	st.Orphans = orphans[:min(len(orphans), maxListedOrphans)]
	st.Error = ""
	r.Metrics.SetOrphanLeases(vc.Name, len(orphans))
	conds := status.Setter{Obj: vc, Conditions: &vc.Status.Conditions, Recorder: r.Recorder}
	if sweepErr != nil {
		st.Error = sweepError(sweepErr)
		if st.Error != prevError {
			conds.Event(true, v1beta1.EventOrphanSweepFailed, "SweepOrphans", "The orphan-lease sweep could not finish: %s", st.Error)
		}
		log.FromContext(ctx).Info("Orphan-lease sweep incomplete", "error", sweepErr.Error())
	}
	if len(orphans) > 0 {
		conds.Event(true, v1beta1.EventOrphanLeasesFound, "SweepOrphans",
			"Found %d lease(s) that no RedisCluster's ledger knows, issued more than %s ago (orphanLeases.action %s): %s; %d of them this install did not issue, and leaves alone: %s",
			len(orphans), grace, action, listSome(orphans, 5), len(others), listSome(ids(others), 5))
	}
	log.FromContext(ctx).V(1).Info("Orphan-lease sweep done", "paths", len(prefixes), "orphans", len(orphans))
	return interval, nil
}

// listOrphans finds the orphans under each namespace's paths (findOrphans), through the
// connection's login or, with identity Namespace, each namespace's own; through says which client
// found each, and revokes it.
func (r *Reconciler) listOrphans(ctx context.Context, vc *v1beta1.VaultConnection, byNamespace map[string][]string, known map[string]bool,
	grace time.Duration, now time.Time) ([]orphan, map[string]vault.LeaseClient, error) {
	through := map[string]vault.LeaseClient{}
	var found []orphan
	var errs []error
	sweep := func(vcl vault.LeaseClient, paths []string) {
		f, err := findOrphans(ctx, vcl, paths, known, grace, now)
		for _, o := range f {
			through[o.ID] = vcl
		}
		found, errs = append(found, f...), append(errs, err)
	}
	if !vc.NamespaceIdentity() {
		vcl, err := r.Connector.Client(ctx, vc)
		if err != nil {
			return nil, nil, err
		}
		var all []string
		for _, paths := range byNamespace {
			all = append(all, paths...)
		}
		slices.Sort(all)
		sweep(vcl, slices.Compact(all))
	} else {
		for _, ns := range slices.Sorted(maps.Keys(byNamespace)) {
			nsc, err := r.Connector.NamespaceClient(ctx, vc, ns)
			if err != nil {
				errs = append(errs, fmt.Errorf("namespace %s: %w", ns, err))
				continue
			}
			sweep(nsc, byNamespace[ns])
		}
	}
	slices.SortFunc(found, func(a, b orphan) int { return strings.Compare(a.ID, b.ID) })
	return found, through, errors.Join(errs...)
}

// revokeOrphans revokes the orphans this install issued that no ledger holds now, read from the
// API server, through the client that found each, and drops their intents (matched: lease ID to
// intent ID). It returns those that are still orphans (revocation failed), the revoked ones
// counted in status.
func (r *Reconciler) revokeOrphans(ctx context.Context, vc *v1beta1.VaultConnection, through map[string]vault.LeaseClient, orphans []string, matched map[string]string) ([]string, error) {
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	_, known, err := r.ledgers(ctx, reader, vc)
	if err != nil {
		return orphans, err
	}
	conds := status.Setter{Obj: vc, Conditions: &vc.Status.Conditions, Recorder: r.Recorder}
	var left, done []string
	for _, id := range orphans {
		if known[id] {
			done = append(done, matched[id]) // it reached a ledger after all
			continue
		}
		if err := through[id].Revoke(ctx, id); err != nil {
			left = append(left, id)
			log.FromContext(ctx).Info("Revoking an orphan lease failed; tried again at the next sweep", "lease", id, "error", err.Error())
			continue
		}
		done = append(done, matched[id])
		vc.Status.OrphanLeases.Revoked++
		r.Metrics.OrphanLeasesRevoked.WithLabelValues(vc.Name).Inc()
		conds.Event(false, v1beta1.EventOrphanLeaseRevoked, "SweepOrphans", "Revoked lease %s, which this install issued and no RedisCluster's ledger knows", id)
		log.FromContext(ctx).Info("Orphan lease revoked", "lease", id)
	}
	if r.Connector.Intents != nil {
		if err := r.Connector.Intents.Drop(ctx, vc.Name, done...); err != nil {
			return left, err
		}
	}
	return left, nil
}

// ledgers reads every RedisCluster's ledger: the credential paths that the sweep of connection
// covers, by namespace, and every lease ID any ledger holds. A path is swept when a VaultLease-mode cluster of
// the connection reads it (spec or status) or holds a lease under it through the connection, and
// no ExternalSecret-mode cluster holds a lease under it: External Secrets Operator's leases reach
// a ledger only when keyroll sees them, so they are never taken for orphans. Only the paths that
// the connection allows the cluster's namespace are swept: a RedisCluster cannot point the sweep
// at another team's role.
func (r *Reconciler) ledgers(ctx context.Context, rd client.Reader, vc *v1beta1.VaultConnection) (map[string][]string, map[string]bool, error) {
	list := &v1beta1.RedisClusterList{}
	if err := rd.List(ctx, list); err != nil {
		return nil, nil, fmt.Errorf("listing the RedisClusters for the orphan-lease sweep: %w", err)
	}
	known := map[string]bool{}
	paths := map[string][]string{}
	var external []string
	for i := range list.Items {
		rc := &list.Items[i]
		vaultLease := rc.Spec.Credentials.Source == v1beta1.SourceVaultLease && rc.Spec.Credentials.VaultLease != nil
		sweep := func(p string) {
			if p = strings.Trim(p, "/"); vc.AllowsNamespace(rc.Namespace) && vc.AllowsPath(rc.Namespace, p) {
				paths[rc.Namespace] = append(paths[rc.Namespace], p)
			}
		}
		if vaultLease && rc.VaultConnectionName() == vc.Name {
			sweep(rc.Spec.Credentials.VaultLease.Path)
			if c := rc.Status.Credential; c != nil && c.Source == v1beta1.SourceVaultLease && c.VaultLease.Path != "" {
				sweep(c.VaultLease.Path)
			}
		}
		for _, l := range rc.Status.Leases {
			known[l.LeaseID] = true
			switch {
			case !vaultLease:
				external = append(external, leasePath(l.LeaseID))
			case rc.LeaseConnection(l) == vc.Name:
				sweep(leasePath(l.LeaseID))
			}
		}
	}
	for ns, p := range paths {
		p = slices.DeleteFunc(p, func(p string) bool { return p == "" || slices.Contains(external, p) })
		slices.Sort(p)
		if p = slices.Compact(p); len(p) == 0 {
			delete(paths, ns)
		} else {
			paths[ns] = p
		}
	}
	return paths, known, nil
}

// leasePath is the credential path a lease was issued under: its ID without the last element.
func leasePath(id string) string {
	if i := strings.LastIndex(id, "/"); i > 0 {
		return id[:i]
	}
	return ""
}

// sweepError says what stopped a sweep, naming the policy when Vault refused it.
func sweepError(err error) string {
	msg := err.Error()
	if vault.IsPermissionDenied(err) {
		msg = "Vault refused to list leases: the operator's policy needs list and sudo on sys/leases/lookup/<path>/ (deploy/vault/sweeper-policy.hcl): " + msg
	}
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	return msg
}
