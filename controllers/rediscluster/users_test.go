package rediscluster

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/vault/vaulttest"
)

func threeNodes(rc *v1beta1.RedisCluster) { rc.Spec.Replicas = 3 }

func (h *harness) secret(t *testing.T, name string) *corev1.Secret {
	t.Helper()
	sec := &corev1.Secret{}
	err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, sec)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

func (h *harness) staged(t *testing.T) render.Credential {
	t.Helper()
	st := h.secret(t, "orders-keyroll")
	return render.NewCredential(string(st.Data["username"]), string(st.Data["password"]))
}

func TestCredentialReachesConsumersOnlyOnceEveryNodeAcceptsIt(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	h.redis.Unreachable[nodeAddr(0)] = true // the primary, synced last

	rc := h.settle(t)

	if sec := h.secret(t, "orders-credentials"); sec != nil {
		t.Fatal("the credentials Secret was written while a node had not accepted the credential")
	}
	cred := h.staged(t)
	for i := 1; i < 3; i++ {
		if !h.redis.Accepts(nodeAddr(i), cred.Username, cred.Password) {
			t.Errorf("replica %d does not have the issued user", i)
		}
	}
	c := condition(rc, v1beta1.ConditionUsersApplied)
	if c == nil || c.Reason != v1beta1.ReasonNodeUnreachable || !strings.Contains(c.Message, "orders-0") || !strings.Contains(c.Message, "port 6379") {
		t.Fatalf("UsersApplied %+v: want NodeUnreachable naming the pod and the port", c)
	}
	if d := condition(rc, v1beta1.ConditionDegraded); d.Status != metav1.ConditionTrue || d.Reason != v1beta1.ReasonNodeUnreachable {
		t.Errorf("Degraded %+v", d)
	}

	delete(h.redis.Unreachable, nodeAddr(0))
	rc = h.settle(t)

	sec := h.secret(t, "orders-credentials")
	if sec == nil || string(sec.Data["username"]) != cred.Username || !h.redis.Accepts(nodeAddr(0), cred.Username, cred.Password) {
		t.Fatalf("once the primary is reachable: Secret %v, primary has the user: %v", sec != nil, h.redis.Accepts(nodeAddr(0), cred.Username, cred.Password))
	}
	if c := condition(rc, v1beta1.ConditionUsersApplied); c.Status != metav1.ConditionTrue || len(rc.Status.Nodes) != 3 {
		t.Errorf("UsersApplied %+v, nodes %+v", c, rc.Status.Nodes)
	}
	if n := h.vault.Calls(vaulttest.OpIssue); n != 1 {
		t.Errorf("%d issues: the credential waits for the nodes, it is not issued again", n)
	}
}

func TestNoPodMountsTheCredentialAndTheAdminPasswordStaysWithKeyroll(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	h.settle(t)
	acl := h.secret(t, "orders-acl")
	admin := string(h.secret(t, "orders-keyroll").Data["admin-password"])
	if admin == "" || len(acl.Data["replication-password"]) == 0 || len(acl.Data["probe-password"]) == 0 {
		t.Fatal("an internal password is missing")
	}
	for k, v := range acl.Data {
		if strings.Contains(string(v), admin) {
			t.Errorf("the ACL Secret, which pods mount, holds the admin password under %s", k)
		}
	}
	users := render.ParseACLUsers(string(acl.Data[render.ACLFileKey]))
	for _, u := range []string{render.AdminUser, render.ReplicationUser, render.ProbeUser, h.staged(t).Username} {
		if _, ok := users[u]; !ok {
			t.Errorf("the aclfile has no user %s", u)
		}
	}
	if !slices.Contains(users[render.ReplicationUser].Rules, "+psync") || slices.Contains(users[render.ReplicationUser].Rules, "+@all") {
		t.Errorf("replication user's rules %v", users[render.ReplicationUser].Rules)
	}
}

