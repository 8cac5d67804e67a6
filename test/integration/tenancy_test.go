package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/test/framework"
)

// The tenancy tests: one VaultConnection shared by namespaces, each allowed the Vault roles named
// after it (spec.allowedPaths database/creds/{namespace}.*), as the Vault administrators' guide
// sets it up. Vault's audit log, which every request reaches, says what keyroll asked of Vault:
// the operator's requests are those of tokens of its Kubernetes auth role.

// tenantPaths is the guide's rule: a namespace's roles are named <namespace>.<role>.
var tenantPaths = framework.Paths("database/creds/{namespace}.*")

// operatorRequests are the operator's requests in the audit log that match.
func operatorRequests(t *testing.T, match func(framework.AuditEntry) bool) []framework.AuditEntry {
	t.Helper()
	return requestsOf(t, fw.OperatorRole, match)
}

// requestsOf are the requests in the audit log of tokens of the Kubernetes auth role role that
// match.
func requestsOf(t *testing.T, role string, match func(framework.AuditEntry) bool) []framework.AuditEntry {
	t.Helper()
	entries, err := framework.ReadAudit(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	var out []framework.AuditEntry
	for _, e := range entries {
		if e.ByRole(role) && match(e) {
			out = append(out, e)
		}
	}
	return out
}

func describeRequests(es []framework.AuditEntry) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "\n  %s %s %s", e.Time.Format(time.RFC3339Nano), e.Request.Operation, e.Request.Path)
	}
	return b.String()
}

// issueByHand is a lease of path that a Vault administrator (root) obtains: another team's.
func issueByHand(t *testing.T, path string) string {
	t.Helper()
	s, err := fw.Ground.Vault.Root.Logical().ReadWithContext(context.Background(), path)
	if err != nil || s == nil || s.LeaseID == "" {
		t.Fatalf("reading %s by hand: %v", path, err)
	}
	return s.LeaseID
}

// untouched checks that each lease is live in Vault and that the operator never named it in a
// request (renew, lookup, revoke: by path, or by its hashed lease_id).
func untouched(t *testing.T, leases map[string]string) {
	t.Helper()
	for what, id := range leases {
		if ok, _ := fw.LeaseExists(id); !ok {
			t.Errorf("%s (%s) is gone from Vault", what, id)
		}
		hashed, err := fw.AuditHash(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if es := operatorRequests(t, func(e framework.AuditEntry) bool { return e.Names(id, hashed) }); len(es) > 0 {
			t.Errorf("the operator sent Vault %d request(s) naming %s (%s):%s", len(es), what, id, describeRequests(es))
		}
	}
}

// TestTenantCannotReadAnotherTenantsRole: namespaces a and b, each with its own role. A
// RedisCluster in a naming b's path is refused with a condition that names the field, and Vault's
// audit log holds no request for b's path; a's own path gives a working credential. In both
// identity modes: the operator's own login, and a login per namespace (identity Namespace), where
// Vault's role and policy for each namespace decide as well.
func TestTenantCannotReadAnotherTenantsRole(t *testing.T) {
	t.Run("Operator", func(t *testing.T) { tenantsApart(t, v1beta1.IdentityOperator, "ten") })
	t.Run("Namespace", func(t *testing.T) { tenantsApart(t, v1beta1.IdentityNamespace, "nsid") })
}

func tenantsApart(t *testing.T, identity v1beta1.VaultIdentity, prefix string) {
	a, b := fw.Namespace(t, prefix+"-a"), fw.Namespace(t, prefix+"-b")
	opts := []framework.VaultConnectionOption{framework.Allow(a, b), tenantPaths}
	if identity == v1beta1.IdentityNamespace {
		fw.NamespaceIdentity(t, a)
		fw.NamespaceIdentity(t, b)
		opts = append(opts, framework.NamespaceIdentityOption)
	}
	vc := fw.VaultConnection(t, "vault-tenants-"+prefix, opts...)
	fw.WaitConnectionReady(t, vc.Name, 30*time.Second)
	theirs := fw.Path(prefix + "-b.orders")

	thief := fw.RedisCluster(t, a, "stolen", vc.Name, theirs)
	cur := fw.WaitCondition(t, thief, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonPathNotAllowed, 30*time.Second)
	msg := framework.Condition(cur, v1beta1.ConditionCredentialsReady).Message
	for _, want := range []string{"credentials.vaultLease.path", theirs, "spec.allowedPaths"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not name %q", msg, want)
		}
	}
	if !fw.HasEvent(t, a, "stolen", v1beta1.EventAccessDenied) {
		t.Errorf("no Warning event %s for the refused path", v1beta1.EventAccessDenied)
	}

	own := fw.RedisCluster(t, a, "orders", vc.Name, fw.Path(prefix+"-a.orders"))
	cur = fw.WaitReady(t, own, 90*time.Second)
	if user, pass, _ := fw.Credentials(own); !fw.Authenticates(user, pass) {
		t.Error("a's credential from its own role does not authenticate")
	}
	if id := cur.Status.Credential.Lease.LeaseID; !strings.HasPrefix(id, fw.Path(prefix+"-a.orders")+"/") {
		t.Errorf("a's lease %q is not of a's role", id)
	}
	if cur := fw.Get(t, thief); cur.Status.Credential != nil || len(cur.Status.Leases) > 0 {
		t.Errorf("the refused cluster holds a credential or leases: %+v %+v", cur.Status.Credential, cur.Status.Leases)
	}
	fw.DeleteAndWait(t, thief, 30*time.Second)
	for _, role := range []string{fw.OperatorRole, a, b} {
		if es := requestsOf(t, role, func(e framework.AuditEntry) bool { return strings.Contains(e.Request.Path, theirs) }); len(es) > 0 {
			t.Errorf("keyroll sent Vault %d request(s) for b's path as %s:%s", len(es), role, describeRequests(es))
		}
	}
	if identity == v1beta1.IdentityNamespace {
		vaultDecides(t, a, vc.Name, cur, prefix)
	}
	fw.DeleteAndWait(t, own, 30*time.Second)
}

