package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// esLedgerCluster is a RedisCluster of two nodes in ExternalSecret mode whose lease keyroll
// tracks through the VaultConnection conn, with the stand-in consumer "api" (held by the tests
// where they need a rollout that does not end).
func esLedgerCluster(t *testing.T, ns, conn, role string, refresh time.Duration, opts ...framework.ClusterOption) *v1beta1.RedisCluster {
	t.Helper()
	fw.VaultDynamicSecret(t, ns, "redis-orders", role, true)
	fw.StandInConsumer(t, ns, "api", 1)
	opts = append([]framework.ClusterOption{framework.Replicas(2), framework.WithConsumers("api")}, opts...)
	return fw.ExternalSecretCluster(t, ns, "orders", v1beta1.ExternalSecretSource{
		GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-orders"},
		RefreshInterval: &metav1.Duration{Duration: refresh},
		ConnectionRef:   &v1beta1.ConnectionReference{Name: conn},
	}, opts...)
}

// TestExternalSecretRevokedOutsideIsCutOff: a lease External Secrets Operator obtained and keyroll
// tracks, revoked outside keyroll (`vault lease revoke` as root), is honoured as in VaultLease mode:
// with onRevokedOutside CutOff its user no longer logs in on any Redis node while the new
// credential's rollout is held at the consumer; with RollOver it keeps working until that rollout
// is done. Either way a new credential from External Secrets Operator works on every node, and
// afterwards the revoked user is gone everywhere.
func TestExternalSecretRevokedOutsideIsCutOff(t *testing.T) {
	t.Parallel()
	for _, policy := range []v1beta1.RevokedOutsidePolicy{v1beta1.RevokedOutsideCutOff, v1beta1.RevokedOutsideRollOver} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			esRevokedOutside(t, policy)
		})
	}
}

func esRevokedOutside(t *testing.T, policy v1beta1.RevokedOutsidePolicy) {
	base := "es-revoked-" + strings.ToLower(string(policy))
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, "vault-"+base, framework.Allow(ns))
	rc := esLedgerCluster(t, ns, vc.Name, "es-long", time.Hour,
		func(rc *v1beta1.RedisCluster) { rc.Spec.Credentials.OnRevokedOutside = policy })
	cur := fw.WaitReady(t, rc, 2*time.Minute)
	lease := cur.Status.Credential.Lease.LeaseID
	oldUser, oldPass, _ := fw.Credentials(rc)
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); lease == "" || msg != "" {
		t.Fatalf("before the revocation: lease %q, %s", lease, msg)
	}
	fw.PauseDeployment(t, client.ObjectKey{Namespace: ns, Name: "api"}, true) // hold the new credential's rollout at the consumer

	if err := fw.Ground.Vault.Root.Sys().RevokeWithContext(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	var newUser, newPass string
	var replaced time.Duration
	framework.ReliabilityRow(t, "rollouts", "ExternalSecret mode: a tracked lease revoked outside keyroll, onRevokedOutside "+string(policy),
		map[v1beta1.RevokedOutsidePolicy]string{
			v1beta1.RevokedOutsideCutOff:   "its user is refused on every node at once, while the new credential's rollout is held",
			v1beta1.RevokedOutsideRollOver: "its user keeps working until the new credential has rolled out, then leaves every node",
		}[policy],
		func() string {
			return fmt.Sprintf("External Secrets Operator's new credential on every node %s after the revocation; the revoked user checked on both nodes while the rollout was held, then gone everywhere after it; the lease out of the ledger", replaced.Round(100*time.Millisecond))
		})
	framework.Eventually(t, 90*time.Second, func() string {
		u, p, ok := fw.Credentials(rc)
		if !ok || u == oldUser {
			return fmt.Sprintf("the consumers' Secret still holds %q", u)
		}
		newUser, newPass = u, p
		return fw.OnEveryPod(rc, u, p, true)
	})
	replaced = time.Since(revoked)
	t.Logf("%s: External Secrets Operator's new credential was on every node %s after the revocation", policy, replaced.Round(100*time.Millisecond))
	framework.Eventually(t, 15*time.Second, func() string {
		if fw.Get(t, rc).Status.Rollout == nil {
			return "no rollout in progress although the consumer is paused"
		}
		if !fw.HasEvent(t, ns, "orders", v1beta1.EventLeaseRevokedOutside) {
			return "no " + v1beta1.EventLeaseRevokedOutside + " event"
		}
		return ""
	})
	switch policy {
	case v1beta1.RevokedOutsideCutOff:
		if msg := fw.OnEveryPod(rc, oldUser, oldPass, false); msg != "" {
			t.Errorf("CutOff: the revoked user is not cut off on every Redis node while the rollout is held: %s", msg)
		}
	case v1beta1.RevokedOutsideRollOver:
		if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
			t.Errorf("RollOver: the revoked user was cut off before the new credential rolled out: %s", msg)
		}
	}
	if cur := fw.Get(t, rc); cur.Status.Rollout == nil {
		t.Fatalf("%s: the rollout ended while the nodes were checked: the check proves nothing", policy)
	}
	fw.PauseDeployment(t, client.ObjectKey{Namespace: ns, Name: "api"}, false)
	framework.Eventually(t, 90*time.Second, func() string {
		cur := fw.Get(t, rc)
		if cur.Status.Rollout != nil || len(cur.Status.Credential.SupersededUsers) > 0 || len(cur.Status.RetiringUsers) > 0 || cur.Status.Credential.ExternalSecret.CutOff {
			return fmt.Sprintf("rollout %+v, superseded users %q, retiring users %q, cutOff %v", cur.Status.Rollout,
				cur.Status.Credential.SupersededUsers, cur.Status.RetiringUsers, cur.Status.Credential.ExternalSecret.CutOff)
		}
		return fw.OnEveryPod(rc, oldUser, oldPass, false)
	})
	if msg := fw.OnEveryPod(rc, newUser, newPass, true); msg != "" {
		t.Errorf("after the rollout the new credential does not work on every node: %s", msg)
	}
	if hasLeaseID(fw.Get(t, rc), lease) {
		t.Errorf("the revoked lease %s is still in the ledger", lease)
	}
}

