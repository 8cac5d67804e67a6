package rediscluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"
	acs "k8s.io/client-go/applyconfigurations"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/structured-merge-diff/v6/typed"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/redisnode/redisnodetest"
	"github.com/keyroll/keyroll/vault"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

// These tests drive the reconciler with controller-runtime's fake client, the Vault fake and fake
// Redis nodes: no API server, no Vault, no Redis; the pods are objects that say they run. They run
// in make unit, in seconds.

var epoch = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// fakeClients hands out one Vault fake for every VaultConnection, or the one of its name in by.
type fakeClients struct {
	fake *vaulttest.Fake
	by   map[string]*vaulttest.Fake
}

func (f *fakeClients) Get(name string, _ vault.Config) (connection.Client, error) {
	if v, ok := f.by[name]; ok {
		return v, nil
	}
	return f.fake, nil
}
func (*fakeClients) Forget(string) {}

type harness struct {
	r      *Reconciler
	k8s    client.Client
	vault  *vaulttest.Fake
	redis  *redisnodetest.Fake
	clock  *testclock.FakeClock
	events *events.FakeRecorder
	// vaults are the Vault fakes by VaultConnection; "vault" is h.vault.
	vaults *fakeClients
}

// deducedNetworkPolicies is client-go's type converter for every kind but NetworkPolicy, which it
// leaves to the deduced converter after it. With client-go v0.37 the fake client's server-side
// apply of a NetworkPolicy typed by client-go's schema fails ("expected objects with types from
// the same schema", an old-style Patch as much as an Apply), while the other kinds need those
// schemas (list merge keys) for a steady state to compare equal and write nothing.
type deducedNetworkPolicies struct{ managedfields.TypeConverter }

func (c deducedNetworkPolicies) ObjectToTyped(obj runtime.Object, opts ...typed.ValidationOptions) (*typed.TypedValue, error) {
	if obj.GetObjectKind().GroupVersionKind().Kind == "NetworkPolicy" {
		return nil, errors.New("NetworkPolicy: left to the deduced type converter")
	}
	if _, ok := obj.(*networkingv1.NetworkPolicy); ok {
		return nil, errors.New("NetworkPolicy: left to the deduced type converter")
	}
	return c.TypeConverter.ObjectToTyped(obj, opts...)
}

func newHarness(t *testing.T, objs ...client.Object) *harness {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1beta1.AddToScheme, externalsecrets.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	vc := &v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault", UID: "vc-uid"}, Spec: v1beta1.VaultConnectionSpec{
		Address: "https://vault.example:8200", AllowedNamespaces: []string{"*"}, AllowedPaths: []string{"database/creds/*"},
		Auth: v1beta1.VaultAuth{Kubernetes: &v1beta1.KubernetesAuth{Mount: "kubernetes", Role: "keyroll", Audiences: []string{"vault"}}},
	}}
	for _, o := range objs {
		if rc, ok := o.(*v1beta1.RedisCluster); ok {
			objs = append(objs, runningPods(rc)...)
		}
	}
	k8s := fake.NewClientBuilder().WithScheme(s).WithObjects(append(objs, vc)...).WithReturnManagedFields().
		WithTypeConverters(deducedNetworkPolicies{acs.NewTypeConverter(clientgoscheme.Scheme)}, managedfields.NewDeducedTypeConverter()).
		WithStatusSubresource(&v1beta1.RedisCluster{}, &v1beta1.VaultConnection{}).
		WithIndex(&v1beta1.RedisCluster{}, connection.ClusterIndex, func(o client.Object) []string {
			return o.(*v1beta1.RedisCluster).VaultConnections()
		}).
		WithIndex(&v1beta1.RedisCluster{}, ConsumerIndex, ConsumerKeys).
		// The API server answers a pod list by status.podIP (oldclients.go).
		WithIndex(&corev1.Pod{}, "status.podIP", func(o client.Object) []string { return []string{o.(*corev1.Pod).Status.PodIP} }).
		Build()
	clk := testclock.NewFakeClock(epoch)
	fv := vaulttest.New(clk)
	fv.LeaseDuration = 10 * time.Minute
	rec := events.NewFakeRecorder(100)
	vaults := &fakeClients{fake: fv, by: map[string]*vaulttest.Fake{}}
	redis := redisnodetest.New()
	for _, o := range objs {
		if rc, ok := o.(*v1beta1.RedisCluster); ok {
			// Pod 0 is the primary, as the start script makes it.
			for i := 1; i < int(rc.Spec.Replicas); i++ {
				redis.ReplicateFrom(nodeAddr(0), nodeAddr(i))
			}
		}
	}
	r := New(Config{
		Client: k8s, APIReader: k8s, Recorder: rec, Clock: clk, Metrics: metrics.For(clk),
		Connector: &connection.Connector{Reader: k8s, Clients: vaults, Clock: clk},
		DialRedis: redis.Dial, ProbeImage: testProbeImage,
	})
	return &harness{r: r, k8s: k8s, vault: fv, redis: redis, clock: clk, events: rec, vaults: vaults}
}