// vaultDecides, with identity Namespace: a's credential came from a's own login, whose tokens are
// kept apart from other namespaces' (connection.TokenSecretName); after an operator
// restart a rotation revokes the old lease through that login; and with keyroll's guard opened
// wide (allowedPaths database/creds/*), Vault itself refuses a's login b's path.
func vaultDecides(t *testing.T, a, conn string, rc *v1beta1.RedisCluster, prefix string) {
	t.Helper()
	ctx := context.Background()
	lease := rc.Status.Credential.Lease.LeaseID
	issued := requestsOf(t, a, func(e framework.AuditEntry) bool { return e.Request.Path == fw.Path(prefix+"-a.orders") })
	if len(issued) == 0 {
		t.Errorf("no issue of a's credential by a's own Vault login (role %s) in the audit log", a)
	}
	if es := requestsOf(t, fw.OperatorRole, func(e framework.AuditEntry) bool { return strings.Contains(e.Request.Path, prefix+"-a.orders") }); len(es) > 0 {
		t.Errorf("the operator's own login sent Vault %d request(s) for a's path:%s", len(es), describeRequests(es))
	}
	sec := &corev1.Secret{}
	if err := fw.Client.Get(ctx, client.ObjectKey{Namespace: fw.OperatorNS, Name: connection.TokenSecretName(conn, a)}, sec); err != nil {
		t.Fatalf("a's token Secret: %v", err)
	}
	if _, ok := sec.Data[rc.Status.Credential.VaultLease.TokenAccessor]; !ok {
		t.Errorf("the token that created a's lease is not in a's token Secret")
	}
	fw.RestartOperator(t)
	ack := fw.RotateNow(t, rc)
	framework.Eventually(t, 90*time.Second, func() string {
		cur := fw.Get(t, rc)
		if cur.Status.RotateNowAcknowledged != ack || cur.Status.Rollout != nil || ledgerHas(cur, lease) {
			return "rotation not finished, or the old lease still in the ledger"
		}
		return ""
	})
	hashed, err := fw.AuditHash(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if es := requestsOf(t, a, func(e framework.AuditEntry) bool {
		return e.Request.Operation == "update" && e.Names(lease, hashed) && strings.HasPrefix(e.Request.Path, "sys/leases/revoke/")
	}); len(es) == 0 {
		t.Errorf("the old lease %s was not revoked through a's own login after the restart", lease)
	}

	wide := fw.VaultConnection(t, "vault-tenants-wide", framework.Allow(a), framework.Paths("database/creds/*"), framework.NamespaceIdentityOption)
	theirs := fw.Path(prefix + "-b.orders")
	thief := fw.RedisCluster(t, a, "wide", wide.Name, theirs)
	cur := fw.WaitCondition(t, thief, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonPermissionDenied, 60*time.Second)
	if cur.Status.Credential != nil {
		t.Errorf("a got a credential from b's role through its own login")
	}
	denied := requestsOf(t, a, func(e framework.AuditEntry) bool { return e.Request.Path == theirs })
	if len(denied) == 0 {
		t.Error("no request of a's login for b's path in the audit log: Vault did not decide")
	}
	fw.DeleteAndWait(t, thief, 30*time.Second)
}

// TestForgedLeaseIDIsNeverRenewedOrRevoked: leases of another team, placed where keyroll reads
// lease IDs (a status ledger written by hand, the Secret External Secrets Operator writes for
// keyroll, and a look-alike Secret), are left alone through a rotation and the deletion of the
// RedisClusters: live in Vault, and never named in a request of the operator.
func TestForgedLeaseIDIsNeverRenewedOrRevoked(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "forged")
	vc := fw.VaultConnection(t, "vault-forged", framework.Allow(ns), tenantPaths)
	foreign := fw.Path("ten-b.orders")
	leases := map[string]string{
		"the lease in the hand-written ledger":     issueByHand(t, foreign),
		"the lease in the ExternalSecret's Secret": issueByHand(t, foreign),
		"the lease in the look-alike Secret":       issueByHand(t, foreign),
	}

	// VaultLease mode: a superseded lease added to the ledger by hand.
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("forged.orders"))
	fw.WaitReady(t, rc, 90*time.Second)
	forged := leases["the lease in the hand-written ledger"]
	framework.Eventually(t, 30*time.Second, func() string {
		cur := fw.Get(t, rc)
		cur.Status.Leases = append(cur.Status.Leases, v1beta1.LeaseRecord{LeaseID: forged, State: v1beta1.LeaseSuperseded, Version: "forged"})
		if err := fw.Client.Status().Update(ctx, cur); err != nil {
			return err.Error()
		}
		return ""
	})
	fw.RotateNow(t, rc)
	framework.Eventually(t, 60*time.Second, func() string {
		for _, n := range framework.Notes(fw.ClusterEvents(t, ns, "orders")) {
			if strings.HasPrefix(n, v1beta1.EventLeaseDisowned+": ") && strings.Contains(n, forged) {
				return ""
			}
		}
		return "no LeaseDisowned event names the forged lease"
	})

	// ExternalSecret mode, the lease tracked: the Secret ESO writes gets another team's lease ID
	// by hand, and a look-alike Secret (the cluster's labels, "controlled" by an ExternalSecret of
	// the cluster's name that is not keyroll's) holds another.
	fw.VaultDynamicSecret(t, ns, "redis-cache", "forged.es", true)
	es := fw.ExternalSecretCluster(t, ns, "cache", v1beta1.ExternalSecretSource{
		GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-cache"},
		RefreshInterval: &metav1.Duration{Duration: time.Hour},
		ConnectionRef:   &v1beta1.ConnectionReference{Name: vc.Name},
	})
	fw.WaitReady(t, es, 90*time.Second)
	synced := &corev1.Secret{}
	if err := fw.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cache-eso"}, synced); err != nil {
		t.Fatal(err)
	}
	lookAlike := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache-eso-copy", Labels: synced.Labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "external-secrets.io/v1", Kind: "ExternalSecret", Name: "cache",
			UID: "00000000-0000-0000-0000-000000000000", Controller: ptrTo(true)}}}, Data: map[string][]byte{}}
	for k, v := range synced.Data {
		lookAlike.Data[k] = v
	}
	lookAlike.Data["lease_id"] = []byte(leases["the lease in the look-alike Secret"])
	if err := fw.Client.Create(ctx, lookAlike); err != nil {
		t.Fatal(err)
	}
	edited := leases["the lease in the ExternalSecret's Secret"]
	synced.Data["lease_id"] = []byte(edited)
	if err := fw.Client.Update(ctx, synced); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 60*time.Second, func() string {
		for _, n := range framework.Notes(fw.ClusterEvents(t, ns, "cache")) {
			if strings.HasPrefix(n, v1beta1.EventLeaseDisowned+": ") && strings.Contains(n, edited) {
				return ""
			}
		}
		return "no LeaseDisowned event names the lease written into the ExternalSecret's Secret"
	})
	fw.RotateNow(t, es)
	framework.Eventually(t, 60*time.Second, func() string {
		if cur := fw.Get(t, es); cur.Status.Credential == nil || ledgerHas(cur, edited) {
			return "the edited lease is in the ledger, or there is no credential"
		}
		return ""
	})

	fw.DeleteAndWait(t, rc, 60*time.Second)
	deleteAndWait(t, es)
	untouched(t, leases)
}