// editSpec changes rc's spec through a merge patch from the object as the API server has it.
func editSpec(t *testing.T, rc *v1beta1.RedisCluster, edit func(*v1beta1.RedisCluster)) {
	t.Helper()
	cur := fw.Get(t, rc)
	patch := client.MergeFrom(cur.DeepCopy())
	edit(cur)
	if err := fw.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// TestExternalSecretLedgerStaysWithinBounds: External Secrets Operator refreshes every second
// while the rollout is held at the consumer, so each credential it mints is kept: keyroll pauses
// its refreshes before the ledger is full (LedgerFull, with an event), every status write succeeds
// (the API server never refuses one as too long), and every lease Vault holds under the role is in
// the ledger. Once the rollout is done, the superseded leases are revoked and refreshes resume.
func TestExternalSecretLedgerStaysWithinBounds(t *testing.T) {
	t.Parallel()
	const stimulus = 150 * time.Second // a hundred and more refreshes, were they not paused
	ns := fw.Namespace(t, "es-bounds")
	vc := fw.VaultConnection(t, "vault-es-bounds", framework.Allow(ns))
	rc := esLedgerCluster(t, ns, vc.Name, "es-bounds", time.Hour)
	fw.WaitReady(t, rc, 2*time.Minute)
	fw.PauseDeployment(t, client.ObjectKey{Namespace: ns, Name: "api"}, true)
	logStart := len(fw.Logs.String())
	editSpec(t, rc, func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ExternalSecret.RefreshInterval = &metav1.Duration{Duration: time.Second}
	})
	start := time.Now()
	most, versions := 0, map[string]bool{}
	var pausedAt time.Duration
	framework.ReliabilityRow(t, "rollouts", "ExternalSecret mode: a refresh every second for 2m30s while the rollout is held",
		"refreshes pause before the ledger is full (LedgerFull); every status write succeeds; every lease live in Vault is in the ledger; the pause lifts after the rollout",
		func() string {
			return fmt.Sprintf("%d credentials adopted; LedgerFull %s after the refreshes began, at %d of 64 leases; no status write refused; every lease Vault held was in the ledger; after the rollout the superseded leases were revoked and refreshes resumed",
				len(versions), pausedAt.Round(time.Second), most)
		})
	for time.Since(start) < stimulus {
		cur := fw.Get(t, rc)
		most = max(most, len(cur.Status.Leases))
		versions[cur.Status.Credential.Version] = true
		if c := framework.Condition(cur, v1beta1.ConditionSourceHealthy); pausedAt == 0 && c != nil && c.Reason == v1beta1.ReasonLedgerFull {
			pausedAt = time.Since(start)
			t.Logf("LedgerFull %s after the refreshes began, with %d leases: %s", pausedAt.Round(time.Second), len(cur.Status.Leases), c.Message)
		}
		time.Sleep(time.Second)
	}
	cur := fw.Get(t, rc)
	t.Logf("in %s of one-second refreshes: %d credential versions adopted, at most %d leases in the ledger, %d now", stimulus, len(versions), most, len(cur.Status.Leases))
	if pausedAt == 0 {
		t.Errorf("no LedgerFull reported in %s of one-second refreshes with the rollout held (at most %d leases)", stimulus, most)
	}
	if !fw.HasEvent(t, ns, "orders", v1beta1.ReasonLedgerFull) {
		t.Errorf("no %s event", v1beta1.ReasonLedgerFull)
	}
	if logs := fw.Logs.String()[logStart:]; strings.Contains(logs, "must have at most") {
		t.Errorf("the API server refused a status write as too long:\n%s", firstLineWith(logs, "must have at most"))
	}
	unrecorded := 0
	for _, id := range fw.VaultLeases(t, fw.Path("es-bounds")) {
		if !hasLeaseID(cur, id) {
			unrecorded++
			t.Errorf("lease %s is live in Vault and not in the ledger", id)
		}
	}
	if es, err := externalSecret(t, rc); err != nil || es.Spec.RefreshPolicy != "CreatedOnce" {
		t.Errorf("ExternalSecret refreshPolicy %q (%v): want CreatedOnce while the ledger is full", es.Spec.RefreshPolicy, err)
	}

	// The rollout ends: the superseded leases are revoked, the pause is lifted.
	editSpec(t, rc, func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ExternalSecret.RefreshInterval = &metav1.Duration{Duration: time.Hour}
	})
	fw.PauseDeployment(t, client.ObjectKey{Namespace: ns, Name: "api"}, false)
	framework.Eventually(t, 3*time.Minute, func() string {
		cur := fw.Get(t, rc)
		c := framework.Condition(cur, v1beta1.ConditionSourceHealthy)
		if cur.Status.Rollout != nil || len(cur.Status.Leases) > 2 || c == nil || c.Reason == v1beta1.ReasonLedgerFull {
			return fmt.Sprintf("rollout %v, %d leases, SourceHealthy %+v", cur.Status.Rollout != nil, len(cur.Status.Leases), c)
		}
		return ""
	})
	if es, err := externalSecret(t, rc); err != nil || es.Spec.RefreshPolicy == "CreatedOnce" {
		t.Errorf("ExternalSecret refreshPolicy %q (%v) after the rollout: want the spec's again", es.Spec.RefreshPolicy, err)
	}
	// ESO answers the lifted pause with a credential of its own: every lease it mints is in the
	// ledger once keyroll has seen its Secret.
	framework.Eventually(t, 30*time.Second, func() string {
		cur := fw.Get(t, rc)
		for _, id := range fw.VaultLeases(t, fw.Path("es-bounds")) {
			if !hasLeaseID(cur, id) {
				return fmt.Sprintf("after the rollout, lease %s is live in Vault and not in the ledger %+v", id, cur.Status.Leases)
			}
		}
		return ""
	})
	deleteAndWait(t, rc)
	if live := fw.VaultLeases(t, fw.Path("es-bounds")); len(live) != 0 {
		t.Errorf("%d leases left in Vault after delete", len(live))
	}
}

