package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// A new RedisCluster of three Redis nodes becomes Ready with a credential from Vault that works
// against Vault's Redis and on every Redis pod, none of which mounts it; a reconcile of the steady
// cluster writes nothing, calls Vault for nothing and sends no Redis command.
func TestIssueGivesAWorkingCredentialAndASteadyStateWritesNothing(t *testing.T) {
	ns := fw.Namespace(t, "issue")
	vc := fw.VaultConnection(t, "vault-issue", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(3))
	start := time.Now()
	cur := fw.WaitCondition(t, rc, v1beta1.ConditionReady, metav1.ConditionTrue, v1beta1.ReasonAvailable, 90*time.Second)
	t.Logf("Ready %s after create", time.Since(start).Round(time.Millisecond))

	user, pass, ok := fw.Credentials(rc)
	if !ok || !fw.Authenticates(user, pass) {
		t.Fatalf("the credentials Secret does not hold a working credential (user %q)", user)
	}
	if msg := fw.OnEveryPod(rc, user, pass, true); msg != "" {
		t.Fatal(msg)
	}
	for _, p := range fw.RedisPods(t, rc) {
		if p.Spec.NodeName != testground.RealNodeName {
			t.Errorf("pod %s runs on %q, want the real node", p.Name, p.Spec.NodeName)
		}
		for _, v := range p.Spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName != "orders-acl" {
				t.Errorf("pod %s mounts Secret %s; a Redis pod mounts only the ACL Secret", p.Name, v.Secret.SecretName)
			}
		}
	}
	if c := framework.Condition(cur, v1beta1.ConditionUsersApplied); c == nil || c.Reason != v1beta1.ReasonApplied {
		t.Errorf("UsersApplied %+v", c)
	}
	if len(cur.Status.Nodes) != 3 {
		t.Errorf("status.nodes records %d nodes, want 3: %+v", len(cur.Status.Nodes), cur.Status.Nodes)
	}
	c := cur.Status.Credential
	if c == nil || c.Lease.LeaseID == "" || c.Lease.ExpiresAt == nil || !c.Lease.Renewable || c.Username != user {
		t.Fatalf("status.credential incomplete: %+v", c)
	}
	if len(cur.Status.Leases) != 1 || cur.Status.Leases[0].State != v1beta1.LeaseActive || cur.Status.Leases[0].LeaseID != c.Lease.LeaseID {
		t.Fatalf("ledger: %+v", cur.Status.Leases)
	}
	if cur.Status.Phase != v1beta1.PhaseReady || cur.Status.ReadyReplicas != 3 || cur.Status.ObservedGeneration != cur.Generation {
		t.Fatalf("phase %s, ready %d, observedGeneration %d", cur.Status.Phase, cur.Status.ReadyReplicas, cur.Status.ObservedGeneration)
	}
	if exists, _ := fw.LeaseExists(c.Lease.LeaseID); !exists {
		t.Fatal("Vault does not know the lease in status")
	}
	for _, want := range []string{v1beta1.EventCredentialsIssued, v1beta1.EventUsersApplied} {
		if !fw.HasEvent(t, ns, "orders", want) {
			t.Errorf("no %s event", want)
		}
	}
	// Redis pods that start are waited for, not reported (they refuse connections at first).
	if w := framework.Notes(framework.Warnings(fw.ClusterEvents(t, ns, "orders"))); len(w) > 0 {
		t.Errorf("warnings while a new cluster came up: %v", w)
	}

	// The VaultConnection reports the login, the token's expiry and Vault's version and seal state
	// (more than fw.WaitConnectionReady checks).
	framework.Eventually(t, 30*time.Second, func() string {
		st := fw.GetConnection(t, vc.Name).Status
		ready := apimeta.FindStatusCondition(st.Conditions, v1beta1.ConditionReady)
		if ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != v1beta1.ReasonLoggedIn ||
			st.VaultVersion == "" || st.Sealed == nil || *st.Sealed || st.TokenExpiresAt == nil || !st.TokenExpiresAt.After(time.Now()) {
			return fmt.Sprintf("VaultConnection %s status: %+v", vc.Name, st)
		}
		return ""
	})

	// Reconcile again with nothing changed: no write to the API server, no call to Vault.
	steadyStateWritesNothing(t, rc, vc.Name)
}