func ledgerHas(rc *v1beta1.RedisCluster, id string) bool {
	for _, l := range rc.Status.Leases {
		if l.LeaseID == id {
			return true
		}
	}
	return false
}

func ptrTo[T any](v T) *T { return &v }

// TestDisallowedNamespaceMakesNoVaultCall: a RedisCluster in a namespace the connection does not
// allow is created, asked to rotate and deleted, with the orphan-lease sweep running every 10 s:
// the operator sends Vault no request for it (its path, its leases, a sweep of its path).
func TestDisallowedNamespaceMakesNoVaultCall(t *testing.T) {
	ns, other := fw.Namespace(t, "nocall"), fw.Namespace(t, "nocall-ok")
	vc := fw.VaultConnection(t, "vault-nocall", framework.Allow(other), tenantPaths, func(vc *v1beta1.VaultConnection) {
		vc.Spec.OrphanLeases = &v1beta1.OrphanLeases{Action: v1beta1.OrphanLeasesRevoke,
			GracePeriod: &metav1.Duration{Duration: 10 * time.Second}, Interval: &metav1.Duration{Duration: 10 * time.Second}}
	})
	path := fw.Path("nocall.orders")
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, path)
	fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonNamespaceNotAllowed, 30*time.Second)
	fw.RotateNow(t, rc)
	// Two sweeps at least, with the cluster there.
	created := time.Now()
	framework.Eventually(t, 60*time.Second, func() string {
		st := fw.GetConnection(t, vc.Name).Status.OrphanLeases
		if st == nil || st.LastSweepAt == nil || st.LastSweepAt.Time.Before(created.Add(11*time.Second)) {
			return fmt.Sprintf("no sweep since 11 s after the cluster was created: %+v", st)
		}
		return ""
	})
	fw.DeleteAndWait(t, rc, 30*time.Second)
	if es := operatorRequests(t, func(e framework.AuditEntry) bool { return strings.Contains(e.Request.Path, "nocall") }); len(es) > 0 {
		t.Errorf("the operator sent Vault %d request(s) for the disallowed cluster:%s", len(es), describeRequests(es))
	}
	if st := fw.GetConnection(t, vc.Name).Status.OrphanLeases; st == nil || len(st.Paths) > 0 {
		t.Errorf("the sweep covered paths of a disallowed namespace: %+v", st)
	}
}

