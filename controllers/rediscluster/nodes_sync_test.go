package rediscluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/redisnode/redisnodetest"
)

// ground is a cluster of n running Redis nodes: its StatefulSet, the StatefulSet's pods, fake
// Redis nodes that have the admin user, and a syncer of them.
type ground struct {
	rc     *v1beta1.RedisCluster
	in     render.Internal
	redis  *redisnodetest.Fake
	syncer *usersSyncer
	conds  status.Setter
	events *events.FakeRecorder
	clock  *clocktesting.FakeClock
	k8s    client.Client
}

func newGround(t *testing.T, n int, extra ...client.Object) *ground {
	t.Helper()
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "rc-uid", Generation: 1}}
	rc.Spec.Replicas = int32(n)
	rc.Spec.Credentials.ACLRules = []string{"~*", "+@all"}
	sts := render.StatefulSet(rc, "", "probe:v1")
	sts.UID = "sts-uid"
	sts.OwnerReferences = []metav1.OwnerReference{{APIVersion: "keyroll.dev/v1beta1", Kind: "RedisCluster", Name: rc.Name, UID: rc.UID, Controller: ptr.To(true)}}
	sts.Status.CurrentRevision, sts.Status.UpdateRevision = testRevision, testRevision
	sts.CreationTimestamp = metav1.NewTime(stsCreated)
	objs := append([]client.Object{sts}, extra...)
	g := &ground{rc: rc, redis: redisnodetest.New(), events: events.NewFakeRecorder(100), clock: clocktesting.NewFakeClock(time.Now()),
		in: render.Internal{Admin: "admin-password", Replication: "replication-password", Probe: "probe-password"}}
	for i := range n {
		objs = append(objs, redisPod(rc, fmt.Sprintf("orders-%d", i), i, sts))
		g.redis.Restart(addr(i), redisnode.User{Name: render.AdminUser, PasswordHash: render.HashPassword(g.in.Admin)})
	}
	g.k8s = fake.NewClientBuilder().WithObjects(objs...).Build()
	g.syncer = &usersSyncer{Client: g.k8s, Dial: g.redis.Dial, Clock: g.clock, CheckInterval: time.Minute,
		Removed: prometheus.NewCounter(prometheus.CounterOpts{Name: "removed"})}
	g.conds = status.Setter{Obj: rc, Conditions: &rc.Status.Conditions, Recorder: g.events}
	return g
}

// testRevision is the revision of the StatefulSet in these tests, as its status names it.
const testRevision = "orders-5d8f7c9b6"

// stsCreated is when the ground's StatefulSet was created; its pods came a minute later.
var stsCreated = time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)

// redisPod is a pod with the cluster's labels and the StatefulSet's revision, created after
// the StatefulSet and running Redis at the i-th address; owner, when set, is its controller.
func redisPod(rc *v1beta1.RedisCluster, name string, i int, owner *appsv1.StatefulSet) *corev1.Pod {
	labels := render.SelectorLabels(rc)
	labels[appsv1.ControllerRevisionHashLabelKey] = testRevision
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: rc.Namespace, Name: name, UID: types.UID("uid-" + name), Labels: labels,
			CreationTimestamp: metav1.NewTime(stsCreated.Add(time.Minute))},
		Status: corev1.PodStatus{PodIP: fmt.Sprintf("10.0.0.%d", 10+i),
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "redis", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
	}
	return p
}

// want is the cluster's users with cur as the application user.
func (g *ground) want(cur *render.Credential) usersWant {
	app := []render.ACLUser{{Username: cur.Username, PasswordHash: render.HashPassword(cur.Password), Rules: render.AppRules(g.rc)}}
	return usersWant{Users: render.ClusterUsers(g.rc, g.in, app), Confirm: cur, AdminPassword: g.in.Admin}
}

func (g *ground) sync(t *testing.T, want usersWant) (bool, time.Duration) {
	t.Helper()
	done, wait, err := g.syncer.Sync(context.Background(), g.rc, g.conds, want)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return done, wait
}

func (g *ground) usersApplied() *metav1.Condition {
	return meta.FindStatusCondition(g.rc.Status.Conditions, v1beta1.ConditionUsersApplied)
}