func TestRefusedACLRuleIsReportedAndNothingIsApplied(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ACLRules = []string{"~app:*", "+@read", "+@nosuchcategory"}
	}))
	h.redis.Refused["+@nosuchcategory"] = "Unknown command or category name in ACL"

	rc := h.settle(t)

	c := condition(rc, v1beta1.ConditionUsersApplied)
	if c == nil || c.Reason != v1beta1.ReasonInvalidACLRules || !strings.Contains(c.Message, "+@nosuchcategory") || !strings.Contains(c.Message, "Unknown command or category") {
		t.Fatalf("UsersApplied %+v: want InvalidACLRules naming the rule with Redis's words", c)
	}
	if h.secret(t, "orders-credentials") != nil {
		t.Error("a credentials Secret was written")
	}
	users := render.ParseACLUsers(string(h.secret(t, "orders-acl").Data[render.ACLFileKey]))
	if _, ok := users[h.staged(t).Username]; ok || len(users) != 4 {
		t.Errorf("the aclfile has users %v: want keyroll's four only", users)
	}
	if got := h.redis.Users(nodeAddr(1)); slices.Contains(got, h.staged(t).Username) {
		t.Errorf("a node has the app user: %v", got)
	}
	if !strings.Contains(strings.Join(h.eventReasons(), " "), v1beta1.ReasonInvalidACLRules) {
		t.Error("no InvalidACLRules event")
	}

	rc.Spec.Credentials.ACLRules = []string{"~app:*", "+@read"}
	rc.Generation++
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	if h.secret(t, "orders-credentials") == nil {
		t.Error("no credentials Secret once the rules are fixed")
	}
}

func TestRotationRetiresTheOldUserFromEveryNode(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	old := h.staged(t)
	before := h.redis.Commands

	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)

	cur := h.staged(t)
	if cur.Username == old.Username {
		t.Fatal("no rotation")
	}
	for i := range 3 {
		if h.redis.Accepts(nodeAddr(i), old.Username, old.Password) || !h.redis.Accepts(nodeAddr(i), cur.Username, cur.Password) {
			t.Errorf("node %d: users %v; want the new user and not the old", i, h.redis.Users(nodeAddr(i)))
		}
	}
	if len(rc.Status.RetiringUsers) != 0 || len(rc.Status.Leases) != 1 || h.vault.Calls(vaulttest.OpRevoke) != 1 {
		t.Errorf("retiring %v, ledger %+v, %d revocations", rc.Status.RetiringUsers, rc.Status.Leases, h.vault.Calls(vaulttest.OpRevoke))
	}
	if users := render.ParseACLUsers(string(h.secret(t, "orders-acl").Data[render.ACLFileKey])); users[old.Username].Username != "" {
		t.Error("the old user is still in the aclfile")
	}
	if h.redis.Commands == before {
		t.Error("no Redis command for a rotation")
	}

	steady := h.redis.Commands
	h.reconcile(t)
	if h.redis.Commands != steady {
		t.Errorf("a steady cluster sent %d Redis commands", h.redis.Commands-steady)
	}
}

func TestRestartedRedisIsConfirmedAgainAndForgetsUsersItShouldNotHave(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	h.settle(t)
	cur := h.staged(t)
	// Redis on pod 1 restarted from an old aclfile: the admin user and a user since retired, not
	// the current one.
	admin := string(h.secret(t, "orders-keyroll").Data["admin-password"])
	h.redis.Restart(nodeAddr(1), redisnode.User{Name: render.AdminUser, PasswordHash: render.HashPassword(admin)},
		redisnode.User{Name: "V_OLD_USER", PasswordHash: render.HashPassword("x")})
	pod := &corev1.Pod{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-1"}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.NewTime(epoch.Add(3600e9))
	if err := h.k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}

	h.settle(t)

	got := h.redis.Users(nodeAddr(1))
	if slices.Contains(got, "V_OLD_USER") || !h.redis.Accepts(nodeAddr(1), cur.Username, cur.Password) {
		t.Errorf("restarted node's users %v: want the current user and not the stale one", got)
	}
}

