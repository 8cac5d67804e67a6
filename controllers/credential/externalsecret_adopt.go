package credential

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/vault"
)

// adopt takes a credential ESO synced into the status. A new one is recorded, and its lease put
// into the ledger when tracked, before anything uses it; the credential it replaces is superseded
// and its lease revoked after the rollout. gone says the tracked lease no longer exists in Vault.
// es is the UID of keyroll's ExternalSecret: only leases seen in Secrets it controls are taken.
// waiting says that the credential, with the leases sighted, does not fit in the status (see
// fits): it is not adopted, and the sightings are kept until there is room.
func (r *Adopter) adopt(ctx context.Context, cl *Cluster, sc *render.SyncedCredential, vcl vault.LeaseClient, tracked bool, es types.UID) (gone, waiting bool, err error) {
	rc := cl.RC
	key := client.ObjectKeyFromObject(rc)
	sighted := r.sightings.peek(key, es)
	if !tracked {
		r.sightings.forget(key, nil)
		sighted = nil
	}
	c := rc.Status.Credential
	fresh := c == nil || c.Version != sc.Version
	untrackedLease := tracked && c != nil && !fresh && c.Lease.LeaseID == ""
	if !fresh && !untrackedLease && !unrecorded(rc, sighted, sc.LeaseID, tracked) {
		return false, false, nil
	}
	if !fits(rc, newLeases(rc, sighted, sc.LeaseID), tracked) {
		return false, true, nil
	}
	now := status.At(r.Clock.Now())
	if fresh || untrackedLease {
		info := &vault.LeaseInfo{Exists: true}
		if tracked {
			if info, err = vcl.Lookup(ctx, sc.LeaseID); err != nil {
				return false, false, fmt.Errorf("looking up the lease External Secrets Operator obtained: %w", err)
			}
		}
		r.recordSynced(cl, sc, tracked, info, now, fresh)
		gone = tracked && !info.Exists
	}
	if tracked {
		rc.Status.Leases = AddSighted(rc.Status.Leases, sighted, now, rc.VaultConnectionName())
	}
	if err := cl.Persist(ctx); err != nil {
		return false, false, fmt.Errorf("recording the synced credential: %w", err)
	}
	r.sightings.forget(key, sighted)
	if fresh {
		note := "its lease is tracked"
		if !tracked {
			note = "leases are not tracked"
		}
		cl.Conds.Event(false, v1beta1.EventCredentialsIssued, "Adopt", "Adopted credential %s for user %s that External Secrets Operator synced into Secret %s (%s)",
			sc.Version, sc.Username, render.SyncedSecretName(rc), note)
		log.FromContext(ctx).Info("Synced credential adopted", "version", sc.Version, "username", sc.Username, "leaseTracked", tracked)
	}
	return gone, false, nil
}

// newLeases counts the leases that adopting the synced credential (lease current) with the
// leases sighted would add to the ledger.
func newLeases(rc *v1beta1.RedisCluster, sighted []string, current string) int {
	added := map[string]bool{}
	for _, id := range append(slices.Clone(sighted), current) {
		if id != "" && !Has(rc.Status.Leases, id) {
			added[id] = true
		}
	}
	return len(added)
}

// unrecorded says whether leases seen in the Secret are missing from the ledger.
func unrecorded(rc *v1beta1.RedisCluster, sighted []string, current string, tracked bool) bool {
	if !tracked {
		return false
	}
	for _, id := range sighted {
		if id != current && !Has(rc.Status.Leases, id) {
			return true
		}
	}
	return false
}

