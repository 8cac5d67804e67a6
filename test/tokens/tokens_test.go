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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

// The serial tests (operator restarts, a paused kubelet-free rollout) run first; the parallel ones
// share the operator afterwards.

// TestLeasesOutliveTheirTokens: with periodic tokens of 15 s and leases of 10 minutes, for three
// minutes every lease in every ledger exists in Vault, its credential authenticates, and nothing is
// issued again.
func TestLeasesOutliveTheirTokens(t *testing.T) {
	t.Parallel()
	namespace(t, "periodic")
	vaultConnection(t, "vault-periodic", rolePeriodic, "periodic")
	a := redisCluster(t, "periodic", "orders", "vault-periodic")
	b := redisCluster(t, "periodic", "carts", "vault-periodic")
	for _, rc := range []*v1alpha1.RedisCluster{a, b} {
		waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", readyTimeout)
	}

	w := watchLedgers(t, "vault-periodic", a, b)
	w.run(3 * time.Minute)

	w.check()
	for _, rc := range []*v1alpha1.RedisCluster{a, b} {
		if vs := w.versions[rc.Name]; len(vs) != 1 {
			t.Errorf("%s: credential versions %q over three minutes, want the one issued first", rc.Name, vs)
		}
		if n := len(get(t, rc).Status.Leases); n != 1 {
			t.Errorf("%s: %d leases in the ledger, want 1", rc.Name, n)
		}
		if slices.Contains(eventReasons(t, "periodic", rc.Name), v1alpha1.EventLeaseRevokedOutside) {
			t.Errorf("%s: a lease was found gone", rc.Name)
		}
	}
	vc := getConnection(t, "vault-periodic")
	if c := meta.FindStatusCondition(vc.Status.Conditions, v1alpha1.ConditionDegraded); c == nil || c.Status != metav1.ConditionFalse {
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
	namespace(t, "bounded")
	vaultConnection(t, "vault-bounded", roleBounded, "bounded")
	// Three nodes: every new credential must be on each of them before the Secret has it.
	rc := redisCluster(t, "bounded", "orders", "vault-bounded", func(rc *v1alpha1.RedisCluster) { rc.Spec.Replicas = 3 })
	waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", readyTimeout)

	w := watchLedgers(t, "vault-bounded", rc)
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
	if !slices.Contains(eventReasons(t, "bounded", "orders"), v1alpha1.EventTokenEnding) {
		t.Errorf("no %s event", v1alpha1.EventTokenEnding)
	}
	vc := getConnection(t, "vault-bounded")
	c := meta.FindStatusCondition(vc.Status.Conditions, v1alpha1.ConditionDegraded)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonTokenMaxTTLTooShort || !strings.Contains(c.Message, "token_period") {
		t.Errorf("VaultConnection Degraded = %+v, want True/%s naming token_period", c, v1alpha1.ReasonTokenMaxTTLTooShort)
	} else {
		t.Logf("VaultConnection says: %s", c.Message)
	}
}

// TestLeasesSurviveOperatorRestartAndLeaderChange: the operator is stopped for less than a token
// period, and separately leadership moves to a second manager; afterwards, for three more token
// periods, no lease is revoked by Vault and none is issued again.
func TestLeasesSurviveOperatorRestartAndLeaderChange(t *testing.T) {
	namespace(t, "restart")
	vaultConnection(t, "vault-restart", rolePeriodic, "restart")
	rc := redisCluster(t, "restart", "orders", "vault-restart")
	waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", readyTimeout)
	w := watchLedgers(t, "vault-restart", rc)
	w.run(2 * tokenPeriod) // steady, its token renewed

	stopOperator()
	down := time.Now()
	w.run(tokenPeriod / 4)
	if err := startOperator(harness.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("operator down for %s", time.Since(down).Round(100*time.Millisecond))
	w.run(3*tokenPeriod + 5*time.Second)

	stopOperator()
	election := harness.Options{LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}
	first, err := harness.Start(context.Background(), ground, election)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Elected():
	case <-time.After(30 * time.Second):
		t.Fatal("the first manager did not lead")
	}
	second, err := harness.Start(context.Background(), ground, election)
	if err != nil {
		t.Fatal(err)
	}
	w.run(tokenPeriod)
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
	if err := startOperator(harness.Options{}); err != nil {
		t.Fatal(err)
	}

	w.check()
	if vs := w.versions["orders"]; len(vs) != 1 {
		t.Errorf("credential versions %q, want the one issued first: nothing may be issued again", vs)
	}
	if n := len(get(t, rc).Status.Leases); n != 1 {
		t.Errorf("%d leases in the ledger, want 1", n)
	}
	if n := strings.Count(operatorLogs.String(), "Took over persisted Vault tokens"); n < 2 {
		t.Errorf("%d take-overs of persisted tokens logged, want one per new manager (at least 2)", n)
	}
}

// TestLeasesSurviveVaultConnectionEdit: editing the VaultConnection's rate limit and its CA bundle
// builds a new Vault client each time; the new client takes the tokens over and no lease is lost.
func TestLeasesSurviveVaultConnectionEdit(t *testing.T) {
	t.Parallel()
	namespace(t, "edit")
	vaultConnection(t, "vault-edit", rolePeriodic, "edit")
	rc := redisCluster(t, "edit", "orders", "vault-edit")
	waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", readyTimeout)
	w := watchLedgers(t, "vault-edit", rc)
	takeOvers := func() int {
		n := 0
		for _, line := range strings.Split(operatorLogs.String(), "\n") {
			if strings.Contains(line, "Took over persisted Vault tokens") && strings.Contains(line, `"vault-edit"`) {
				n++
			}
		}
		return n
	}
	before := takeOvers()

	w.run(tokenPeriod)
	editConnection(t, "vault-edit", func(vc *v1alpha1.VaultConnection) {
		vc.Spec.RateLimit = &v1alpha1.VaultRateLimit{QPS: 7, Burst: 9}
	})
	w.run(2 * tokenPeriod)
	editConnection(t, "vault-edit", func(vc *v1alpha1.VaultConnection) {
		vc.Spec.TLS = &v1alpha1.VaultTLS{CABundle: selfSignedCA(t)}
	})
	w.run(3 * tokenPeriod)

	w.check()
	if vs := w.versions["orders"]; len(vs) != 1 {
		t.Errorf("credential versions %q, want the one issued first", vs)
	}
	if n := takeOvers() - before; n < 2 {
		t.Errorf("%d new clients took the tokens over after two edits, want 2", n)
	}
}

// TestVaultConnectionInUseIsNotDeleted: a VaultConnection deleted while a RedisCluster uses it stays,
// says which cluster it waits for, and keeps the cluster's credential alive; once the cluster is
// gone (its leases revoked through the connection), the connection goes, and its token Secret with it.
func TestVaultConnectionInUseIsNotDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	namespace(t, "inuse")
	vc := vaultConnection(t, "vault-inuse", rolePeriodic, "inuse")
	rc := redisCluster(t, "inuse", "orders", "vault-inuse")
	cur := waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", readyTimeout)
	lease := cur.Status.Credential.LeaseID

	if err := k8s.Delete(ctx, vc); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() string {
		c := meta.FindStatusCondition(getConnection(t, "vault-inuse").Status.Conditions, v1alpha1.ConditionDeletionBlocked)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonInUse || !strings.Contains(c.Message, "inuse/orders") {
			return fmt.Sprintf("DeletionBlocked = %+v, want True/InUse naming inuse/orders", c)
		}
		return ""
	})
	w := watchLedgers(t, "vault-inuse", rc)
	w.run(2 * tokenPeriod)
	w.check()

	if err := k8s.Delete(ctx, get(t, rc)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() string {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rc), &v1alpha1.RedisCluster{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("RedisCluster still there (%v)", err)
		}
		if err := k8s.Get(ctx, client.ObjectKey{Name: "vault-inuse"}, &v1alpha1.VaultConnection{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("VaultConnection still there (%v)", err)
		}
		return ""
	})
	if exists, _ := ground.Vault.LeaseExpiry(lease); exists {
		t.Errorf("lease %s was not revoked", lease)
	}
	eventually(t, 60*time.Second, func() string {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: harness.OperatorNS, Name: "keyroll-tokens-vault-inuse"}, &corev1.Secret{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("token Secret still there (%v)", err)
		}
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
	for _, policy := range []v1alpha1.RevokedOutsidePolicy{v1alpha1.RevokedOutsideCutOff, v1alpha1.RevokedOutsideRollOver} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			revokedOutside(t, policy)
		})
	}
}