func (g *ground) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-g.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A user added outside keyroll on a replica and on the primary, and the default user turned on,
// are found at the next check (not before it: a steady cluster costs no Redis command), reported
// (UsersApplied False, UsersChanged) and removed by the sync that follows, one UnknownUserRemoved
// event and one count each; then UsersApplied is True again.
func TestUnknownUsersAreRemovedAtTheNextCheck(t *testing.T) {
	g := newGround(t, 3)
	cur := render.NewCredential("V_APP", "app")
	want := g.want(&cur)
	if done, wait := g.sync(t, want); !done || wait != time.Minute {
		t.Fatalf("first sync: done %v, next check in %s; want done and a check in a minute", done, wait)
	}
	g.drainEvents()
	g.redis.AddUser(addr(2), redisnode.User{Name: "backdoor", PasswordHash: render.HashPassword("x"), Rules: []string{"+@all"}}, false)
	g.redis.AddUser(addr(0), redisnode.User{Name: "backdoor", PasswordHash: render.HashPassword("x"), Rules: []string{"+@all"}}, false)
	g.redis.AddUser(addr(1), redisnode.User{}, true)

	before := g.redis.Commands
	if done, _ := g.sync(t, want); !done || g.redis.Commands != before {
		t.Fatalf("a sync before the check is due: done %v, %d Redis commands; want done and none", done, g.redis.Commands-before)
	}
	g.clock.Step(time.Minute)
	done, wait := g.sync(t, want)
	c := g.usersApplied()
	if done || wait > time.Second || c.Status != metav1.ConditionFalse || c.Reason != v1beta1.ReasonUsersChanged ||
		!strings.Contains(c.Message, "orders-0 (users backdoor are not the cluster's)") || !strings.Contains(c.Message, "orders-2 (users backdoor") || !strings.Contains(c.Message, "orders-1 (the cluster's users were changed)") {
		t.Fatalf("at the check: done %v, wait %s, UsersApplied %+v; want not done, at once again, UsersChanged naming each node", done, wait, c)
	}
	if done, _ := g.sync(t, want); !done {
		t.Fatalf("the sync after the check is not done: %+v", g.usersApplied())
	}
	for i := range 3 {
		if slices.Contains(g.redis.Users(addr(i)), "backdoor") {
			t.Errorf("orders-%d still has backdoor", i)
		}
		if lines, _ := g.redis.Dial(addr(i), render.AdminUser, g.in.Admin, nil).ACLList(context.Background()); !strings.HasPrefix(lines[0], "user default off") {
			t.Errorf("orders-%d: %s", i, lines[0])
		}
	}
	evs := strings.Join(g.drainEvents(), "\n")
	for _, want := range []string{"UnknownUserRemoved Removed users that are not the cluster's (keyroll owns the users of its Redis nodes): backdoor from pod orders-2; backdoor from pod orders-0",
		"UserRestored Set users changed outside keyroll back to the cluster's: default on pod orders-1 (logged in as keyroll-admin)"} {
		if !strings.Contains(evs, want) {
			t.Errorf("no event %q in:\n%s", want, evs)
		}
	}
	if n := testutil.ToFloat64(g.syncer.Removed); n != 2 {
		t.Errorf("%v users counted removed, want 2", n)
	}
	if c := g.usersApplied(); c.Status != metav1.ConditionTrue {
		t.Errorf("UsersApplied %+v after the repair", c)
	}
}

// keyroll's admin user changed on a node (its password reset, as an application user with ACL
// rights could) is set back through the recovery user, which the event names; a node that
// refuses both is reported AdminLockedOut with what to do.
func TestAdminChangedOnANodeIsSetBackThroughTheRecoveryUser(t *testing.T) {
	g := newGround(t, 2)
	cur := render.NewCredential("V_APP", "app")
	want := g.want(&cur)
	if done, _ := g.sync(t, want); !done {
		t.Fatalf("first sync: %+v", g.usersApplied())
	}
	g.drainEvents()
	g.redis.AddUser(addr(1), redisnode.User{Name: render.AdminUser, PasswordHash: render.HashPassword("taken")}, false)

	g.clock.Step(time.Minute)
	if done, _ := g.sync(t, want); done || !strings.Contains(g.usersApplied().Message, "keyroll-admin refused; keyroll logged in as keyroll-recovery") {
		t.Fatalf("at the check: UsersApplied %+v", g.usersApplied())
	}
	if done, _ := g.sync(t, want); !done {
		t.Fatalf("the repair: UsersApplied %+v", g.usersApplied())
	}
	if !g.redis.Accepts(addr(1), render.AdminUser, g.in.Admin) {
		t.Error("keyroll-admin was not set back on orders-1")
	}
	if evs := strings.Join(g.drainEvents(), "\n"); !strings.Contains(evs, "UserRestored Set users changed outside keyroll back to the cluster's: keyroll-admin on pod orders-1 (logged in as keyroll-recovery)") {
		t.Errorf("events:\n%s", evs)
	}

	for _, u := range []string{render.AdminUser, render.RecoveryUser} {
		g.redis.AddUser(addr(0), redisnode.User{Name: u, PasswordHash: render.HashPassword("taken")}, false)
	}
	g.clock.Step(time.Minute)
	g.sync(t, want)
	if c := g.usersApplied(); c.Reason != v1beta1.ReasonAdminLockedOut || !strings.Contains(c.Message, "kubectl delete pod orders-0") {
		t.Errorf("both administrative users refused: UsersApplied %+v", c)
	}
}