// aclCommands reads, on every Redis pod of rc, how often each ACL subcommand ran (INFO
// commandstats, as keyroll's admin user), keyed "pod acl|subcommand".
func aclCommands(t *testing.T, rc *v1beta1.RedisCluster) map[string]string {
	t.Helper()
	admin := fw.InternalPasswords(t, rc)["admin-password"]
	out := map[string]string{}
	for _, p := range fw.RedisPods(t, rc) {
		info, err := testground.RedisDo(framework.PodAddr(&p), "keyroll-admin", admin, "INFO", "commandstats")
		if err != nil {
			t.Fatalf("INFO commandstats on %s: %v", p.Name, err)
		}
		for _, line := range strings.Split(info, "\n") {
			name, stats, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_")), ":")
			if ok && strings.HasPrefix(name, "acl|") {
				calls, _, _ := strings.Cut(stats, ",")
				out[p.Name+" "+name] = calls
			}
		}
		if out[p.Name+" acl|setuser"] == "" {
			t.Fatalf("INFO commandstats on %s counts no ACL SETUSER, although keyroll gave it its users:\n%s", p.Name, info)
		}
	}
	return out
}

func TestLeaseIsRenewedBeforeExpiryAndReissuedWhenRevokedOutside(t *testing.T) {
	ns := fw.Namespace(t, "renew")
	vc := fw.VaultConnection(t, "vault-renew", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "short", vc.Name, fw.Path("short"))
	cur := fw.WaitReady(t, rc, 60*time.Second)
	first := cur.Status.Credential
	user, pass, _ := fw.Credentials(rc)
	firstExpiry := first.Lease.ExpiresAt.Time

	// The 20 s lease is renewed before it expires, and Vault shows the extended expiry; the
	// credential keeps working for a minute, in Vault's Redis and on the cluster's.
	deadline := time.Now().Add(60 * time.Second)
	renewed := false
	for time.Now().Before(deadline) {
		if !fw.Authenticates(user, pass) {
			t.Fatalf("the credential stopped working %s into the minute", 60*time.Second-time.Until(deadline))
		}
		if msg := fw.OnEveryPod(rc, user, pass, true); msg != "" {
			t.Fatalf("%s into the minute: %s", 60*time.Second-time.Until(deadline), msg)
		}
		if exists, exp := fw.LeaseExists(first.Lease.LeaseID); !exists {
			t.Fatal("the lease disappeared from Vault")
		} else if exp.After(firstExpiry.Add(2 * time.Second)) {
			renewed = true
		}
		time.Sleep(2 * time.Second)
	}
	cur = fw.Get(t, rc)
	if !renewed || cur.Status.Credential.Lease.LastRenewal == nil || cur.Status.Credential.Lease.LeaseID != first.Lease.LeaseID {
		t.Fatalf("lease not renewed in a minute: renewed in Vault %v, status %+v", renewed, cur.Status.Credential)
	}

	// Revoked directly in Vault: keyroll notices at the next renewal, cuts the revoked user off
	// on every node (onRevokedOutside CutOff, the default) and issues a new credential.
	if err := fw.Ground.Vault.Root.Sys().Revoke(first.Lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 40*time.Second, func() string {
		cur = fw.Get(t, rc)
		if cur.Status.Credential.Lease.LeaseID == first.Lease.LeaseID {
			return "still on the revoked lease"
		}
		return ""
	})
	framework.Eventually(t, 10*time.Second, func() string {
		user2, pass2, _ := fw.Credentials(rc)
		if user2 == user || !fw.Authenticates(user2, pass2) {
			return "the credentials Secret does not hold the new working credential"
		}
		return fw.OnEveryPod(rc, user2, pass2, true)
	})
	framework.Eventually(t, 10*time.Second, func() string { return fw.OnEveryPod(rc, user, pass, false) })
	for _, l := range cur.Status.Leases {
		if l.LeaseID == first.Lease.LeaseID {
			t.Errorf("the revoked lease is still in the ledger: %+v", l)
		}
	}
}

