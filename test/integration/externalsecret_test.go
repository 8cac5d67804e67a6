package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// These tests run the real External Secrets Operator controller (ESO v0.20.4, built by
// test/tools/eso) against the same API server, Vault and Redis as keyroll.

// checkSyncedSecret checks where External Secrets Operator put the credential: in <name>-eso,
// which it owns through the ExternalSecret and no consumer reads, while the consumers' Secret,
// owned by the RedisCluster, holds the same credential (keyroll wrote it once every node
// accepted it).
func checkSyncedSecret(t *testing.T, rc *v1beta1.RedisCluster) {
	t.Helper()
	synced := &corev1.Secret{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name + "-eso"}, synced); err != nil {
		t.Fatalf("the Secret ESO writes: %v", err)
	}
	if ref := metav1.GetControllerOf(synced); ref == nil || ref.Kind != "ExternalSecret" || ref.Name != rc.Name {
		t.Errorf("Secret %s-eso is controlled by %+v, want the ExternalSecret %s", rc.Name, ref, rc.Name)
	}
	published := &corev1.Secret{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name + "-credentials"}, published); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(published); ref == nil || ref.Kind != "RedisCluster" || ref.Name != rc.Name {
		t.Errorf("the consumers' Secret is controlled by %+v, want the RedisCluster", ref)
	}
	if u := string(synced.Data["username"]); u == "" || u != string(published.Data["username"]) {
		t.Errorf("ESO's Secret holds user %q, the consumers' Secret %q", u, published.Data["username"])
	}
}

func externalSecret(t *testing.T, rc *v1beta1.RedisCluster) (*externalsecrets.ExternalSecret, error) {
	t.Helper()
	es := &externalsecrets.ExternalSecret{}
	err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name}, es)
	return es, err
}

// deleteAndWait deletes a RedisCluster and waits until it, its ExternalSecret and every object of
// the cluster are gone (fw.DeleteAndWait waits for the RedisCluster alone).
func deleteAndWait(t *testing.T, rc *v1beta1.RedisCluster) {
	t.Helper()
	if err := fw.Client.Delete(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 60*time.Second, func() string {
		if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), &v1beta1.RedisCluster{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("RedisCluster still there (%v)", err)
		}
		if _, err := externalSecret(t, rc); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("ExternalSecret still there (%v)", err)
		}
		// Nothing of the cluster is left: its Secrets (the one ESO wrote included), ConfigMap,
		// Services and StatefulSet are collected through their owner references.
		selector := client.MatchingLabels{v1beta1.LabelCluster: rc.Name}
		for _, list := range []client.ObjectList{&corev1.SecretList{}, &corev1.ConfigMapList{}, &corev1.ServiceList{}, &appsv1.StatefulSetList{}} {
			if err := fw.Client.List(context.Background(), list, client.InNamespace(rc.Namespace), selector); err != nil {
				return err.Error()
			}
			if n := meta.LenList(list); n > 0 {
				return fmt.Sprintf("%d %T left", n, list)
			}
		}
		return ""
	})
}