// recorder is a TCP listener on loopback that counts the connections made to it.
type recorder struct {
	ln    net.Listener
	conns atomic.Int32
}

func listen(t *testing.T) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.conns.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return r
}

// apiAudience is the audience of the API server's own tokens.
func apiAudience(t *testing.T) string {
	t.Helper()
	tok, err := fw.Ground.CP.ServiceAccountToken(context.Background(), fw.OperatorNS, framework.OperatorSA, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatal("the service-account token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct{ Aud []string }
	if err := json.Unmarshal(payload, &claims); err != nil || len(claims.Aud) == 0 {
		t.Fatalf("no audience in the API server's token: %v", err)
	}
	return claims.Aud[0]
}

// TestVaultConnectionCannotExfiltrateTokens: a VaultConnection whose writer asks for a token of
// the API server's own audience, or names a Secret of another namespace, pointed at a listener on
// loopback: keyroll refuses it (Ready=False, SettingsRefused, naming the field), a RedisCluster
// using it gets no credential, and the listener sees no connection at all.
func TestVaultConnectionCannotExfiltrateTokens(t *testing.T) {
	ctx := context.Background()
	ns, elsewhere := fw.Namespace(t, "exfil"), fw.Namespace(t, "exfil-secrets")
	sink := listen(t)
	addr := framework.Address("http://" + sink.ln.Addr().String())

	aud := fw.VaultConnection(t, "vault-exfil-aud", framework.Allow(ns), addr, func(vc *v1beta1.VaultConnection) {
		vc.Spec.Auth = v1beta1.VaultAuth{Kubernetes: &v1beta1.KubernetesAuth{Role: fw.OperatorRole, Audiences: []string{apiAudience(t)}}}
	})
	fw.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: elsewhere, Name: "app-token"},
		Data: map[string][]byte{"token": []byte("a-secret-of-another-namespace")}})
	ref := fw.VaultConnection(t, "vault-exfil-ref", framework.Allow(ns), addr, func(vc *v1beta1.VaultConnection) {
		vc.Spec.Auth = v1beta1.VaultAuth{Token: &v1beta1.TokenAuth{SecretRef: v1beta1.SecretKeyReference{Namespace: elsewhere, Name: "app-token", Key: "token"}}}
	})
	for vc, field := range map[string]string{aud.Name: "auth.kubernetes.audiences", ref.Name: "auth.token.secretRef"} {
		framework.Eventually(t, 30*time.Second, func() string {
			c := apimeta.FindStatusCondition(fw.GetConnection(t, vc).Status.Conditions, v1beta1.ConditionReady)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1beta1.ReasonSettingsRefused || !strings.Contains(c.Message, field) {
				return fmt.Sprintf("VaultConnection %s: Ready %+v, want False/%s naming %s", vc, c, v1beta1.ReasonSettingsRefused, field)
			}
			return ""
		})
	}
	// RedisClusters that use them ask for credentials, which would log in.
	for _, vc := range []string{aud.Name, ref.Name} {
		rc := fw.RedisCluster(t, ns, vc, vc, fw.Path("orders"))
		fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, "", 30*time.Second)
		time.Sleep(2 * time.Second) // a retry or two
		if cur := fw.Get(t, rc); cur.Status.Credential != nil {
			t.Errorf("RedisCluster %s got a credential through a refused connection", vc)
		}
		fw.DeleteAndWait(t, rc, 30*time.Second)
	}
	if n := sink.conns.Load(); n > 0 {
		t.Fatalf("the connections' address saw %d connection(s)", n)
	}
	for _, vc := range []string{aud.Name, ref.Name} {
		if err := fw.Client.Delete(ctx, fw.GetConnection(t, vc)); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}