func TestDeleteRevokesTheLeaseThenLetsGo(t *testing.T) {
	ns := fw.Namespace(t, "delete")
	vc := fw.VaultConnection(t, "vault-delete", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"))
	cur := fw.WaitReady(t, rc, 60*time.Second)
	user, pass, _ := fw.Credentials(rc)
	lease := cur.Status.Credential.Lease.LeaseID
	if !fw.Authenticates(user, pass) {
		t.Fatal("credential does not work before delete")
	}
	fw.DeleteAndWait(t, rc, 30*time.Second)
	if fw.Authenticates(user, pass) {
		t.Error("the credential still works after delete")
	}
	if exists, _ := fw.LeaseExists(lease); exists {
		t.Error("Vault still knows the lease after delete")
	}
}

func TestDeleteWhileVaultIsUnreachableKeepsTheFinalizerUntilRevoked(t *testing.T) {
	proxy, err := testground.StartProxy(fw.Ground.Vault.Addr[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	ns := fw.Namespace(t, "unreachable")
	vc := fw.VaultConnection(t, "vault-proxied", framework.Address(proxy.URL()), framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"))
	cur := fw.WaitReady(t, rc, 60*time.Second)
	user, pass, _ := fw.Credentials(rc)
	lease := cur.Status.Credential.Lease.LeaseID

	proxy.Cut()
	if err := fw.Client.Delete(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	cur = fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionTrue, v1beta1.ReasonRevocationPending, 90*time.Second)
	t.Logf("while Vault is cut off: %s", conditionText(cur, v1beta1.ConditionDegraded))
	time.Sleep(3 * time.Second)
	cur = fw.Get(t, rc)
	if len(cur.Finalizers) == 0 || len(cur.Status.Leases) != 1 || !fw.Authenticates(user, pass) {
		t.Fatalf("with Vault unreachable the object must stay with its finalizer and lease: finalizers %v, leases %+v", cur.Finalizers, cur.Status.Leases)
	}
	if !fw.HasEvent(t, ns, "orders", v1beta1.EventRevocationFailed) {
		t.Error("no RevocationFailed event")
	}

	proxy.Restore()
	framework.Eventually(t, 90*time.Second, func() string {
		err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), &v1beta1.RedisCluster{})
		if !apierrors.IsNotFound(err) {
			return "the RedisCluster is still there after Vault came back"
		}
		return ""
	})
	if fw.Authenticates(user, pass) {
		t.Error("the credential still works after the delete completed")
	}
	if exists, _ := fw.LeaseExists(lease); exists {
		t.Error("Vault still knows the lease")
	}
}

func conditionText(rc *v1beta1.RedisCluster, condType string) string {
	for _, c := range rc.Status.Conditions {
		if c.Type == condType {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

func TestRefusedClustersGetAConditionAnEventAndNoSecret(t *testing.T) {
	ns := fw.Namespace(t, "refused")
	elsewhere := fw.VaultConnection(t, "vault-elsewhere", framework.Allow(fw.Name("elsewhere")))
	// kv/creds/orders passes keyroll's guard (allowedPaths), and Vault's policy refuses it.
	refused := fw.VaultConnection(t, "vault-refused", framework.Allow(ns), framework.Paths(fw.Path("")+"*", "kv/creds/*"))
	for _, vc := range []*v1beta1.VaultConnection{elsewhere, refused} {
		fw.WaitConnectionReady(t, vc.Name, 30*time.Second)
	}
	cases := map[string]struct {
		connection, path, reason string
	}{
		"not-allowed": {elsewhere.Name, fw.Path("orders"), v1beta1.ReasonNamespaceNotAllowed},
		"no-conn":     {fw.Name("missing"), fw.Path("orders"), v1beta1.ReasonConnectionNotFound},
		"forbidden":   {refused.Name, "kv/creds/orders", v1beta1.ReasonPermissionDenied},
	}
	for name, tc := range cases {
		calls := vaultCalls.of(tc.connection)
		rc := fw.RedisCluster(t, ns, name, tc.connection, tc.path) // t: no-conn lives on past its subtest
		t.Run(name, func(t *testing.T) {
			cur := fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, tc.reason, 30*time.Second)
			if !fw.HasEvent(t, ns, name, "") {
				t.Error("no event")
			}
			if _, _, ok := fw.Credentials(rc); ok || len(cur.Status.Leases) != 0 {
				t.Errorf("a refused RedisCluster got a credentials Secret or a lease: %+v", cur.Status.Leases)
			}
			if tc.reason == v1beta1.ReasonNamespaceNotAllowed && vaultCalls.of(tc.connection) != calls {
				t.Errorf("a namespace the VaultConnection does not allow caused %d Vault calls", vaultCalls.of(tc.connection)-calls)
			}
		})
	}

	// Creating the missing VaultConnection wakes the RedisCluster that names it, long before its
	// one-minute retry.
	fw.VaultConnection(t, "missing", framework.Allow(ns))
	start := time.Now()
	fw.WaitCondition(t, &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-conn"}},
		v1beta1.ConditionCredentialsReady, metav1.ConditionTrue, "", 20*time.Second)
	t.Logf("credential issued %s after the VaultConnection appeared", time.Since(start).Round(time.Millisecond))
}

func TestForeignSecretIsLeftUntouched(t *testing.T) {
	ns := fw.Namespace(t, "foreign")
	vc := fw.VaultConnection(t, "vault-foreign", framework.Allow(ns))
	foreign := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken-credentials"},
		Data:       map[string][]byte{"username": []byte("someone"), "password": []byte("else")},
	}
	if err := fw.Client.Create(context.Background(), foreign); err != nil {
		t.Fatal(err)
	}
	rc := fw.RedisCluster(t, ns, "taken", vc.Name, fw.Path("orders"))
	cur := fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonSecretConflict, 30*time.Second)
	after := &corev1.Secret{}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(foreign), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != foreign.ResourceVersion || string(after.Data["username"]) != "someone" {
		t.Fatal("the foreign Secret was changed")
	}
	if len(cur.Status.Leases) != 0 {
		t.Fatalf("a credential was issued although it could not be written: %+v", cur.Status.Leases)
	}
	if !fw.HasEvent(t, ns, "taken", v1beta1.EventSecretConflict) {
		t.Error("no SecretConflict event")
	}
}

// withoutWatch lets the interceptor wrap the manager's client, which reconcilers never watch with.
type withoutWatch struct{ client.Client }

func (withoutWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errors.New("not used")
}

// The issued credential's user has the rules of spec.credentials.aclRules on every Redis node of
// the cluster (the primary and a replica, both loaded from the aclfile and given the user live):
// keys and commands outside the rules are refused. The aclfile holds its password only as a hash.
func TestACLRulesOfTheSpecHoldOnEveryRedisPod(t *testing.T) {
	ns := fw.Namespace(t, "acl")
	vc := fw.VaultConnection(t, "vault-acl", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(2), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ACLRules = []string{"~orders:*", "+@read", "+@write", "+@connection"}
	})
	fw.WaitReady(t, rc, 90*time.Second)
	user, pass, _ := fw.Credentials(rc)
	acl := &corev1.Secret{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "orders-acl"}, acl); err != nil {
		t.Fatal(err)
	}
	file := string(acl.Data["users.acl"])
	if strings.Contains(file, pass) {
		t.Fatal("the ACL Secret holds the password in clear")
	}
	if !strings.Contains(file, "user "+user+" on #") || !strings.Contains(file, "~orders:* +@read +@write +@connection -acl -replicaof") {
		t.Errorf("the aclfile does not give %s the spec's rules:\n%s", user, file)
	}
	if msg := fw.OnEveryPod(rc, user, pass, true); msg != "" {
		t.Fatal(msg)
	}
	pods := fw.RedisPods(t, rc)
	primary, replica := framework.PodAddr(&pods[0]), framework.PodAddr(&pods[1])
	if _, err := testground.RedisDo(primary, user, pass, "SET", "orders:1", "x"); err != nil {
		t.Errorf("on the primary, a key the rules allow is refused: %v", err)
	}
	framework.Eventually(t, 10*time.Second, func() string {
		if v, err := testground.RedisDo(replica, user, pass, "GET", "orders:1"); err != nil || v != "x" {
			return fmt.Sprintf("on the replica, GET orders:1 gives %q, %v; want the primary's value", v, err)
		}
		return ""
	})
	for _, pod := range pods {
		addr := framework.PodAddr(&pod)
		for _, cmd := range [][]string{{"GET", "payments:1"}, {"SET", "payments:1", "x"}, {"CONFIG", "GET", "maxmemory"}} {
			if _, err := testground.RedisDo(addr, user, pass, cmd...); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("on %s, %v (outside the rules) is not refused: %v", pod.Name, cmd, err)
			}
		}
	}
}