// testProbeImage is the probe sidecar's image in these tests.
const testProbeImage = "registry.example/keyroll:v1"

// runningPods are rc's StatefulSet (as the reconciler would apply it, with a UID the fake client
// does not give) and its Redis pods as the kubelet reports them: each running Redis, Ready, at
// an address of its own.
func runningPods(rc *v1beta1.RedisCluster) []client.Object {
	version := ""
	if c := rc.Status.Credential; c != nil {
		version = c.Version
	}
	sts := render.StatefulSet(rc, version, testProbeImage)
	sts.UID = "sts-uid"
	sts.OwnerReferences = []metav1.OwnerReference{{APIVersion: "keyroll.dev/v1beta1", Kind: "RedisCluster", Name: rc.Name, UID: rc.UID, Controller: ptr.To(true)}}
	sts.Status.CurrentRevision, sts.Status.UpdateRevision = testRevision, testRevision
	labels := render.SelectorLabels(rc)
	labels[appsv1.ControllerRevisionHashLabelKey] = testRevision
	pods := []client.Object{sts}
	for i := range rc.Spec.Replicas {
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: rc.Namespace, Name: fmt.Sprintf("%s-%d", rc.Name, i), UID: types.UID(fmt.Sprintf("pod-%d", i)),
				Labels: maps.Clone(labels), Annotations: sts.Spec.Template.Annotations,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr.To(true)}}},
			Status: corev1.PodStatus{PodIP: podIP(int(i)),
				Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "redis", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(epoch)}}}}},
		})
	}
	return pods
}

func podIP(i int) string { return fmt.Sprintf("10.0.0.%d", 10+i) }

// nodeAddr is where the reconciler reaches pod i.
func nodeAddr(i int) string { return podIP(i) + ":6379" }

// cluster is a RedisCluster as the API server stores it, defaults filled in.
func cluster(mutate ...func(*v1beta1.RedisCluster)) *v1beta1.RedisCluster {
	rc := &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "rc-uid", Generation: 1},
		Spec: v1beta1.RedisClusterSpec{
			Replicas: 1, Image: "docker.io/library/redis", Version: "7.0", DeletionPolicy: v1beta1.DeletionRevoke,
			Credentials: v1beta1.CredentialsSpec{
				Source: v1beta1.SourceVaultLease, UsernameKey: "username", PasswordKey: "password",
				ACLRules: []string{"~*", "&*", "+@all"}, OnRevokedOutside: v1beta1.RevokedOutsideCutOff,
				VaultLease: &v1beta1.VaultLeaseSource{ConnectionRef: v1beta1.ConnectionReference{Name: "vault"},
					Path: "database/creds/orders", RenewalPercent: 67, MinTTL: &metav1.Duration{Duration: time.Minute}},
			},
			Rollout: v1beta1.RolloutSpec{ReadinessTimeout: &metav1.Duration{Duration: 5 * time.Minute}},
		},
	}
	for _, m := range mutate {
		m(rc)
	}
	return rc
}