// TestDisallowedNamespaceCannotRevokeThroughAForgedSecret: a tenant of a namespace the connection
// does not allow makes an ExternalSecret-mode RedisCluster naming it, an ExternalSecret controlled
// by the cluster (an owner reference names its UID: nothing authenticates it) and the Secret
// External Secrets Operator would write, holding another team's lease of a role the connection
// shares with every namespace it allows (a plain allowedPaths entry). Deleting the cluster leaves
// that lease alone: live in Vault, and never named in a request of the operator.
func TestDisallowedNamespaceCannotRevokeThroughAForgedSecret(t *testing.T) {
	ctx := context.Background()
	ns, allowed := fw.Namespace(t, "plainrev"), fw.Namespace(t, "plainrev-ok")
	shared := fw.Path("shared.orders")
	vc := fw.VaultConnection(t, "vault-plainrev", framework.Allow(allowed), framework.Paths(shared))
	victim := issueByHand(t, shared)

	rc := fw.ExternalSecretCluster(t, ns, "cache", v1beta1.ExternalSecretSource{
		GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-cache"},
		RefreshInterval: &metav1.Duration{Duration: time.Hour},
		ConnectionRef:   &v1beta1.ConnectionReference{Name: vc.Name},
	})
	rc = fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonNamespaceNotAllowed, 30*time.Second)

	// The ExternalSecret, made by hand unless keyroll made one, and the Secret ESO would write
	// for it, with the other team's lease in the raw Vault response keyroll tracks leases from.
	es, err := externalSecret(t, rc)
	if apierrors.IsNotFound(err) {
		fw.Create(t, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "external-secrets.io/v1", "kind": "ExternalSecret",
			"metadata": map[string]any{"namespace": ns, "name": rc.Name,
				"labels": map[string]any{v1beta1.LabelManagedBy: v1beta1.ManagedByValue, v1beta1.LabelCluster: rc.Name},
				"ownerReferences": []any{map[string]any{
					"apiVersion": v1beta1.GroupVersion.String(), "kind": "RedisCluster", "name": rc.Name, "uid": string(rc.UID), "controller": true}}},
			"spec": map[string]any{
				"refreshInterval": "1h",
				"target":          map[string]any{"name": rc.Name + "-eso", "creationPolicy": "Orphan"},
				"dataFrom": []any{map[string]any{"sourceRef": map[string]any{"generatorRef": map[string]any{
					"apiVersion": "generators.external-secrets.io/v1alpha1", "kind": "VaultDynamicSecret", "name": "nothing-here"}}}},
			},
		}})
		es, err = externalSecret(t, rc)
	}
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(map[string]string{"username": "V_FORGED_USER", "password": "forged-password"})
	fw.Create(t, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: rc.Name + "-eso", Labels: map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue, v1beta1.LabelCluster: rc.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "external-secrets.io/v1", Kind: "ExternalSecret", Name: es.Name, UID: es.UID, Controller: ptrTo(true)}}},
		Data: map[string][]byte{"data": data, "lease_id": []byte(victim), "lease_duration": []byte("600"), "renewable": []byte("true")},
	})
	// Let the manager see both (its informers record the lease the Secret holds) before the delete.
	time.Sleep(3 * time.Second)

	fw.DeleteAndWait(t, rc, 60*time.Second)

	if err := fw.Client.Delete(ctx, es); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	untouched(t, map[string]string{"the other team's lease in the forged Secret": victim})
}