// recordSynced puts a synced credential into the status, and its lease into the ledger.
func (r *Adopter) recordSynced(cl *Cluster, sc *render.SyncedCredential, tracked bool, info *vault.LeaseInfo, now *metav1.Time, fresh bool) {
	rc := cl.RC
	prev := rc.Status.Credential
	cs := &v1beta1.CredentialStatus{
		Version: sc.Version, Source: v1beta1.SourceExternalSecret, Username: sc.Username,
		IssuedAt: now, LastRotation: now, ExternalSecret: v1beta1.ExternalSecretCredential{LeasesTracked: &tracked},
	}
	if prev != nil {
		// A new credential answers a pending refresh request; the same one keeps it pending.
		cs.LastRotation, cs.SupersededUsers, cs.ExternalSecret.LeaseEndedEarlyAfter = prev.LastRotation, prev.SupersededUsers, prev.ExternalSecret.LeaseEndedEarlyAfter
		if !fresh || prev.ExternalSecret.RefreshRequestedAt != nil {
			// The same credential, or the one that answers keyroll's request: the request's reason.
			cs.RotationReason = prev.RotationReason
		}
		if !fresh {
			// The same credential: where it has got to stays (a new one starts undelivered).
			cs.IssuedAt, cs.ExternalSecret.RefreshRequestedAt, cs.DeliveredAt = prev.IssuedAt, prev.ExternalSecret.RefreshRequestedAt, prev.DeliveredAt
		} else if !tracked && prev.Username != "" && !slices.Contains(cs.SupersededUsers, prev.Username) {
			// No lease keeps the replaced user in the aclfile until the rollout is done: this does.
			cs.SupersededUsers = append(slices.Clone(cs.SupersededUsers), prev.Username)
		}
	}
	if fresh {
		// The lease of the credential it replaces (tracked through this connection or another)
		// is revoked after the rollout.
		Supersede(rc, sc.Version)
	}
	if sc.LeaseDuration > 0 {
		cs.Lease.Duration = &metav1.Duration{Duration: sc.LeaseDuration}
	}
	if tracked {
		cs.Lease.LeaseID, cs.Lease.Renewable = sc.LeaseID, info.Renewable
		cs.Lease.ExpiresAt = status.At(info.ExpiresAt)
		if !info.IssuedAt.IsZero() {
			cs.IssuedAt = status.At(info.IssuedAt)
		}
		if !info.LastRenewal.IsZero() {
			cs.Lease.LastRenewal = status.At(info.LastRenewal)
		}
		if info.Exists && !Has(rc.Status.Leases, sc.LeaseID) {
			rc.Status.Leases = append(rc.Status.Leases, v1beta1.LeaseRecord{
				LeaseID: sc.LeaseID, State: v1beta1.LeaseActive, Version: sc.Version, Username: sc.Username,
				IssuedAt: cs.IssuedAt, ExpiresAt: cs.Lease.ExpiresAt, Connection: rc.VaultConnectionName(),
			})
		}
	}
	rc.Status.Credential = cs
}

// syncedSecret reads the credentials Secret ESO writes; nil while it does not exist. It must be
// controlled by keyroll's own ExternalSecret, whose UID is es (empty: not created yet): a Secret of
// that name that anyone else wrote, or another ExternalSecret controls, is never read.
func (r *Adopter) syncedSecret(ctx context.Context, rc *v1beta1.RedisCluster, es types.UID) (*corev1.Secret, error) {
	if es == "" {
		return nil, nil
	}
	key := client.ObjectKey{Namespace: rc.Namespace, Name: render.SyncedSecretName(rc)}
	sec := &corev1.Secret{}
	ours := func() bool {
		ref := metav1.GetControllerOf(sec)
		return render.SyncedByExternalSecret(sec, rc) && ref.UID == es
	}
	err := r.Client.Get(ctx, key, sec)
	if client.IgnoreNotFound(err) != nil {
		return nil, err
	}
	if err != nil || !ours() {
		// Not in the cache (yet): ESO may have written it a moment ago.
		if err := r.APIReader.Get(ctx, key, sec); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
	}
	if !ours() {
		return nil, nil
	}
	return sec, nil
}

// mayTrack says whether the lease ESO obtained may be tracked through vcl: its ID must lie under a
// path the VaultConnection allows the namespace (see connection.ForNamespace). One that does
// not is announced and left alone: keyroll neither renews nor revokes it.
func (r *Adopter) mayTrack(cl *Cluster, vcl vault.LeaseClient, id string) bool {
	g, ok := vcl.(interface{ AllowsLease(string) error })
	if !ok {
		return true
	}
	if err := g.AllowsLease(id); err != nil {
		cl.Conds.Event(true, v1beta1.EventLeaseDisowned, "Adopt", "The lease External Secrets Operator obtained is not tracked: %v", err)
		return false
	}
	return true
}