func (h *harness) reconcile(t *testing.T) ctrl.Result {
	t.Helper()
	res, err := h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "orders"}})
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return res
}

func (h *harness) get(t *testing.T) *v1beta1.RedisCluster {
	t.Helper()
	rc := &v1beta1.RedisCluster{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// settle reconciles until the status stops changing.
func (h *harness) settle(t *testing.T) *v1beta1.RedisCluster {
	t.Helper()
	last := ""
	for range 10 {
		h.reconcile(t)
		rc := h.get(t)
		if rc.ResourceVersion == last {
			return rc
		}
		last = rc.ResourceVersion
	}
	t.Fatal("the reconciler did not settle in 10 reconciles")
	return nil
}

func (h *harness) eventReasons() []string {
	var out []string
	for {
		select {
		case e := <-h.events.Events:
			out = append(out, strings.Fields(e)[1])
		default:
			return out
		}
	}
}

func condition(rc *v1beta1.RedisCluster, t string) *metav1.Condition {
	return meta.FindStatusCondition(rc.Status.Conditions, t)
}

// Defect: after adding the finalizer the reconcile went on only because the status patch happened
// to conflict; with no status change nothing requeued, and the cluster idled. Now the reconcile
// that adds the finalizer goes on from the patched object; nothing is issued while the finalizer
// cannot be written.
func TestAddingTheFinalizerGoesOnInTheSameReconcile(t *testing.T) {
	rc := cluster()
	rc.Status.Phase = v1beta1.PhaseIssuing // a status the first reconcile leaves as it is
	h := newHarness(t, rc)
	refused := true
	h.r = h.r.WithClient(interceptor.NewClient(h.k8s.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
			if _, ok := o.(*v1beta1.RedisCluster); ok && refused {
				return errors.New("the API server is unavailable")
			}
			return c.Patch(ctx, o, p, opts...)
		},
	}))
	if _, err := h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "orders"}}); err == nil {
		t.Error("no error when the finalizer could not be written")
	}
	if n := h.vault.Calls(vaulttest.OpIssue); n != 0 {
		t.Errorf("%d issues before the finalizer was written", n)
	}

	refused = false
	h.reconcile(t)
	if got := h.get(t).Finalizers; len(got) != 1 || got[0] != v1beta1.Finalizer {
		t.Errorf("finalizers %v", got)
	}
	if n := h.vault.Calls(vaulttest.OpIssue); n != 1 || len(h.get(t).Status.Leases) != 1 {
		t.Errorf("after the reconcile that added the finalizer: %d issues, ledger %+v; want the credential issued in it", n, h.get(t).Status.Leases)
	}
}

func TestIssueRecordsTheLeaseWithItsTokenAndConnectionBeforeTheSecret(t *testing.T) {
	h := newHarness(t, cluster())
	rc := h.settle(t)

	if n := h.vault.Calls(vaulttest.OpIssue); n != 1 {
		t.Fatalf("%d issues, want exactly 1", n)
	}
	if len(rc.Status.Leases) != 1 {
		t.Fatalf("ledger %+v", rc.Status.Leases)
	}
	l := rc.Status.Leases[0]
	if l.State != v1beta1.LeaseActive || l.Connection != "vault" || l.TokenAccessor != "fake-accessor" || l.ExpiresAt == nil {
		t.Errorf("lease record %+v: want Active, through vault, with the token's accessor and expiry", l)
	}
	sec := &corev1.Secret{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-credentials"}, sec); err != nil {
		t.Fatal(err)
	}
	if render.CredentialVersion(string(sec.Data["username"]), string(sec.Data["password"])) != rc.Status.Credential.Version {
		t.Errorf("the credentials Secret does not hold the credential of status.credential")
	}
	if c := condition(rc, v1beta1.ConditionCredentialsReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("CredentialsReady %+v", c)
	}
	if c := condition(rc, v1beta1.ConditionReady); c == nil || c.Reason != v1beta1.ReasonReconciling {
		t.Errorf("Ready %+v: no pod is Ready in a fake cluster", c)
	}
}