// A ClusterSecretStore (Vault provider, token auth) with a remote key: it is refused until a
// VaultConnection that the RedisCluster names lists it (spec.externalSecrets); then ESO syncs the
// credential into <name>-eso, keyroll puts it on the Redis node and publishes it in the consumers' Secret,
// reports that its lease is not tracked, repairs drift of the ExternalSecret (whose new credential
// replaces the old user on the node), and deleting the RedisCluster removes the ExternalSecret and
// the Secrets.
func TestExternalSecretFromClusterSecretStoreSyncsAWorkingCredentialWithoutLeaseTracking(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "es-store")
	tok, err := fw.Ground.Vault.Root.Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{fw.Name("eso")}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	fw.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "eso-vault-token"},
		StringData: map[string]string{"token": tok.Auth.ClientToken}})
	store := fw.Name("vault-es-store")
	fw.Create(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "external-secrets.io/v1", "kind": "ClusterSecretStore",
		"metadata": map[string]any{"name": store},
		"spec": map[string]any{"provider": map[string]any{"vault": map[string]any{
			"server": fw.Ground.Vault.Addr, "version": "v1",
			"auth": map[string]any{"tokenSecretRef": map[string]any{"name": "eso-vault-token", "key": "token", "namespace": ns}},
		}}},
	}})
	rc := fw.ExternalSecretCluster(t, ns, "orders", v1beta1.ExternalSecretSource{
		StoreRef:           &v1beta1.StoreReference{Kind: "ClusterSecretStore", Name: store},
		RemoteKey:          fw.Path("es-store"),
		RefreshInterval:    &metav1.Duration{Duration: 5 * time.Minute},
		CredentialLifetime: &metav1.Duration{Duration: 10 * time.Minute},
	})
	// A cluster-scoped store is the whole cluster's: refused without a connection that allows it.
	refused := fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonSourceNotAllowed, 30*time.Second)
	if msg := framework.Condition(refused, v1beta1.ConditionCredentialsReady).Message; !strings.Contains(msg, "credentials.externalSecret.storeRef") || !strings.Contains(msg, store) {
		t.Errorf("the refusal %q names neither the field nor the store", msg)
	}
	if _, err := externalSecret(t, rc); !apierrors.IsNotFound(err) {
		t.Fatalf("an ExternalSecret was written for a store the RedisCluster may not use (%v)", err)
	}
	vc := fw.VaultConnection(t, "vault-es-store", framework.Allow(ns), func(vc *v1beta1.VaultConnection) {
		vc.Spec.ExternalSecrets = &v1beta1.ExternalSecretsAccess{ClusterSecretStores: []string{store}}
	})
	framework.Eventually(t, 30*time.Second, func() string {
		cur := fw.Get(t, rc)
		cur.Spec.Credentials.ExternalSecret.ConnectionRef = &v1beta1.ConnectionReference{Name: vc.Name}
		if err := fw.Client.Update(ctx, cur); err != nil {
			return err.Error()
		}
		return ""
	})
	cur := fw.WaitReady(t, rc, 90*time.Second)
	if c := framework.Condition(cur, v1beta1.ConditionCredentialsReady); c == nil || c.Reason != v1beta1.ReasonLeasesNotTracked {
		t.Errorf("CredentialsReady %+v, want reason %s", c, v1beta1.ReasonLeasesNotTracked)
	}
	if lt := cur.Status.Credential.ExternalSecret.LeasesTracked; lt == nil || *lt {
		t.Errorf("status.credential.externalSecret.leasesTracked %v, want false", lt)
	}
	if len(cur.Status.Leases) != 0 || cur.Status.Credential.Source != v1beta1.SourceExternalSecret {
		t.Errorf("ledger %v, source %s: want no lease, source ExternalSecret", cur.Status.Leases, cur.Status.Credential.Source)
	}
	user, pass, _ := fw.Credentials(rc)
	if !fw.Authenticates(user, pass) {
		t.Fatal("the credential ESO synced does not authenticate against Vault's Redis")
	}
	if msg := fw.OnEveryPod(rc, user, pass, true); msg != "" {
		t.Fatal(msg)
	}
	checkSyncedSecret(t, rc)

	// Drift: the ExternalSecret is put back as specified, and then left alone.
	es, err := externalSecret(t, rc)
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(es); ref == nil || ref.Kind != "RedisCluster" || ref.Name != rc.Name {
		t.Errorf("ExternalSecret controller %+v, want the RedisCluster", ref)
	}
	patch := client.MergeFrom(es.DeepCopy())
	es.Spec.RefreshInterval = &metav1.Duration{Duration: 7 * time.Hour}
	if err := fw.Client.Patch(ctx, es, patch); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 20*time.Second, func() string {
		es, _ = externalSecret(t, rc)
		if d := es.Spec.RefreshInterval.Duration; d != 5*time.Minute {
			return fmt.Sprintf("refreshInterval %s, want it repaired to 5m", d)
		}
		return ""
	})
	// The repaired ExternalSecret made ESO sync a new credential: once it has rolled out, the
	// aclfile holds its user and keyroll's four internal users only, no replaced user is pending,
	// and the node has the new user and not the old one.
	framework.Eventually(t, 60*time.Second, func() string {
		cur := fw.Get(t, rc)
		acl := &corev1.Secret{}
		if err := fw.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders-acl"}, acl); err != nil {
			return err.Error()
		}
		users := strings.Count(string(acl.Data["users.acl"]), " on #")
		if cur.Status.Credential.Username == user || cur.Status.Rollout != nil || len(cur.Status.Credential.SupersededUsers) > 0 ||
			len(cur.Status.RetiringUsers) > 0 || users != 5 {
			return fmt.Sprintf("user %s, rollout %+v, supersededUsers %v, retiringUsers %v, %d users in the aclfile", cur.Status.Credential.Username,
				cur.Status.Rollout, cur.Status.Credential.SupersededUsers, cur.Status.RetiringUsers, users)
		}
		return ""
	})
	fw.WaitReady(t, rc, 60*time.Second)
	newUser, newPass, _ := fw.Credentials(rc)
	if msg := fw.OnEveryPod(rc, newUser, newPass, true); msg != "" {
		t.Error(msg)
	}
	if msg := fw.OnEveryPod(rc, user, pass, false); msg != "" {
		t.Errorf("after ESO's new credential rolled out: %s", msg)
	}
	checkSyncedSecret(t, rc)
	es, _ = externalSecret(t, rc)
	generation := es.Generation
	time.Sleep(3 * time.Second)
	if es, _ = externalSecret(t, rc); es.Generation != generation {
		t.Errorf("the ExternalSecret keeps changing: generation %d, then %d", generation, es.Generation)
	}

	deleteAndWait(t, rc)
	framework.Eventually(t, 30*time.Second, func() string {
		err := fw.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders-credentials"}, &corev1.Secret{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("the credentials Secret is still there (%v)", err)
		}
		return ""
	})
	if !fw.HasEvent(t, ns, "orders", v1beta1.EventRevocationSkipped) {
		t.Error("no RevocationSkipped event saying that the leases were not tracked")
	}
}