// Defect: with rollout.redisPods Restart a new cluster restarted every Redis pod (and then its
// consumers) right after they had started: the pods come before the credential, so none had its
// version, and the first credential rolled out as if it replaced one. Nothing was replaced: the
// pods got the first user live, as in Live mode. A rotation then restarts them, replicas first.
func TestRestartModeRestartsNoPodForTheFirstCredentialButForARotation(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, func(rc *v1beta1.RedisCluster) { rc.Spec.Rollout.RedisPods = v1beta1.RedisPodsRestart }))
	rc := h.settle(t)

	cred := h.staged(t)
	for i := range 3 {
		if !h.redis.Accepts(nodeAddr(i), cred.Username, cred.Password) {
			t.Errorf("node %d does not have the first user", i)
		}
	}
	pods := &corev1.PodList{}
	if err := h.k8s.List(context.Background(), pods, client.InNamespace("shop")); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 3 {
		t.Errorf("%d Redis pods left after the first credential, want the 3 that ran", len(pods.Items))
	}
	reasons := h.eventReasons()
	for _, r := range []string{v1beta1.EventRotationStarted, v1beta1.EventPodRestarted} {
		if slices.Contains(reasons, r) {
			t.Errorf("a %s event for the first credential (events %v)", r, reasons)
		}
	}
	if rc.Status.Rollout != nil || h.secret(t, "orders-credentials") == nil {
		t.Fatalf("rollout %+v, consumers' Secret written %v: want no rollout and the Secret", rc.Status.Rollout, h.secret(t, "orders-credentials") != nil)
	}

	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	if reasons := h.eventReasons(); !slices.Contains(reasons, v1beta1.EventPodRestarted) {
		t.Errorf("a rotation restarted no Redis pod (events %v)", reasons)
	}
	err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-2"}, &corev1.Pod{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the rotation did not restart the highest replica first: orders-2 is still there (%v)", err)
	}
}

// Defect: a Redis pod whose container had just started, before Redis took connections, was
// reported NodeUnreachable (with a warning event and a hint at NetworkPolicy, Degraded True) at
// every creation and restart of a pod. A pod that is not Ready yet is waited for instead, as one
// whose Redis does not run, until readinessTimeout; a Ready pod that refuses is unreachable.
func TestStartingRedisIsWaitedForNotReportedUnreachable(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	pod := &corev1.Pod{}
	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-1"}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(epoch)}}
	if err := h.k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	h.redis.Unreachable[nodeAddr(1)] = true

	rc := h.settle(t)

	if c := condition(rc, v1beta1.ConditionUsersApplied); c == nil || c.Reason != v1beta1.ReasonApplying || !strings.Contains(c.Message, "orders-1") {
		t.Errorf("UsersApplied %+v while orders-1 starts: want Applying, waiting for it", c)
	}
	if d := condition(rc, v1beta1.ConditionDegraded); d.Status != metav1.ConditionFalse {
		t.Errorf("Degraded %+v while a Redis starts", d)
	}
	if reasons := h.eventReasons(); slices.Contains(reasons, v1beta1.ReasonNodeUnreachable) {
		t.Errorf("a NodeUnreachable event for a Redis that starts: %v", reasons)
	}

	h.clock.Step(6 * time.Minute) // past readinessTimeout (5m)
	rc = h.settle(t)
	if c := condition(rc, v1beta1.ConditionUsersApplied); c.Reason != v1beta1.ReasonNodeNotReady {
		t.Errorf("UsersApplied %+v once orders-1 has not run Redis for longer than readinessTimeout: want NodeNotReady", c)
	}

	if err := h.k8s.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-1"}, pod); err != nil {
		t.Fatal(err) // keyroll has labelled it meanwhile
	}
	pod.Status.Conditions[0] = corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(h.clock.Now())}
	if err := h.k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	if c := condition(rc, v1beta1.ConditionUsersApplied); c.Reason != v1beta1.ReasonNodeUnreachable {
		t.Errorf("UsersApplied %+v for a Ready pod that refuses connections: want NodeUnreachable", c)
	}
}