func TestSteadyStateMakesNoWriteAndNoVaultCall(t *testing.T) {
	h := newHarness(t, cluster())
	h.settle(t)
	w := h.logWrites()
	calls := h.vault.Calls(vaulttest.OpIssue) + h.vault.Calls(vaulttest.OpRenew) + h.vault.Calls(vaulttest.OpLookup)

	for range 2 {
		if res := h.reconcile(t); res.RequeueAfter <= 0 {
			t.Errorf("no RequeueAfter for the next timed work: %+v", res)
		}
	}

	if got := w.list(); len(got) != 0 {
		t.Errorf("an unchanged RedisCluster was written to: %v", got)
	}
	if n := h.vault.Calls(vaulttest.OpIssue) + h.vault.Calls(vaulttest.OpRenew) + h.vault.Calls(vaulttest.OpLookup) - calls; n != 0 {
		t.Errorf("an unchanged RedisCluster made %d Vault calls", n)
	}
}

// Defect: a credential request Vault refused (PermissionDenied, BadRequest, NotFound) was never
// tried again, so a fix made in Vault was never seen.
func TestRefusedIssueIsTriedAgainAfterAWhile(t *testing.T) {
	for name, class := range map[string]string{"permission denied": vault.ClassPermissionDenied, "bad request": vault.ClassBadRequest, "not found": vault.ClassNotFound} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, cluster())
			h.vault.SetFailure(vaulttest.OpIssue, vaulttest.Err(vaulttest.OpIssue, class))
			h.reconcile(t) // the finalizer

			res := h.reconcile(t)

			if res.RequeueAfter != credential.RefusedRetry {
				t.Errorf("result %+v, want a retry in %s", res, credential.RefusedRetry)
			}
			c := condition(h.get(t), v1beta1.ConditionCredentialsReady)
			if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "tried again in 5m0s") {
				t.Errorf("CredentialsReady %+v: want False, saying when it is tried again", c)
			}
			h.vault.SetFailure(vaulttest.OpIssue, nil) // fixed in Vault
			h.clock.Step(credential.RefusedRetry)
			if rc := h.settle(t); rc.Status.Credential == nil {
				t.Errorf("no credential once Vault allows it")
			}
		})
	}
}

func TestLeaseRevokedOutsideIsFoundByTheLeaseCheckAndReplaced(t *testing.T) {
	h := newHarness(t, cluster())
	old := h.settle(t).Status.Credential
	h.vault.RevokeOutside(old.Lease.LeaseID)
	h.eventReasons()

	h.clock.Step(credential.DefaultLeaseCheckInterval)
	rc := h.settle(t)

	if rc.Status.Credential.Lease.LeaseID == old.Lease.LeaseID || h.vault.Calls(vaulttest.OpLookup) == 0 {
		t.Fatalf("credential %+v after the lease check: want a new lease", rc.Status.Credential)
	}
	if reasons := strings.Join(h.eventReasons(), " "); !strings.Contains(reasons, v1beta1.EventLeaseRevokedOutside) {
		t.Errorf("events %s: want %s", reasons, v1beta1.EventLeaseRevokedOutside)
	}
	for _, l := range rc.Status.Leases {
		if l.LeaseID == old.Lease.LeaseID {
			t.Errorf("the revoked lease is still in the ledger")
		}
	}
	acl := &corev1.Secret{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-acl"}, acl); err != nil {
		t.Fatal(err)
	}
	if users := render.ParseACLUsers(string(acl.Data[render.ACLFileKey])); users[old.Username].Username != "" {
		t.Errorf("CutOff: the revoked user %s is still in the aclfile", old.Username)
	}
}

