package tokens

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/test/framework"
)

// The serial tests (operator restarts, a paused kubelet-free rollout) run first; the parallel ones
// share the operator afterwards.

// TestLeasesOutliveTheirTokens: with periodic tokens of 15 s and leases of 10 minutes, for three
// minutes every lease in every ledger exists in Vault, its credential authenticates, and nothing is
// issued again.
func TestLeasesOutliveTheirTokens(t *testing.T) {
	t.Parallel()
	ns := fw.Namespace(t, "periodic")
	conn := fw.VaultConnection(t, "vault-periodic", framework.AuthRole(rolePeriodic), framework.Allow(ns)).Name
	a := fw.RedisCluster(t, ns, "orders", conn, leasePath)
	b := fw.RedisCluster(t, ns, "carts", conn, leasePath)
	for _, rc := range []*v1beta1.RedisCluster{a, b} {
		fw.WaitReady(t, rc, readyTimeout)
	}

	w := watchLedgers(t, conn, a, b)
	w.run(3 * time.Minute)

	w.check()
	for _, rc := range []*v1beta1.RedisCluster{a, b} {
		if vs := w.versions[rc.Name]; len(vs) != 1 {
			t.Errorf("%s: credential versions %q over three minutes, want the one issued first", rc.Name, vs)
		}
		if n := len(fw.Get(t, rc).Status.Leases); n != 1 {
			t.Errorf("%s: %d leases in the ledger, want 1", rc.Name, n)
		}
		if slices.Contains(framework.Reasons(fw.Events(t, ns, "", rc.Name)), v1beta1.EventLeaseRevokedOutside) {
			t.Errorf("%s: a lease was found gone", rc.Name)
		}
	}
	vc := fw.GetConnection(t, conn)
	if c := meta.FindStatusCondition(vc.Status.Conditions, v1beta1.ConditionDegraded); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("VaultConnection Degraded = %+v, want False: periodic tokens outlive their leases", c)
	}
	t.Logf("%d samples, %d token periods: every lease alive, every credential working; tokens %+v", w.samples, int(3*time.Minute/tokenPeriod), vc.Status.Tokens)
}

// TestCredentialsRotateBeforeTheirTokenEnds: tokens that end a minute after login cannot keep a
// 10-minute lease alive. keyroll replaces each credential, rolls it out and revokes the old lease
// before the token that created it ends; Vault never revokes a lease first; the credential in the
// Secret works throughout; the VaultConnection says that its role's tokens are too short-lived.
func TestCredentialsRotateBeforeTheirTokenEnds(t *testing.T) {
	t.Parallel()
	ns := fw.Namespace(t, "bounded")
	conn := fw.VaultConnection(t, "vault-bounded", framework.AuthRole(roleBounded), framework.Allow(ns)).Name
	// Three nodes: every new credential must be on each of them before the Secret has it.
	rc := fw.RedisCluster(t, ns, "orders", conn, leasePath, framework.Replicas(3))
	fw.WaitReady(t, rc, readyTimeout)

	w := watchLedgers(t, conn, rc)
	w.run(3 * time.Minute)

	w.check()
	retired := 0
	for id, life := range w.leases {
		if life.leftLedger.IsZero() {
			continue
		}
		retired++
		end, ok := w.tokenEnds[life.accessor]
		switch {
		case !ok:
			t.Errorf("lease %s: the end of its token %s was never reported", id, life.accessor)
		case !life.leftLedger.Before(end):
			t.Errorf("lease %s was revoked by keyroll at %s, not before its token ended at %s", id, life.leftLedger.Format(time.TimeOnly), end.Format(time.TimeOnly))
		default:
			t.Logf("lease %s: revoked by keyroll %s before its token ended", id, end.Sub(life.leftLedger).Round(time.Second))
		}
	}
	if retired < 2 {
		t.Errorf("%d leases were replaced in three minutes of one-minute tokens, want at least 2 (versions %q)", retired, w.versions[rc.Name])
	}
	// About one rotation per token lifetime, not one after another: each new credential comes from a
	// token with most of its life ahead.
	if retired > 8 {
		t.Errorf("%d leases were replaced in three minutes of one-minute tokens: rotations follow each other instead of once per token", retired)
	}
	if !slices.Contains(framework.Reasons(fw.Events(t, ns, "", "orders")), v1beta1.EventTokenEnding) {
		t.Errorf("no %s event", v1beta1.EventTokenEnding)
	}
	// The status says so too: each credential after the first replaced one whose token was ending.
	var reasons []string
	for i, v := range w.versions[rc.Name] {
		want := rotation.ReasonTokenEnding
		if i == 0 {
			want = rotation.ReasonNoCredential
		}
		got := w.reasons[v]
		reasons = append(reasons, v+"="+got)
		if got != string(want) {
			t.Errorf("credential %s (number %d): status.credential.rotationReason %q, want %s", v, i+1, got, want)
		}
	}
	t.Logf("credential versions and their status.credential.rotationReason: %s", strings.Join(reasons, ", "))
	vc := fw.GetConnection(t, conn)
	c := meta.FindStatusCondition(vc.Status.Conditions, v1beta1.ConditionDegraded)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1beta1.ReasonTokenMaxTTLTooShort || !strings.Contains(c.Message, "token_period") {
		t.Errorf("VaultConnection Degraded = %+v, want True/%s naming token_period", c, v1beta1.ReasonTokenMaxTTLTooShort)
	} else {
		t.Logf("VaultConnection says: %s", c.Message)
	}
}