// Defect, seen in a fresh-clone run: a reconcile that started from a stale cache confirmed every
// node on the rotation's credential, recorded UsersApplied, and lost its status write to a
// conflict; the next reconcile found the same change and recorded it again: two UsersApplied
// events for one rotation. Events about a status change are recorded once that status is
// written.
func TestAStatusWriteLostToAConflictAnnouncesNothing(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	old := h.staged(t)
	h.eventReasons()

	appliedTo := regexp.MustCompile(`each accepts credential \S+ \(user ([^)]+)\)`)
	conflicted := false
	conflicting := interceptor.NewClient(h.k8s.(client.WithWatch), interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, s string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			data, err := p.Data(o)
			if err != nil {
				return err
			}
			if m := appliedTo.FindSubmatch(data); !conflicted && m != nil && string(m[1]) != old.Username {
				conflicted = true
				return apierrors.NewConflict(v1beta1.GroupVersion.WithResource("redisclusters").GroupResource(), o.GetName(), errors.New("the object has been modified"))
			}
			return c.SubResource(s).Patch(ctx, o, p, opts...)
		},
	})
	h.r = h.r.WithClient(conflicting)
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.settle(t)

	if !conflicted {
		t.Fatal("no status write carrying the new credential's UsersApplied was made")
	}
	reasons := h.eventReasons()
	if n := countOf(reasons, v1beta1.EventUsersApplied); n != 1 {
		t.Errorf("%d UsersApplied events for one rotation, want 1: %v", n, reasons)
	}
	for _, e := range []string{v1beta1.EventCredentialsIssued, v1beta1.EventRotationStarted, v1beta1.EventRotationFinished, v1beta1.EventUsersRetired, v1beta1.EventLeaseRevoked} {
		if n := countOf(reasons, e); n != 1 {
			t.Errorf("%d %s events for one rotation, want 1: %v", n, e, reasons)
		}
	}
}

func countOf(s []string, v string) int {
	n := 0
	for _, e := range s {
		if e == v {
			n++
		}
	}
	return n
}

// The Secret that vaultPlugin.passwordSecretRef names is used only when it is labelled for this
// cluster's plugin user: another Secret of the namespace is never hashed into the aclfile.
func TestPluginPasswordSecretMustBeLabelledForTheCluster(t *testing.T) {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "app-secrets"},
		Data: map[string][]byte{"password": []byte("a-password-of-another-app")}}
	h := newHarness(t, cluster(threeNodes, func(rc *v1beta1.RedisCluster) {
		rc.Spec.VaultPlugin = &v1beta1.VaultPluginSpec{Username: "vault",
			PasswordSecretRef: &v1beta1.LocalSecretKeyReference{Name: "app-secrets", Key: "password"}}
	}), sec)

	rc := h.settle(t)
	c := condition(rc, v1beta1.ConditionUsersApplied)
	if c == nil || c.Reason != v1beta1.ReasonSecretNotLabelled || !strings.Contains(c.Message, v1beta1.LabelVaultPluginPassword+"=orders") {
		t.Fatalf("UsersApplied %+v: want %s naming the label", c, v1beta1.ReasonSecretNotLabelled)
	}
	acl := ""
	if s := h.secret(t, "orders-acl"); s != nil {
		acl = string(s.Data[render.ACLFileKey])
	}
	if _, ok := render.ParseACLUsers(acl)["vault"]; ok || strings.Contains(acl, render.HashPassword("a-password-of-another-app")) {
		t.Fatal("the unlabelled Secret's password reached the aclfile")
	}

	sec.Labels = map[string]string{v1beta1.LabelVaultPluginPassword: "orders"}
	if err := h.k8s.Update(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	users := render.ParseACLUsers(string(h.secret(t, "orders-acl").Data[render.ACLFileKey]))
	if u, ok := users["vault"]; !ok || u.PasswordHash != render.HashPassword("a-password-of-another-app") {
		t.Fatalf("the labelled Secret's password is not the plugin user's: %+v", users["vault"])
	}
}