// With resultType Raw the lease is keyroll's: it is in the ledger, renewed past its first TTL;
// a new credential from ESO goes onto the Redis node live (no Redis pod restarts), then to the
// consumer; after the rollout the old user is gone from the node and the old lease is revoked;
// delete revokes the rest: no lease for the role is left. No password, keyroll's internal ones
// included, reaches the logs, status or events.
func TestExternalSecretRawLeaseIsTrackedRenewedRolledOutAndRevoked(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "es-raw")
	vc := fw.VaultConnection(t, "vault-es-raw", framework.Allow(ns))
	fw.VaultDynamicSecret(t, ns, "redis-orders", "es-raw", true)
	fw.StandInConsumer(t, ns, "orders-api", 2)
	rc := fw.ExternalSecretCluster(t, ns, "orders", v1beta1.ExternalSecretSource{
		GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-orders"},
		RefreshInterval: &metav1.Duration{Duration: time.Hour},
		ConnectionRef:   &v1beta1.ConnectionReference{Name: vc.Name},
	}, framework.WithConsumers("orders-api"))
	start := time.Now()
	cur := fw.WaitReady(t, rc, 90*time.Second)
	t.Logf("Ready %s after create", time.Since(start).Round(time.Millisecond))
	if c := framework.Condition(cur, v1beta1.ConditionCredentialsReady); c == nil || c.Reason != v1beta1.ReasonLeasesTracked {
		t.Errorf("CredentialsReady %+v, want reason %s", c, v1beta1.ReasonLeasesTracked)
	}
	c := cur.Status.Credential
	if c.Lease.LeaseID == "" || c.ExternalSecret.LeasesTracked == nil || !*c.ExternalSecret.LeasesTracked {
		t.Fatalf("status.credential %+v: want a tracked lease", c)
	}
	firstLease, firstExpiry := c.Lease.LeaseID, c.Lease.ExpiresAt.Time
	active := 0
	for _, l := range cur.Status.Leases {
		if l.State == v1beta1.LeaseActive {
			active++
			if l.LeaseID != firstLease {
				t.Errorf("active ledger lease %s, want %s", l.LeaseID, firstLease)
			}
		}
	}
	if active != 1 {
		t.Errorf("%d active leases in the ledger, want 1: %+v", active, cur.Status.Leases)
	}
	user, pass, _ := fw.Credentials(rc)
	if !fw.Authenticates(user, pass) {
		t.Fatal("the credential ESO synced does not authenticate")
	}
	if msg := fw.OnEveryPod(rc, user, pass, true); msg != "" {
		t.Fatal(msg)
	}
	checkSyncedSecret(t, rc)

	// Renewal: 20 s leases; past the first expiry the credential still works.
	time.Sleep(time.Until(firstExpiry.Add(5 * time.Second)))
	if !fw.Authenticates(user, pass) {
		t.Fatal("the credential stopped working after its first TTL: the lease was not renewed")
	}
	if exists, exp := fw.LeaseExists(firstLease); !exists || !exp.After(firstExpiry) {
		t.Fatalf("lease in Vault: exists %v, expires %s; want it renewed past %s", exists, exp, firstExpiry)
	}
	cur = fw.Get(t, rc)
	if cur.Status.Credential.Lease.LastRenewal == nil || cur.Status.Credential.Lease.LeaseID != firstLease {
		t.Errorf("status after renewal: %+v", cur.Status.Credential)
	}

	// A new credential from ESO (rotate-now makes keyroll ask ESO to refresh) rolls out as in
	// VaultLease mode: onto the node first, then to the consumer.
	oldVersion := cur.Status.Credential.Version
	runs := podRuns(t, rc)
	before := framework.Reasons(fw.ClusterEvents(t, ns, "orders"))
	published := watchPublication(t, rc, "orders-api", oldVersion)
	fw.RotateNow(t, rc)
	framework.Eventually(t, 120*time.Second, func() string {
		cur = fw.Get(t, rc)
		if cur.Status.Credential.Version == oldVersion || cur.Status.Rollout != nil {
			return fmt.Sprintf("rollout not finished: version %s, rollout %+v", cur.Status.Credential.Version, cur.Status.Rollout)
		}
		if hasLeaseID(cur, firstLease) {
			return "the superseded lease is still in the ledger"
		}
		return ""
	})
	for _, p := range published() {
		t.Error(p)
	}
	fw.CheckRetired(t, rc, "orders-api", user, pass, firstLease)
	if after := podRuns(t, rc); !maps.Equal(after, runs) {
		t.Errorf("a Redis pod restarted in a Live rotation:\nbefore %v\nafter  %v", runs, after)
	}
	checkSyncedSecret(t, rc)
	newUser, newPass, _ := fw.Credentials(rc)
	es, err := externalSecret(t, rc)
	if err != nil || es.Annotations[v1beta1.AnnotationRefreshRequested] == "" {
		t.Errorf("ExternalSecret has no %s annotation (%v)", v1beta1.AnnotationRefreshRequested, err)
	}
	reasons := framework.NewReasons(before, framework.Reasons(fw.ClusterEvents(t, ns, "orders")))
	for _, want := range []string{v1beta1.EventRefreshRequested, v1beta1.EventUsersApplied, v1beta1.EventConsumerRestarted,
		v1beta1.EventUsersRetired, v1beta1.EventLeaseRevoked} {
		if !slices.Contains(reasons, want) {
			t.Errorf("no %s event (the rotation's events: %v)", want, reasons)
		}
	}
	if slices.Contains(reasons, v1beta1.EventPodRestarted) {
		t.Errorf("a Live rotation recorded PodRestarted: %v", reasons)
	}

	statusJSON, _ := json.Marshal(fw.Get(t, rc).Status)
	events := &eventsv1.EventList{}
	if err := fw.Client.List(ctx, events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	eventsJSON, _ := json.Marshal(events.Items)
	secrets := map[string]string{"first password": pass, "second password": newPass}
	for k, v := range fw.InternalPasswords(t, rc) {
		secrets[k] = v
	}
	for what, secret := range secrets {
		for where, text := range map[string]string{"logs": fw.Logs.String(), "status": string(statusJSON), "events": string(eventsJSON)} {
			if secret == "" || strings.Contains(text, secret) {
				t.Errorf("the %s (%d characters) appears in the operator's %s", what, len(secret), where)
			}
		}
	}

	// Delete: the ExternalSecret goes first, then every lease is revoked; Vault holds none for the
	// role, whatever ESO minted.
	deleteAndWait(t, rc)
	if leases := fw.VaultLeases(t, fw.Path("es-raw")); len(leases) != 0 {
		t.Errorf("leases of role %s left live in Vault after delete: %v", fw.Role("es-raw"), leases)
	}
	if fw.Authenticates(newUser, newPass) {
		t.Error("the credential still authenticates after delete")
	}
}