func firstLineWith(text, s string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

// TestExternalSecretConnectionChangeRevokesThroughTheOld: each lease External Secrets Operator
// obtained is recorded with the VaultConnection keyroll tracks it through. When
// externalSecret.connectionRef moves to another VaultConnection (another Vault identity here, so
// that Vault's audit log tells them apart), keyroll asks for a new credential, tracks it through
// the new connection, and revokes the old lease after the rollout through the old one; when
// connectionRef is removed, the lease tracked so far is still renewed and revoked through the
// connection it came through, and the ledger is left empty.
func TestExternalSecretConnectionChangeRevokesThroughTheOld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	second := fw.OperatorAuthRole(time.Hour)
	second.Name = fw.Name("keyroll-second")
	if err := fw.Ground.Vault.WriteKubernetesAuthRole(ctx, second); err != nil {
		t.Fatal(err)
	}
	ns := fw.Namespace(t, "es-conn")
	vcA := fw.VaultConnection(t, "vault-es-conn-a", framework.Allow(ns))
	vcB := fw.VaultConnection(t, "vault-es-conn-b", framework.AuthRole(second.Name), framework.Allow(ns))
	rc := esLedgerCluster(t, ns, vcA.Name, "es-conn", time.Hour)
	cur := fw.WaitReady(t, rc, 2*time.Minute)
	first := cur.Status.Credential.Lease.LeaseID
	if rec := leaseOf(cur, first); rec == nil || rec.Connection != vcA.Name {
		t.Fatalf("the first lease's record %+v: want connection %s", rec, vcA.Name)
	}

	var throughA []framework.AuditEntry
	framework.ReliabilityRow(t, "rollouts", "ExternalSecret mode: connectionRef moved to another VaultConnection, then removed",
		"a new credential tracked through the new connection; the old lease revoked through the old one; after removal, the last tracked lease revoked through its connection and the ledger empty",
		func() string {
			return fmt.Sprintf("Vault's audit log: %d requests naming the first lease, all through the old connection's identity, its revocation among them; none through the new one's; the second lease revoked through the connection it came through once connectionRef was removed", len(throughA))
		})
	editSpec(t, rc, func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ExternalSecret.ConnectionRef = &v1beta1.ConnectionReference{Name: vcB.Name}
	})
	var secondLease string
	framework.Eventually(t, 2*time.Minute, func() string {
		cur := fw.Get(t, rc)
		c := cur.Status.Credential
		if c.Lease.LeaseID == first || cur.Status.Rollout != nil || hasLeaseID(cur, first) {
			return fmt.Sprintf("lease %s, rollout %v, first lease in the ledger %v", c.Lease.LeaseID, cur.Status.Rollout != nil, hasLeaseID(cur, first))
		}
		if rec := leaseOf(cur, c.Lease.LeaseID); rec == nil || rec.Connection != vcB.Name {
			return fmt.Sprintf("the new lease's record %+v: want connection %s", rec, vcB.Name)
		}
		secondLease = c.Lease.LeaseID
		return ""
	})
	if live, _ := fw.LeaseExists(first); live {
		t.Errorf("the first lease %s is still live in Vault after it left the ledger", first)
	}
	throughA = leaseRequests(t, first, fw.OperatorRole)
	throughB := leaseRequests(t, first, second.Name)
	if !slices.ContainsFunc(throughA, isRevoke) || len(throughB) > 0 {
		t.Errorf("requests naming the first lease: through %s's identity%s\nthrough %s's identity%s\nwant its revocation through the old connection only",
			vcA.Name, describeRequests(throughA), vcB.Name, describeRequests(throughB))
	}
	t.Logf("the first lease, revoked through the old connection:%s", describeRequests(throughA))

	editSpec(t, rc, func(rc *v1beta1.RedisCluster) { rc.Spec.Credentials.ExternalSecret.ConnectionRef = nil })
	framework.Eventually(t, 2*time.Minute, func() string {
		cur := fw.Get(t, rc)
		if cur.Status.Rollout != nil || len(cur.Status.Leases) > 0 || cur.Status.Credential.Lease.LeaseID == secondLease {
			return fmt.Sprintf("rollout %v, ledger %+v", cur.Status.Rollout != nil, cur.Status.Leases)
		}
		return ""
	})
	if live, _ := fw.LeaseExists(secondLease); live {
		t.Errorf("the second lease %s is still live in Vault after connectionRef was removed and the rollout done", secondLease)
	}
	if byB := leaseRequests(t, secondLease, second.Name); !slices.ContainsFunc(byB, isRevoke) {
		t.Errorf("the second lease was not revoked through %s, which it came through:%s", vcB.Name, describeRequests(byB))
	}
	if u, p, ok := fw.Credentials(rc); !ok || !fw.Authenticates(u, p) {
		t.Errorf("the credential in the consumers' Secret (user %q) does not work without connectionRef", u)
	}
	deleteAndWait(t, rc)
}

// leaseRequests are the requests made through the Vault identity of auth role role that name lease id.
func leaseRequests(t *testing.T, id, role string) []framework.AuditEntry {
	t.Helper()
	hashed, err := fw.AuditHash(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return requestsOf(t, role, func(e framework.AuditEntry) bool { return e.Names(id, hashed) })
}

func isRevoke(e framework.AuditEntry) bool { return strings.Contains(e.Request.Path, "leases/revoke") }

func leaseOf(rc *v1beta1.RedisCluster, id string) *v1beta1.LeaseRecord {
	for i := range rc.Status.Leases {
		if rc.Status.Leases[i].LeaseID == id {
			return &rc.Status.Leases[i]
		}
	}
	return nil
}