// A schedule the API server's pattern lets through but cron cannot parse is reported (Degraded,
// InvalidSchedule, with an event) while the credential is still issued; fixing it withdraws the report.
func TestInvalidScheduleIsReportedAndWithdrawnWhenFixed(t *testing.T) {
	ns := fw.Namespace(t, "schedule")
	vc := fw.VaultConnection(t, "vault-schedule", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rotation.Schedule = "61 * * * *"
	})
	cur := fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionTrue, v1beta1.ReasonInvalidSchedule, 30*time.Second)
	fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionTrue, "", 30*time.Second)
	if !fw.HasEvent(t, ns, "orders", v1beta1.ReasonInvalidSchedule) {
		t.Error("no InvalidSchedule event")
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Rotation.Schedule = "@daily"
	if err := fw.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
	fw.WaitCondition(t, rc, v1beta1.ConditionDegraded, metav1.ConditionFalse, "", 30*time.Second)
	if cur = fw.Get(t, rc); cur.Status.Credential.NextRotation == nil {
		t.Error("no next rotation once the schedule is valid")
	}
}

// A lease whose renewals Vault caps at the role's max TTL is replaced before it lapses: keyroll
// rotates to a new credential and rolls it out, and at no moment does the credentials Secret hold
// a credential that does not work.
func TestCappedRenewalIsReplacedBeforeTheCredentialLapses(t *testing.T) {
	ns := fw.Namespace(t, "capped")
	vc := fw.VaultConnection(t, "vault-capped", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("capped"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.VaultLease.MinTTL = &metav1.Duration{Duration: 5 * time.Second}
	})
	cur := fw.WaitReady(t, rc, 60*time.Second)
	first := cur.Status.Credential
	maxExpiry := first.IssuedAt.Add(35 * time.Second)
	var replaced *v1beta1.CredentialStatus
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		user, pass, ok := fw.Credentials(rc)
		if !ok || !fw.Authenticates(user, pass) {
			t.Fatalf("the credentials Secret held a credential that does not work, %s after the first issue", time.Since(first.IssuedAt.Time).Round(time.Second))
		}
		if msg := fw.OnEveryPod(rc, user, pass, true); msg != "" {
			t.Fatalf("%s after the first issue, the credentials Secret held a credential the Redis pods refuse: %s", time.Since(first.IssuedAt.Time).Round(time.Second), msg)
		}
		if c := fw.Get(t, rc).Status.Credential; c.Lease.LeaseID != first.Lease.LeaseID {
			replaced = c
			break
		}
	}
	if replaced == nil {
		t.Fatalf("the lease was not replaced before its max TTL (%s)", maxExpiry.Format(time.RFC3339))
	}
	if !replaced.IssuedAt.Time.Before(maxExpiry) {
		t.Errorf("replaced at %s, after the first lease's max TTL %s", replaced.IssuedAt, maxExpiry)
	}
	t.Logf("replaced %s after the first issue; the first lease could live %s", replaced.IssuedAt.Sub(first.IssuedAt.Time), 35*time.Second)
	framework.Eventually(t, 30*time.Second, func() string {
		if exists, _ := fw.LeaseExists(first.Lease.LeaseID); exists {
			return "the capped lease is still live in Vault after the replacement rolled out"
		}
		return ""
	})
	var msgs []string
	list := &eventsv1.EventList{}
	if err := fw.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		msgs = append(msgs, e.Note)
	}
	if !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, "(RenewalCapped)") }) {
		t.Errorf("no event says the credential was issued because a renewal was capped: %v", msgs)
	}
}