// A raw response without a VaultConnection: keyroll cannot renew the lease, says so, and warns
// that the refresh interval is longer than the lease (ESO would leave an expired credential).
// TestExternalSecretLeaseEndingWithESOsTokenIsReplacedAndReported: External Secrets Operator logs
// in for each sync and never renews its token, and keyroll cannot keep that token alive: a lease
// ESO obtained dies with ESO's token (Vault does not cap the lease's renewals for it; the lease is
// simply revoked). With ESO's tokens shorter than refreshInterval, keyroll notices the dead lease
// within its lease-check interval, asks ESO for a new credential at once, and says in status what
// to change. With tokens that outlive refreshInterval, every credential is replaced before its
// lease could lapse.
func TestExternalSecretLeaseEndingWithESOsTokenIsReplacedAndReported(t *testing.T) {
	t.Run("token shorter than refreshInterval", func(t *testing.T) {
		ns := fw.Namespace(t, "es-short-token")
		vc := fw.VaultConnection(t, "vault-es-short-token", framework.Allow(ns))
		fw.VaultDynamicSecret(t, ns, "redis-orders", "es-long", true, 20*time.Second)
		rc := fw.ExternalSecretCluster(t, ns, "orders", v1beta1.ExternalSecretSource{
			GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-orders"},
			RefreshInterval: &metav1.Duration{Duration: time.Hour},
			ConnectionRef:   &v1beta1.ConnectionReference{Name: vc.Name},
		})
		cur := fw.WaitReady(t, rc, 90*time.Second)
		first := cur.Status.Credential.Lease.LeaseID
		cur = fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionTrue, v1beta1.ReasonLeaseEndedEarly, 100*time.Second)
		c := framework.Condition(cur, v1beta1.ConditionDegraded)
		if !strings.Contains(c.Message, "token TTL well above") {
			t.Errorf("Degraded message does not say what to change: %s", c.Message)
		}
		if exists, _ := fw.LeaseExists(first); exists {
			t.Errorf("the first lease still exists; the test's premise (it dies with ESO's 20 s token) failed")
		}
		framework.Eventually(t, 30*time.Second, func() string {
			u, p, ok := fw.Credentials(rc)
			if cur := fw.Get(t, rc); !ok || cur.Status.Credential.Lease.LeaseID == first || !fw.Authenticates(u, p) {
				return fmt.Sprintf("no new working credential yet (lease %s)", cur.Status.Credential.Lease.LeaseID)
			}
			return fw.OnEveryPod(rc, u, p, true)
		})
		if !fw.HasEvent(t, ns, "orders", v1beta1.EventLeaseRevokedOutside) {
			t.Errorf("no %s event", v1beta1.EventLeaseRevokedOutside)
		}
		t.Logf("Degraded: %s", c.Message)
	})
	t.Run("token longer than refreshInterval", func(t *testing.T) {
		ns := fw.Namespace(t, "es-long-token")
		vc := fw.VaultConnection(t, "vault-es-long-token", framework.Allow(ns))
		fw.VaultDynamicSecret(t, ns, "redis-orders", "es-long", true, time.Minute)
		rc := fw.ExternalSecretCluster(t, ns, "orders", v1beta1.ExternalSecretSource{
			GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-orders"},
			RefreshInterval: &metav1.Duration{Duration: 15 * time.Second},
			ConnectionRef:   &v1beta1.ConnectionReference{Name: vc.Name},
		})
		fw.WaitReady(t, rc, 90*time.Second)
		seen := map[string]bool{}
		for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
			cur := fw.Get(t, rc)
			for _, l := range cur.Status.Leases {
				seen[l.LeaseID] = true
				if exists, _ := fw.LeaseExists(l.LeaseID); !exists && l.State == v1beta1.LeaseActive {
					t.Fatalf("the active lease %s died before keyroll replaced it", l.LeaseID)
				}
			}
			if u, p, ok := fw.Credentials(rc); !ok || !fw.Authenticates(u, p) {
				t.Fatalf("the credential in the Secret (user %q) does not authenticate", u)
			}
		}
		if len(seen) < 3 {
			t.Errorf("%d leases in 90 s of 15 s refreshes, want at least 3", len(seen))
		}
		if slices.Contains(framework.Reasons(fw.ClusterEvents(t, ns, "orders")), v1beta1.EventLeaseRevokedOutside) {
			t.Errorf("a lease died before it was replaced")
		}
	})
}