// TestLeasesSurviveOperatorRestartAndLeaderChange: the operator is stopped, just after its token
// was renewed, for less than the token's remaining life, and separately leadership moves to a
// second manager; afterwards, for three more token
// periods, no lease is revoked by Vault and none is issued again.
func TestLeasesSurviveOperatorRestartAndLeaderChange(t *testing.T) {
	ns := fw.Namespace(t, "restart")
	conn := fw.VaultConnection(t, "vault-restart", framework.AuthRole(rolePeriodic), framework.Allow(ns)).Name
	rc := fw.RedisCluster(t, ns, "orders", conn, leasePath)
	fw.WaitReady(t, rc, readyTimeout)
	w := watchLedgers(t, conn, rc)
	w.run(2 * tokenPeriod) // steady, its token renewed

	justRenewed(t, conn)
	fw.StopOperator()
	down := time.Now()
	w.run(tokenPeriod / 4)
	if err := fw.StartOperator(framework.OperatorOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("operator down for %s", time.Since(down).Round(100*time.Millisecond))
	w.run(3*tokenPeriod + 5*time.Second)

	justRenewed(t, conn)
	fw.StopOperator()
	first, err := fw.NewOperator(context.Background(), framework.Election)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Elected():
	case <-time.After(30 * time.Second):
		t.Fatal("the first manager did not lead")
	}
	second, err := fw.NewOperator(context.Background(), framework.Election)
	if err != nil {
		t.Fatal(err)
	}
	w.run(tokenPeriod)
	justRenewed(t, conn)
	handover := time.Now()
	_ = first.Stop() // releases leadership
	select {
	case <-second.Elected():
	case <-time.After(30 * time.Second):
		t.Fatal("the second manager did not take over")
	}
	t.Logf("leadership moved in %s", time.Since(handover).Round(100*time.Millisecond))
	w.run(3*tokenPeriod + 5*time.Second)
	_ = second.Stop()
	if err := fw.StartOperator(framework.OperatorOptions{}); err != nil {
		t.Fatal(err)
	}

	w.check()
	if vs := w.versions["orders"]; len(vs) != 1 {
		t.Errorf("credential versions %q, want the one issued first: nothing may be issued again", vs)
	}
	if n := len(fw.Get(t, rc).Status.Leases); n != 1 {
		t.Errorf("%d leases in the ledger, want 1", n)
	}
	if n := strings.Count(fw.Logs.String(), "Took over persisted Vault tokens"); n < 2 {
		t.Errorf("%d take-overs of persisted tokens logged, want one per new manager (at least 2)", n)
	}
}