// Defect: with onRevokedOutside CutOff the revoked lease left the ledger and its user the nodes,
// and nothing else was pending: the new credential reached the consumers' Secret, but no rollout
// ran, so the consumers were never restarted and kept the user that had been cut off.
func TestCutOffRollsTheReplacementOutToTheConsumers(t *testing.T) {
	api := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"}}
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1beta1.ConsumerReference{{Kind: "Deployment", Name: "api"}}
	}), api)
	old := h.settle(t).Status.Credential
	h.vault.RevokeOutside(old.Lease.LeaseID)
	h.eventReasons()

	h.clock.Step(credential.DefaultLeaseCheckInterval)
	rc := h.settle(t)

	if rc.Status.Credential.Version == old.Version {
		t.Fatal("no new credential after the revocation")
	}
	if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(api), api); err != nil {
		t.Fatal(err)
	}
	if got := api.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]; got != rc.Status.Credential.Version {
		t.Errorf("the consumer's template has credential version %q, want the replacement %s (events %v)", got, rc.Status.Credential.Version, h.eventReasons())
	}
	if rc.Status.Rollout == nil || rc.Status.Rollout.TargetVersion != rc.Status.Credential.Version {
		t.Errorf("rollout %+v: want one to %s, waiting for the consumer", rc.Status.Rollout, rc.Status.Credential.Version)
	}
}

// Defect: one Degraded condition was fought over by several reasons; an invalid schedule and a
// failing revocation alternated. Each concern has its condition now, and Degraded sums them up.
func TestTwoProblemsAreBothReportedAndNeitherFlaps(t *testing.T) {
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) { rc.Spec.Rotation.Schedule = "61 * * * *" }))
	h.settle(t)
	h.vault.SetFailure(vaulttest.OpRevoke, vaulttest.Err(vaulttest.OpRevoke, vault.ClassUnavailable))
	rc := h.get(t)
	if err := h.k8s.Delete(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, _ = h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rc)})
	}
	first := condition(h.get(t), v1beta1.ConditionDegraded)

	_, _ = h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rc)})
	rc = h.get(t)

	d := condition(rc, v1beta1.ConditionDegraded)
	if d == nil || d.Status != metav1.ConditionTrue || d.Reason != v1beta1.ReasonRevocationPending ||
		!strings.Contains(d.Message, "not revoked") || !strings.Contains(d.Message, "spec.rotation") {
		t.Fatalf("Degraded %+v: want RevocationPending first, both problems in the message", d)
	}
	if !d.LastTransitionTime.Equal(&first.LastTransitionTime) || d.Message != first.Message {
		t.Errorf("Degraded changed between two reconciles with the same problems: %+v, then %+v", first, d)
	}
	for _, c := range []string{v1beta1.ConditionScheduleValid, v1beta1.ConditionLeasesRevoked} {
		if cond := condition(rc, c); cond == nil || cond.Status != metav1.ConditionFalse {
			t.Errorf("%s %+v, want False", c, cond)
		}
	}
	if len(rc.Finalizers) != 1 {
		t.Errorf("the finalizer went while a lease could not be revoked")
	}
}