func TestExternalSecretUntrackedLeaseWithLongRefreshIntervalIsReported(t *testing.T) {
	ns := fw.Namespace(t, "es-warn")
	fw.VaultDynamicSecret(t, ns, "redis-orders", "es-warn", true)
	rc := fw.ExternalSecretCluster(t, ns, "orders", v1beta1.ExternalSecretSource{
		GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-orders"},
		RefreshInterval: &metav1.Duration{Duration: time.Hour},
	})
	cur := fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionTrue, v1beta1.ReasonRefreshIntervalTooLong, 90*time.Second)
	if c := framework.Condition(cur, v1beta1.ConditionCredentialsReady); c == nil || c.Reason != v1beta1.ReasonLeasesNotTracked {
		t.Errorf("CredentialsReady %+v, want reason %s", c, v1beta1.ReasonLeasesNotTracked)
	}
	if lt := cur.Status.Credential.ExternalSecret.LeasesTracked; lt == nil || *lt {
		t.Errorf("leasesTracked %v, want false", lt)
	}
	if !fw.HasEvent(t, ns, "orders", v1beta1.ReasonRefreshIntervalTooLong) {
		t.Error("no RefreshIntervalTooLong warning event")
	}
	deleteAndWait(t, rc)
}

func hasLeaseID(rc *v1beta1.RedisCluster, id string) bool {
	for _, l := range rc.Status.Leases {
		if l.LeaseID == id {
			return true
		}
	}
	return false
}