// justRenewed waits until the connection's current token was renewed a moment ago (Vault gives it
// more than 12 s of its 15-second period): a manager stopped then has that long to come back before
// the token, and its leases with it, end. The test promises survival of a stop shorter than the
// token's remaining life; stopping just before a renewal would leave it a third of the period.
func justRenewed(t *testing.T, connection string) {
	t.Helper()
	ctx := context.Background()
	framework.Eventually(t, 2*tokenPeriod, func() string {
		vc := fw.GetConnection(t, connection)
		for _, tok := range vc.Status.Tokens {
			if !tok.Current {
				continue
			}
			sec, err := fw.Ground.Vault.Root.Auth().Token().LookupAccessorWithContext(ctx, tok.Accessor)
			if err != nil {
				return "looking up the current token: " + err.Error()
			}
			ttl, err := sec.TokenTTL()
			if err != nil {
				return err.Error()
			}
			if ttl > tokenPeriod*4/5 {
				return ""
			}
			return fmt.Sprintf("the current token has %s left", ttl)
		}
		return "no current token in the VaultConnection's status"
	})
}

// TestLeasesSurviveVaultConnectionEdit: every edit of a VaultConnection that changes its client
// builds a new Vault client; the new client takes the tokens over and no lease is lost. With
// Kubernetes auth the rate limit changes, then the CA (inline, then a reference to a Secret);
// with AppRole the secret-id reference moves to a Secret holding a second valid secret id, and
// the first one is destroyed.
func TestLeasesSurviveVaultConnectionEdit(t *testing.T) {
	t.Parallel()
	t.Run("KubernetesAuth", func(t *testing.T) {
		t.Parallel()
		editKubernetesConnection(t)
	})
	t.Run("AppRole", func(t *testing.T) {
		t.Parallel()
		editAppRoleConnection(t)
	})
}

func editKubernetesConnection(t *testing.T) {
	ns := fw.Namespace(t, "edit")
	conn := fw.VaultConnection(t, "vault-edit", framework.AuthRole(rolePeriodic), framework.Allow(ns)).Name
	rc := fw.RedisCluster(t, ns, "orders", conn, leasePath)
	fw.WaitReady(t, rc, readyTimeout)
	// The test ground's Vault speaks plain http: a CA is never used to verify it, but a new one
	// is part of the client's settings, so each CA edit builds a new client.
	secretWith(t, fw.OperatorNS, "vault-ca", "ca.crt", selfSignedCA(t))
	w := watchLedgers(t, conn, rc)
	before := takeOvers(conn)

	w.run(tokenPeriod)
	editConnection(t, conn, func(vc *v1beta1.VaultConnection) {
		vc.Spec.RateLimit = &v1beta1.VaultRateLimit{QPS: 7, Burst: 9}
	})
	w.run(2 * tokenPeriod)
	editConnection(t, conn, func(vc *v1beta1.VaultConnection) {
		vc.Spec.TLS = &v1beta1.VaultTLS{CABundle: selfSignedCA(t)}
	})
	w.run(2 * tokenPeriod)
	editConnection(t, conn, func(vc *v1beta1.VaultConnection) {
		vc.Spec.TLS = &v1beta1.VaultTLS{CASecretRef: &v1beta1.SecretKeyReference{Namespace: fw.OperatorNS, Name: "vault-ca", Key: "ca.crt"}}
	})
	w.run(3 * tokenPeriod)

	w.check()
	if vs := w.versions["orders"]; len(vs) != 1 {
		t.Errorf("credential versions %q, want the one issued first", vs)
	}
	if n := takeOvers(conn) - before; n < 3 {
		t.Errorf("%d new clients took the tokens over after three edits, want 3", n)
	}
	connectionStayedReady(t, conn)
	t.Logf("%d samples over three edits: every lease alive, the credential working; %d take-overs of the tokens", w.samples, takeOvers(conn)-before)
}