func TestSummary(t *testing.T) {
	cond := func(t, status, reason string) metav1.Condition {
		return metav1.Condition{Type: t, Status: metav1.ConditionStatus(status), Reason: reason, Message: reason + " message"}
	}
	creds := cond(v1beta1.ConditionCredentialsReady, "True", v1beta1.ReasonIssued)
	users := cond(v1beta1.ConditionUsersApplied, "True", v1beta1.ReasonApplied)
	cases := map[string]struct {
		conds                    []metav1.Condition
		ready                    int32
		wantReady, wantDegraded  string // reasons
		wantReadyTrue, wantDeg   bool
		wantDegradedMessageParts []string
	}{
		"all well": {conds: []metav1.Condition{creds, users, cond(v1beta1.ConditionScheduleValid, "True", v1beta1.ReasonAvailable)},
			ready: 3, wantReadyTrue: true, wantReady: v1beta1.ReasonAvailable, wantDegraded: v1beta1.ReasonAvailable},
		"pods starting": {conds: []metav1.Condition{creds, users},
			ready: 1, wantReady: v1beta1.ReasonReconciling, wantDegraded: v1beta1.ReasonAvailable},
		"no credential": {conds: []metav1.Condition{cond(v1beta1.ConditionCredentialsReady, "False", v1beta1.ReasonPermissionDenied)},
			ready: 3, wantReady: v1beta1.ReasonPermissionDenied, wantDegraded: v1beta1.ReasonAvailable},
		"nodes being given the users": {conds: []metav1.Condition{creds, cond(v1beta1.ConditionUsersApplied, "False", v1beta1.ReasonApplying)},
			ready: 3, wantReady: v1beta1.ReasonApplying, wantDegraded: v1beta1.ReasonAvailable},
		"a node unreachable": {conds: []metav1.Condition{creds, cond(v1beta1.ConditionUsersApplied, "False", v1beta1.ReasonNodeUnreachable)},
			ready: 3, wantReady: v1beta1.ReasonNodeUnreachable, wantDeg: true, wantDegraded: v1beta1.ReasonNodeUnreachable},
		"two concerns, the most pressing first": {conds: []metav1.Condition{creds, users,
			cond(v1beta1.ConditionScheduleValid, "False", v1beta1.ReasonInvalidSchedule), cond(v1beta1.ConditionRolloutHealthy, "False", v1beta1.ReasonRolloutStalled)},
			ready: 3, wantReadyTrue: true, wantReady: v1beta1.ReasonAvailable, wantDeg: true, wantDegraded: v1beta1.ReasonRolloutStalled,
			wantDegradedMessageParts: []string{"RolloutStalled message", "InvalidSchedule message"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rc := cluster(func(rc *v1beta1.RedisCluster) { rc.Spec.Replicas = 3 })
			rc.Status.Conditions, rc.Status.ReadyReplicas = tc.conds, tc.ready
			s := &credential.Cluster{RC: rc}
			s.Conds.Obj, s.Conds.Conditions = rc, &rc.Status.Conditions

			summarize(s)

			r, d := condition(rc, v1beta1.ConditionReady), condition(rc, v1beta1.ConditionDegraded)
			if (r.Status == metav1.ConditionTrue) != tc.wantReadyTrue || r.Reason != tc.wantReady {
				t.Errorf("Ready %+v", r)
			}
			if (d.Status == metav1.ConditionTrue) != tc.wantDeg || d.Reason != tc.wantDegraded {
				t.Errorf("Degraded %+v", d)
			}
			for _, part := range tc.wantDegradedMessageParts {
				if !strings.Contains(d.Message, part) {
					t.Errorf("Degraded message %q lacks %q", d.Message, part)
				}
			}
		})
	}
}

// One cluster's failures do not delay another's retry: a thousand clusters that each failed
// five times leave a cluster's first retry at backoffBase, and no retry waits past backoffCap.
func TestFailingClustersDoNotDelayAnotherClustersRetry(t *testing.T) {
	rl := failureBackoff()
	for i := range 1000 {
		req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "failing", Name: fmt.Sprint(i)}}
		for range 5 {
			rl.When(req)
		}
	}
	other := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "healthy", Name: "orders"}}
	if d := rl.When(other); d != backoffBase {
		t.Errorf("a healthy cluster's first retry waits %s, want %s", d, backoffBase)
	}
	var last time.Duration
	for range 20 {
		last = rl.When(other)
	}
	if last != backoffCap {
		t.Errorf("after 20 failures a retry waits %s, want the cap %s", last, backoffCap)
	}
}