// tokenSink is an HTTP listener on loopback standing in for a Vault server: it answers every
// request with 503 and keeps the Vault tokens the requests carried.
type tokenSink struct {
	srv    *httptest.Server
	mu     sync.Mutex
	tokens []string
	hits   int
}

func newTokenSink(t *testing.T) *tokenSink {
	s := &tokenSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.hits++
		if tok := r.Header.Get("X-Vault-Token"); tok != "" {
			s.tokens = append(s.tokens, tok)
		}
		s.mu.Unlock()
		http.Error(w, "sink", http.StatusServiceUnavailable)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *tokenSink) seen() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits, slices.Clone(s.tokens)
}

// TestTokenStoresOfLookAlikeConnectionsStayApart: connection A keeps the Vault tokens of
// namespace ns's login where an earlier keyroll kept them, keyroll-tokens-<A>.<ns>; a
// VaultConnection named <A>.<ns>, whose own store an earlier keyroll named the same, is pointed at
// a listener on loopback, and a RedisCluster uses it. It never reads A's tokens: the listener is
// asked with none of them, the Secret keeps them, and the token stays valid in Vault.
func TestTokenStoresOfLookAlikeConnectionsStayApart(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "tokcoll")
	a := fw.VaultConnection(t, "vault-tokcoll", framework.Allow(ns), tenantPaths)
	tok, err := fw.Ground.Vault.Root.Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{"default"}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	legacy := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: fw.OperatorNS, Name: "keyroll-tokens-" + a.Name + "." + ns,
			Annotations:     map[string]string{v1beta1.LabelVaultConnection: a.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1beta1.GroupVersion.String(), Kind: "VaultConnection", Name: a.Name, UID: a.UID}}},
		Data: map[string][]byte{tok.Auth.Accessor: []byte(tok.Auth.ClientToken)},
	}
	fw.Create(t, legacy)

	sink := newTokenSink(t)
	b := fw.VaultConnection(t, strings.TrimPrefix(a.Name+"."+ns, fw.Name("")), framework.Allow(ns), tenantPaths, framework.Address(sink.srv.URL))
	if b.Name != legacy.Name[len("keyroll-tokens-"):] {
		t.Fatalf("the look-alike connection is named %q, not %q", b.Name, legacy.Name[len("keyroll-tokens-"):])
	}
	// A RedisCluster using it makes keyroll take over the tokens of its store (and log in).
	fw.RedisCluster(t, ns, "orders", b.Name, "database/creds/"+ns+".orders")
	framework.Eventually(t, 60*time.Second, func() string {
		if hits, _ := sink.seen(); hits < 2 {
			return "the look-alike connection has not asked its address twice yet"
		}
		return ""
	})
	time.Sleep(5 * time.Second) // more attempts, after the backoff of a failed one
	if hits, tokens := sink.seen(); slices.Contains(tokens, tok.Auth.ClientToken) {
		t.Errorf("the look-alike connection sent connection %s's token to its address (%d request(s))", a.Name, hits)
	}
	cur := &corev1.Secret{}
	if err := fw.Client.Get(ctx, client.ObjectKeyFromObject(legacy), cur); err != nil {
		t.Fatal(err)
	}
	if string(cur.Data[tok.Auth.Accessor]) != tok.Auth.ClientToken {
		t.Errorf("connection %s's token left its Secret %s", a.Name, legacy.Name)
	}
	if _, err := fw.Ground.Vault.Root.Auth().Token().Lookup(tok.Auth.ClientToken); err != nil {
		t.Errorf("connection %s's token is no longer valid in Vault: %v", a.Name, err)
	}
}