func editAppRoleConnection(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "edit-approle")
	// As a Vault administrator: the AppRole's role id and two secret ids.
	root := fw.Ground.Vault.Root.Logical()
	id, err := root.ReadWithContext(ctx, "auth/approle/role/"+roleAppRole+"/role-id")
	if err != nil || id == nil {
		t.Fatalf("reading the role id of %s: %v", roleAppRole, err)
	}
	roleID, _ := id.Data["role_id"].(string)
	secretIDs := map[string]string{}
	for _, name := range []string{"approle-first", "approle-second"} {
		out, err := root.WriteWithContext(ctx, "auth/approle/role/"+roleAppRole+"/secret-id", nil)
		if err != nil || out == nil {
			t.Fatalf("making a secret id of %s: %v", roleAppRole, err)
		}
		secretIDs[name], _ = out.Data["secret_id"].(string)
		if roleID == "" || secretIDs[name] == "" {
			t.Fatalf("role id %q or secret id %s empty", roleID, name)
		}
		secretWith(t, fw.OperatorNS, name, "secret-id", secretIDs[name])
	}
	conn := fw.VaultConnection(t, "vault-edit-approle", framework.Allow(ns), func(vc *v1beta1.VaultConnection) {
		vc.Spec.Auth = v1beta1.VaultAuth{AppRole: &v1beta1.AppRoleAuth{RoleID: roleID,
			SecretIDRef: v1beta1.SecretKeyReference{Namespace: fw.OperatorNS, Name: "approle-first", Key: "secret-id"}}}
	}).Name
	rc := fw.RedisCluster(t, ns, "orders", conn, leasePath)
	fw.WaitReady(t, rc, readyTimeout)
	w := watchLedgers(t, conn, rc)
	before := takeOvers(conn)

	w.run(tokenPeriod)
	editConnection(t, conn, func(vc *v1beta1.VaultConnection) { vc.Spec.Auth.AppRole.SecretIDRef.Name = "approle-second" })
	w.run(tokenPeriod)
	// The rotation of secret ids ends as an administrator ends it: the first one is destroyed.
	// Tokens it logged in are not revoked with it, and keyroll goes on renewing them.
	if _, err := root.WriteWithContext(ctx, "auth/approle/role/"+roleAppRole+"/secret-id/destroy",
		map[string]any{"secret_id": secretIDs["approle-first"]}); err != nil {
		t.Fatal(err)
	}
	w.run(3 * tokenPeriod)

	w.check()
	if vs := w.versions["orders"]; len(vs) != 1 {
		t.Errorf("credential versions %q, want the one issued first", vs)
	}
	if n := takeOvers(conn) - before; n < 1 {
		t.Errorf("no new client took the tokens over after the secret-id reference changed")
	}
	connectionStayedReady(t, conn)
	t.Logf("%d samples across the switch of secret ids: every lease alive, the credential working; tokens %+v", w.samples, fw.GetConnection(t, conn).Status.Tokens)
}

// takeOvers counts the operator's log lines saying that a new client of the connection took its
// persisted tokens over.
func takeOvers(conn string) int {
	return framework.CountLines(fw.Logs.String(), "Took over persisted Vault tokens", `"`+conn+`"`)
}

// connectionStayedReady checks that the VaultConnection is Ready and never failed to log in.
func connectionStayedReady(t *testing.T, conn string) {
	t.Helper()
	c := meta.FindStatusCondition(fw.GetConnection(t, conn).Status.Conditions, v1beta1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("VaultConnection %s Ready = %+v, want True", conn, c)
	}
	// A cluster-scoped object's events land in the default namespace.
	if reasons := framework.Reasons(fw.Events(t, metav1.NamespaceDefault, "", conn)); slices.Contains(reasons, v1beta1.ReasonLoginFailed) {
		t.Errorf("VaultConnection %s events %q: a login failed", conn, reasons)
	}
}