// A generator that cannot obtain a credential: ESO's reason reaches the RedisCluster's condition;
// the Redis objects exist (they need no credential), but no consumers' Secret is written and the
// aclfile holds keyroll's own users only.
func TestExternalSecretThatESOCannotSyncIsReportedWithESOsReason(t *testing.T) {
	ns := fw.Namespace(t, "es-broken")
	fw.VaultDynamicSecret(t, ns, "redis-missing", "no-such-role", false)
	rc := fw.ExternalSecretCluster(t, ns, "orders", v1beta1.ExternalSecretSource{
		GeneratorRef: &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-missing"},
	})
	var cond *metav1.Condition
	framework.Eventually(t, 60*time.Second, func() string {
		cond = framework.Condition(fw.Get(t, rc), v1beta1.ConditionCredentialsReady)
		if cond == nil || cond.Reason != v1beta1.ReasonExternalSecretNotReady || !strings.Contains(cond.Message, "is not Ready") {
			return fmt.Sprintf("CredentialsReady %+v, want ExternalSecretNotReady with ESO's reason", cond)
		}
		return ""
	})
	t.Logf("condition message: %s", cond.Message)
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "orders"}, &appsv1.StatefulSet{}); err != nil {
		t.Errorf("no StatefulSet although the Redis objects come before the credential: %v", err)
	}
	if _, _, ok := fw.Credentials(rc); ok {
		t.Error("a consumers' Secret exists without a credential")
	}
	acl := &corev1.Secret{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "orders-acl"}, acl); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(acl.Data["users.acl"]), " on #"); n != 4 {
		t.Errorf("the aclfile holds %d users without a credential, want keyroll's 4:\n%s", n, acl.Data["users.acl"])
	}
	deleteAndWait(t, rc)
}