// Only the StatefulSet's own pods are nodes: a pod with the cluster's labels that another
// controller (or none) owns, or that is named beyond the StatefulSet's replicas, or like a
// node but not in its canonical form, gets no Redis command and stays out of status; the nodes
// are synced as if it were not there. Without the cluster's StatefulSet, no pod is a node.
func TestOnlyTheStatefulSetsPodsAreNodes(t *testing.T) {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "rc-uid"}}
	other := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "orders", UID: "other-uid"}}
	own := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "orders", UID: "sts-uid"}}
	lookAlikes := []client.Object{
		redisPod(rc, "lookalike", 5, nil),
		redisPod(rc, "orders-7", 6, other),
		redisPod(rc, "orders-2", 7, own),  // beyond replicas (2)
		redisPod(rc, "orders-01", 8, own), // not an ordinal's canonical form
	}
	g := newGround(t, 2, lookAlikes...)
	cur := render.NewCredential("V_APP", "app")
	if done, _ := g.sync(t, g.want(&cur)); !done {
		t.Fatalf("sync: %+v", g.usersApplied())
	}
	for i := 5; i <= 8; i++ {
		if users := g.redis.Users(addr(i)); users != nil {
			t.Errorf("the look-alike at %s was sent commands (users %v)", addr(i), users)
		}
	}
	var pods []string
	for _, n := range g.rc.Status.Nodes {
		pods = append(pods, n.Pod)
	}
	if !slices.Equal(pods, []string{"orders-0", "orders-1"}) {
		t.Errorf("status.nodes %v", pods)
	}
	m, err := listMembers(context.Background(), g.k8s, g.rc)
	if err != nil || len(m.Pods) != 2 || len(m.LookAlikes) != 4 {
		t.Fatalf("members %d, look-alikes %d, %v", len(m.Pods), len(m.LookAlikes), err)
	}

	if err := g.k8s.Delete(context.Background(), &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}); err != nil {
		t.Fatal(err)
	}
	if m, err := listMembers(context.Background(), g.k8s, g.rc); err != nil || len(m.Pods) != 0 {
		t.Errorf("without the StatefulSet: members %d, %v", len(m.Pods), err)
	}
}

// An application user gone from a node (Vault's plugin deletes it when its lease is revoked) has
// the cluster's lease looked up before the user is put back, so that a revocation is honoured
// rather than undone.
func TestAnApplicationUserGoneAsksForALeaseCheckFirst(t *testing.T) {
	g := newGround(t, 2)
	var asked []types.NamespacedName
	g.syncer.LeaseCheckNow = func(k types.NamespacedName) { asked = append(asked, k) }
	cur := render.NewCredential("V_APP", "app")
	want := g.want(&cur)
	if done, _ := g.sync(t, want); !done {
		t.Fatalf("first sync: %+v", g.usersApplied())
	}
	if err := g.redis.Dial(addr(0), render.AdminUser, g.in.Admin, nil).DelUsers(context.Background(), "V_APP"); err != nil {
		t.Fatal(err)
	}
	g.clock.Step(time.Minute)
	if done, _ := g.sync(t, want); done || len(asked) != 1 || asked[0] != client.ObjectKeyFromObject(g.rc) ||
		!strings.Contains(g.usersApplied().Message, "users V_APP are gone (their lease is looked up before they are put back)") {
		t.Fatalf("at the check: asked %v, UsersApplied %+v", asked, g.usersApplied())
	}
}

// A reconcile that reads the cluster from a cache that has not seen the status the previous one
// wrote takes every node for unconfirmed: it sets no node (which would put back a user Vault's
// plugin deleted meanwhile) and looks again shortly; from the latest version it syncs them.
func TestAStaleClusterSetsNoNode(t *testing.T) {
	g := newGround(t, 2)
	cur := render.NewCredential("V_APP", "app")
	want := g.want(&cur)
	latest := g.rc.DeepCopy()
	latest.ResourceVersion = "8"
	g.rc.ResourceVersion = "7"
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	g.syncer.APIReader = fake.NewClientBuilder().WithScheme(scheme).WithObjects(latest).Build()
	// The fake client counts resourceVersions itself: read back the one it gave the latest version.
	if err := g.syncer.APIReader.Get(context.Background(), client.ObjectKeyFromObject(latest), latest); err != nil {
		t.Fatal(err)
	}
	before := g.redis.Commands
	if done, wait := g.sync(t, want); done || wait != lagWait || g.redis.Commands != before || len(g.rc.Status.Nodes) != 0 {
		t.Fatalf("from a stale cache: done %v, wait %s, %d Redis commands, nodes %+v; want none, again in %s",
			done, wait, g.redis.Commands-before, g.rc.Status.Nodes, lagWait)
	}
	g.rc.ResourceVersion = latest.ResourceVersion
	if done, _ := g.sync(t, want); !done || len(g.rc.Status.Nodes) != 2 {
		t.Fatalf("from the latest version: done %v, nodes %+v", done, g.rc.Status.Nodes)
	}
}