// secretWith creates a Secret in ns holding value under key.
// secretWith creates a Secret, deleted when the test ends. A VaultConnection may name Secrets of
// the operator's namespace only.
func secretWith(t *testing.T, ns, name, key, value string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{key: []byte(value)}}
	if err := fw.Client.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Client.Delete(context.Background(), s) })
}

// TestVaultConnectionInUseIsNotDeleted: a VaultConnection deleted while two RedisClusters use it
// stays, says which clusters it waits for, and keeps their credentials alive; once one cluster is
// gone it waits for the other, naming it alone; once both are gone (their leases revoked through
// the connection), the connection goes, and its token Secret with it.
func TestVaultConnectionInUseIsNotDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := fw.Namespace(t, "inuse")
	vc := fw.VaultConnection(t, "vault-inuse", framework.AuthRole(rolePeriodic), framework.Allow(ns))
	orders := fw.RedisCluster(t, ns, "orders", vc.Name, leasePath)
	carts := fw.RedisCluster(t, ns, "carts", vc.Name, leasePath)
	leases := map[string]string{}
	for _, rc := range []*v1beta1.RedisCluster{orders, carts} {
		leases[rc.Name] = fw.WaitReady(t, rc, readyTimeout).Status.Credential.Lease.LeaseID
	}

	if err := fw.Client.Delete(ctx, vc); err != nil {
		t.Fatal(err)
	}
	waitBlocked(t, vc.Name, []string{ns + "/carts", ns + "/orders"}, nil)
	w := watchLedgers(t, vc.Name, orders, carts)
	w.run(2 * tokenPeriod)
	w.check()

	fw.DeleteAndWait(t, orders, 60*time.Second)
	if exists, _ := fw.LeaseExists(leases["orders"]); exists {
		t.Errorf("lease %s of the deleted cluster orders was not revoked", leases["orders"])
	}
	waitBlocked(t, vc.Name, []string{ns + "/carts"}, []string{ns + "/orders"})
	w = watchLedgers(t, vc.Name, carts)
	w.run(2 * tokenPeriod)
	w.check()
	if err := fw.Client.Get(ctx, client.ObjectKey{Name: vc.Name}, &v1beta1.VaultConnection{}); err != nil {
		t.Fatalf("the VaultConnection went while carts still uses it: %v", err)
	}

	fw.DeleteAndWait(t, carts, 60*time.Second)
	framework.Eventually(t, 60*time.Second, func() string {
		if err := fw.Client.Get(ctx, client.ObjectKey{Name: vc.Name}, &v1beta1.VaultConnection{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("VaultConnection still there (%v)", err)
		}
		return ""
	})
	for name, lease := range leases {
		if exists, _ := fw.LeaseExists(lease); exists {
			t.Errorf("lease %s of %s was not revoked", lease, name)
		}
	}
	framework.Eventually(t, 60*time.Second, func() string {
		err := fw.Client.Get(ctx, client.ObjectKey{Namespace: fw.OperatorNS, Name: connection.TokenSecretName(vc.Name, "")}, &corev1.Secret{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("token Secret still there (%v)", err)
		}
		return ""
	})
}

// waitBlocked waits until the VaultConnection being deleted says, in DeletionBlocked, that it
// waits for the clusters of want and for none of gone.
func waitBlocked(t *testing.T, name string, want, gone []string) {
	t.Helper()
	framework.Eventually(t, 30*time.Second, func() string {
		c := meta.FindStatusCondition(fw.GetConnection(t, name).Status.Conditions, v1beta1.ConditionDeletionBlocked)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1beta1.ReasonInUse {
			return fmt.Sprintf("DeletionBlocked = %+v, want True/InUse", c)
		}
		for _, rc := range want {
			if !strings.Contains(c.Message, rc) {
				return fmt.Sprintf("DeletionBlocked says %q, want it to name %s", c.Message, rc)
			}
		}
		for _, rc := range gone {
			if strings.Contains(c.Message, rc) {
				return fmt.Sprintf("DeletionBlocked says %q, still naming %s, which is gone", c.Message, rc)
			}
		}
		t.Logf("DeletionBlocked: %s", c.Message)
		return ""
	})
}

// TestLeaseRevokedOutsideIsCutOffAndReplaced: the live lease is revoked in Vault as root. Within a
// minute keyroll notices, issues a new credential, puts its user on every Redis node and rolls it
// out, records a Warning event and counts it. The rollout is held back by a paused consumer: with
// CutOff the revoked user already fails AUTH on every Redis pod (keyroll deleted it live, ahead of
// the rollout); with RollOver it still logs in on every pod until the new credential has rolled
// out, and not after.
func TestLeaseRevokedOutsideIsCutOffAndReplaced(t *testing.T) {
	// keyroll_leases_revoked_outside_total is one counter for the whole process, without labels:
	// it is read before and after both policies' runs, which go on in parallel. This test is not
	// parallel itself, so no other test revokes a lease meanwhile.
	counted := testutil.ToFloat64(operatorMetrics().RevokedOutside)
	policies := []v1beta1.RevokedOutsidePolicy{v1beta1.RevokedOutsideCutOff, v1beta1.RevokedOutsideRollOver}
	t.Run("policies", func(t *testing.T) {
		for _, policy := range policies {
			t.Run(string(policy), func(t *testing.T) {
				t.Parallel()
				revokedOutside(t, policy)
			})
		}
	})
	got := testutil.ToFloat64(operatorMetrics().RevokedOutside)
	if want := counted + float64(len(policies)); got < want {
		t.Errorf("keyroll_leases_revoked_outside_total = %v after %d revocations outside keyroll, want at least %v (it was %v before)", got, len(policies), want, counted)
	}
	t.Logf("keyroll_leases_revoked_outside_total went from %v to %v over %d revocations", counted, got, len(policies))
}

func revokedOutside(t *testing.T, policy v1beta1.RevokedOutsidePolicy) {
	ctx := context.Background()
	base := "revoked-" + strings.ToLower(string(policy))
	ns := fw.Namespace(t, base)
	conn := fw.VaultConnection(t, "vault-"+base, framework.Allow(ns)).Name
	consumer := fw.StandInConsumer(t, ns, "api", 1)
	rc := fw.RedisCluster(t, ns, "orders", conn, leasePath,
		framework.Replicas(2), // "every node" is more than one
		framework.WithConsumers("api"),
		func(rc *v1beta1.RedisCluster) { rc.Spec.Credentials.OnRevokedOutside = policy })
	cur := fw.WaitReady(t, rc, readyTimeout)
	oldUser, oldPass, _ := fw.Credentials(rc)
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
		t.Fatalf("before the revocation, the live credential does not work on every Redis pod: %s", msg)
	}
	fw.PauseDeployment(t, consumer, true) // hold the new credential's rollout at the consumer

	if err := fw.Ground.Vault.Root.Sys().RevokeWithContext(ctx, cur.Status.Credential.Lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	var newUser, newPass string
	framework.Eventually(t, 75*time.Second, func() string {
		u, p, ok := fw.Credentials(rc)
		if !ok || u == oldUser || !fw.Authenticates(u, p) {
			return fmt.Sprintf("credentials Secret still holds %q", u)
		}
		newUser, newPass = u, p
		return ""
	})
	noticed := time.Since(revoked)
	t.Logf("%s: a new credential replaced the revoked one %s after the revocation", policy, noticed.Round(100*time.Millisecond))
	if noticed > 65*time.Second {
		t.Errorf("the revocation was acted on after %s, want within about a minute", noticed)
	}
	// The event follows the status write through the asynchronous recorder.
	framework.Eventually(t, 15*time.Second, func() string {
		var types []string
		for _, e := range fw.Events(t, ns, "", "orders") {
			if e.Reason == v1beta1.EventLeaseRevokedOutside {
				types = append(types, e.Type)
			}
		}
		if len(types) == 0 || slices.ContainsFunc(types, func(typ string) bool { return typ != corev1.EventTypeWarning }) {
			return fmt.Sprintf("%s events of types %q, want Warning ones", v1beta1.EventLeaseRevokedOutside, types)
		}
		return ""
	})
	// The consumers' Secret is written only once every node accepts the new credential.
	if msg := fw.OnEveryPod(rc, newUser, newPass, true); msg != "" {
		t.Errorf("the new credential is in the credentials Secret but does not work on every Redis pod: %s", msg)
	}
	held := func() string {
		if r := fw.Get(t, rc).Status.Rollout; r == nil {
			return "no rollout in progress: it finished although the consumer is paused"
		}
		return ""
	}
	framework.Eventually(t, 15*time.Second, held)

	switch policy {
	case v1beta1.RevokedOutsideCutOff:
		if msg := fw.OnEveryPod(rc, oldUser, oldPass, false); msg != "" {
			t.Errorf("CutOff: the revoked user is not cut off on every Redis pod while the rollout is held: %s", msg)
		}
	case v1beta1.RevokedOutsideRollOver:
		if msg := fw.OnEveryPod(rc, oldUser, oldPass, true); msg != "" {
			t.Errorf("RollOver: the revoked user was cut off before the new credential rolled out: %s", msg)
		}
	}
	if msg := held(); msg != "" {
		t.Fatalf("%s: the Redis pods were checked while it was held, but %s", policy, msg)
	}
	fw.PauseDeployment(t, consumer, false)
	framework.Eventually(t, 60*time.Second, func() string {
		if cur := fw.Get(t, rc); cur.Status.Rollout != nil || len(cur.Status.Credential.SupersededUsers) > 0 || len(cur.Status.RetiringUsers) > 0 {
			return fmt.Sprintf("rollout %+v, superseded users %q, retiring users %q", cur.Status.Rollout, cur.Status.Credential.SupersededUsers, cur.Status.RetiringUsers)
		}
		return ""
	})
	if msg := fw.OnEveryPod(rc, oldUser, oldPass, false); msg != "" {
		t.Errorf("%s: the revoked user still logs in after the rollout: %s", policy, msg)
	}
	if msg := fw.OnEveryPod(rc, newUser, newPass, true); msg != "" {
		t.Errorf("after the rollout, the new credential does not work on every Redis pod: %s", msg)
	}
}

// TestTokenSecretHoldsTokensOnlyInData: the Secret that keeps a connection's tokens has them in
// its data only, carries keyroll's label and belongs to the VaultConnection; no label, annotation
// or status, no event in any namespace (a VaultConnection's land in default) and no log line
// holds one, nor anything shaped like a Vault token, nor a Redis password.
func TestTokenSecretHoldsTokensOnlyInData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := fw.Namespace(t, "secret")
	conn := fw.VaultConnection(t, "vault-secret", framework.AuthRole(rolePeriodic), framework.Allow(ns)).Name
	rc := fw.RedisCluster(t, ns, "orders", conn, leasePath)
	fw.WaitReady(t, rc, readyTimeout)
	sec := &corev1.Secret{}
	if err := fw.Client.Get(ctx, client.ObjectKey{Namespace: fw.OperatorNS, Name: connection.TokenSecretName(conn, "")}, sec); err != nil {
		t.Fatal(err)
	}
	if len(sec.Data) == 0 {
		t.Fatal("the token Secret holds no token")
	}
	vc := fw.GetConnection(t, conn)
	if got := sec.Labels[v1beta1.LabelManagedBy]; got != v1beta1.ManagedByValue {
		t.Errorf("token Secret label %s = %q, want %q (labels %v)", v1beta1.LabelManagedBy, got, v1beta1.ManagedByValue, sec.Labels)
	}
	owner := metav1.OwnerReference{}
	if len(sec.OwnerReferences) == 1 {
		owner = sec.OwnerReferences[0]
	}
	if len(sec.OwnerReferences) != 1 || owner.APIVersion != v1beta1.GroupVersion.String() || owner.Kind != "VaultConnection" ||
		owner.Name != vc.Name || owner.UID != vc.UID || metav1.GetControllerOfNoCopy(sec) != nil {
		t.Errorf("owner references %+v, want the VaultConnection %s (uid %s), not as controller", sec.OwnerReferences, vc.Name, vc.UID)
	}
	labels := strings.Join(append(mapStrings(sec.Labels), mapStrings(sec.Annotations)...), " ")
	events := allEvents(t)
	texts := map[string]string{"labels or annotations": labels, "operator logs": fw.Logs.String(), "events": events,
		"VaultConnection status": fmt.Sprintf("%+v", vc.Status), "RedisCluster status": fmt.Sprintf("%+v", fw.Get(t, rc).Status)}
	for accessor, token := range sec.Data {
		if !strings.HasPrefix(string(token), "hvs.") {
			t.Errorf("data %s does not hold a Vault token", accessor)
		}
		if !slices.ContainsFunc(vc.Status.Tokens, func(s v1beta1.TokenStatus) bool { return s.Accessor == accessor }) {
			t.Errorf("data key %s is not the accessor of a token in the VaultConnection's status %+v", accessor, vc.Status.Tokens)
		}
		for where, text := range texts {
			if strings.Contains(text, string(token)) {
				t.Errorf("a Vault token reached the %s", where)
			}
		}
	}
	// Nor a token keyroll does not know of: nothing there looks like one.
	vaultToken := regexp.MustCompile(`hv[sbr]\.`)
	for where, text := range texts {
		if m := vaultToken.FindString(text); m != "" {
			t.Errorf("the %s hold something shaped like a Vault token (%q…)", where, m)
		}
	}
	t.Logf("%d tokens in the token Secret; %d events in all namespaces, %d bytes of logs, the statuses, labels and annotations hold none", len(sec.Data), strings.Count(events, "\n"), len(fw.Logs.String()))
	// Nor does a Redis password: the credential's, or those of keyroll's own users on the nodes.
	for _, p := range []struct{ secret, key string }{
		{"orders-credentials", "password"}, {"orders-keyroll", "password"}, {"orders-keyroll", "admin-password"},
		{"orders-acl", "replication-password"}, {"orders-acl", "probe-password"},
	} {
		s := &corev1.Secret{}
		if err := fw.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: p.secret}, s); err != nil {
			t.Fatal(err)
		}
		pw := string(s.Data[p.key])
		if len(pw) < 8 {
			t.Errorf("Secret %s holds no password under %s", p.secret, p.key)
			continue
		}
		for where, text := range map[string]string{"operator logs": fw.Logs.String(), "events": events,
			"RedisCluster status": fmt.Sprintf("%+v", fw.Get(t, rc).Status)} {
			if strings.Contains(text, pw) {
				t.Errorf("the password of Secret %s, key %s, reached the %s", p.secret, p.key, where)
			}
		}
	}
}

// allEvents is every event of every namespace, one a line, with all its fields.
func allEvents(t *testing.T) string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := fw.Client.List(context.Background(), list); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range list.Items {
		fmt.Fprintf(&b, "%+v\n", e)
	}
	return b.String()
}

func mapStrings(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// operatorMetrics are the metrics of the operator running in this process.
func operatorMetrics() *metrics.Metrics { return metrics.For(clock.RealClock{}) }

func editConnection(t *testing.T, name string, mutate func(*v1beta1.VaultConnection)) {
	t.Helper()
	vc := fw.GetConnection(t, name)
	patch := client.MergeFrom(vc.DeepCopy())
	mutate(vc)
	if err := fw.Client.Patch(context.Background(), vc, patch); err != nil {
		t.Fatal(err)
	}
}

// selfSignedCA is a PEM certificate of a throwaway CA.
func selfSignedCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "keyroll test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