func revokedOutside(t *testing.T, policy v1alpha1.RevokedOutsidePolicy) {
	ctx := context.Background()
	ns := "revoked-" + strings.ToLower(string(policy))
	namespace(t, ns)
	vaultConnection(t, "vault-"+ns, harness.OperatorRole, ns)
	consumer := consumerDeployment(t, ns, "api")
	rc := redisCluster(t, ns, "orders", "vault-"+ns, func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Replicas = 2 // "every node" is more than one
		rc.Spec.Credentials.OnRevokedOutside = policy
		rc.Spec.Rollout.Consumers = []v1alpha1.ConsumerReference{{Kind: "Deployment", Name: "api"}}
	})
	cur := waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", readyTimeout)
	oldUser, oldPass, _ := credentials(t, rc)
	if msg := onEveryNode(t, rc, oldUser, oldPass); msg != "" {
		t.Fatalf("before the revocation, the live credential does not work on every Redis pod: %s", msg)
	}
	setPaused(t, consumer, true) // hold the new credential's rollout at the consumer
	counted := testutil.ToFloat64(operatorMetrics().RevokedOutside)

	if err := ground.Vault.Root.Sys().RevokeWithContext(ctx, cur.Status.Credential.LeaseID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	var newUser, newPass string
	eventually(t, 75*time.Second, func() string {
		u, p, ok := credentials(t, rc)
		if !ok || u == oldUser || !authenticates(u, p) {
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
	if !slices.Contains(eventReasons(t, ns, "orders"), v1alpha1.EventLeaseRevokedOutside) {
		t.Errorf("no %s event", v1alpha1.EventLeaseRevokedOutside)
	}
	if got := testutil.ToFloat64(operatorMetrics().RevokedOutside); got < counted+1 {
		t.Errorf("keyroll_leases_revoked_outside_total = %v, want at least %v", got, counted+1)
	}
	// The consumers' Secret is written only once every node accepts the new credential.
	if msg := onEveryNode(t, rc, newUser, newPass); msg != "" {
		t.Errorf("the new credential is in the credentials Secret but does not work on every Redis pod: %s", msg)
	}
	held := func() string {
		if r := get(t, rc).Status.Rollout; r == nil {
			return "no rollout in progress: it finished although the consumer is paused"
		}
		return ""
	}
	eventually(t, 15*time.Second, held)

	switch policy {
	case v1alpha1.RevokedOutsideCutOff:
		if msg := onNoNode(t, rc, oldUser, oldPass); msg != "" {
			t.Errorf("CutOff: the revoked user is not cut off on every Redis pod while the rollout is held: %s", msg)
		}
	case v1alpha1.RevokedOutsideRollOver:
		if msg := onEveryNode(t, rc, oldUser, oldPass); msg != "" {
			t.Errorf("RollOver: the revoked user was cut off before the new credential rolled out: %s", msg)
		}
	}
	if msg := held(); msg != "" {
		t.Fatalf("%s: the Redis pods were checked while it was held, but %s", policy, msg)
	}
	setPaused(t, consumer, false)
	eventually(t, 60*time.Second, func() string {
		if cur := get(t, rc); cur.Status.Rollout != nil || len(cur.Status.Credential.SupersededUsers) > 0 || len(cur.Status.RetiringUsers) > 0 {
			return fmt.Sprintf("rollout %+v, superseded users %q, retiring users %q", cur.Status.Rollout, cur.Status.Credential.SupersededUsers, cur.Status.RetiringUsers)
		}
		return ""
	})
	if msg := onNoNode(t, rc, oldUser, oldPass); msg != "" {
		t.Errorf("%s: the revoked user still logs in after the rollout: %s", policy, msg)
	}
	if msg := onEveryNode(t, rc, newUser, newPass); msg != "" {
		t.Errorf("after the rollout, the new credential does not work on every Redis pod: %s", msg)
	}
}

// TestTokenSecretHoldsTokensOnlyInData: the Secret that keeps a connection's tokens has them in
// its data only; no label, annotation or status, event or log line holds one, nor a Redis password.
func TestTokenSecretHoldsTokensOnlyInData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	namespace(t, "secret")
	vaultConnection(t, "vault-secret", rolePeriodic, "secret")
	rc := redisCluster(t, "secret", "orders", "vault-secret")
	waitCondition(t, rc, v1alpha1.ConditionReady, metav1.ConditionTrue, "", readyTimeout)
	sec := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: harness.OperatorNS, Name: "keyroll-tokens-vault-secret"}, sec); err != nil {
		t.Fatal(err)
	}
	if len(sec.Data) == 0 {
		t.Fatal("the token Secret holds no token")
	}
	meta := strings.Join(append(mapStrings(sec.Labels), mapStrings(sec.Annotations)...), " ")
	vc := getConnection(t, "vault-secret")
	for accessor, token := range sec.Data {
		if !strings.HasPrefix(string(token), "hvs.") {
			t.Errorf("data %s does not hold a Vault token", accessor)
		}
		if !slices.ContainsFunc(vc.Status.Tokens, func(s v1alpha1.TokenStatus) bool { return s.Accessor == accessor }) {
			t.Errorf("data key %s is not the accessor of a token in the VaultConnection's status %+v", accessor, vc.Status.Tokens)
		}
		for where, text := range map[string]string{"labels or annotations": meta, "operator logs": operatorLogs.String(),
			"VaultConnection status": fmt.Sprintf("%+v", vc.Status), "RedisCluster status": fmt.Sprintf("%+v", get(t, rc).Status)} {
			if strings.Contains(text, string(token)) {
				t.Errorf("a Vault token reached the %s", where)
			}
		}
	}
	if ref := metav1.GetControllerOfNoCopy(sec); ref != nil || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].Name != "vault-secret" {
		t.Errorf("owner references %+v, want the VaultConnection (not as controller)", sec.OwnerReferences)
	}
	// Nor does a Redis password: the credential's, or those of keyroll's own users on the nodes.
	events := strings.Join(eventNotes(t, "secret"), "\n")
	for _, p := range []struct{ secret, key string }{
		{"orders-credentials", "password"}, {"orders-keyroll", "password"}, {"orders-keyroll", "admin-password"},
		{"orders-acl", "replication-password"}, {"orders-acl", "probe-password"},
	} {
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: "secret", Name: p.secret}, s); err != nil {
			t.Fatal(err)
		}
		pw := string(s.Data[p.key])
		if len(pw) < 8 {
			t.Errorf("Secret %s holds no password under %s", p.secret, p.key)
			continue
		}
		for where, text := range map[string]string{"operator logs": operatorLogs.String(), "events": events,
			"RedisCluster status": fmt.Sprintf("%+v", get(t, rc).Status)} {
			if strings.Contains(text, pw) {
				t.Errorf("the password of Secret %s, key %s, reached the %s", p.secret, p.key, where)
			}
		}
	}
}

// eventNotes are the notes of every event in a namespace.
func eventNotes(t *testing.T, ns string) []string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Note)
	}
	return out
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

func editConnection(t *testing.T, name string, mutate func(*v1alpha1.VaultConnection)) {
	t.Helper()
	vc := getConnection(t, name)
	patch := client.MergeFrom(vc.DeepCopy())
	mutate(vc)
	if err := k8s.Patch(context.Background(), vc, patch); err != nil {
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

func consumerDeployment(t *testing.T, ns, name string) client.ObjectKey {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				// A stand-in that runs nothing: on kwok's fake node, where it becomes Ready at once.
				Spec: corev1.PodSpec{NodeSelector: map[string]string{testground.NodeLabel: "kwok"},
					Containers: []corev1.Container{{Name: "app", Image: "example/app:1"}}},
			},
		},
	}
	if err := k8s.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(d)
}

func setPaused(t *testing.T, key client.ObjectKey, paused bool) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := k8s.Get(context.Background(), key, d); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Paused = paused
	if err := k8s.Patch(context.Background(), d, patch); err != nil {
		t.Fatal(err)
	}
}
