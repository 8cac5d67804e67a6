package rediscluster

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/redisnode"
)

// setUser is one ACL SETUSER a node took, and whether the aclfile had that user, with the same
// password hash and rules, at that moment.
type setUser struct {
	addr, name string
	inFile     bool
}

// The aclfile is what a Redis pod that restarts meanwhile starts with: every user is in it before
// any node gets the user by ACL SETUSER, for the first credential and for a rotation's.
func TestACLFileHoldsEveryUserBeforeAnyNodeGetsIt(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	var calls []setUser
	h.redis.BeforeSetUser = func(addr string, u redisnode.User) {
		file := render.ParseACLUsers(string(h.secret(t, "orders-acl").Data[render.ACLFileKey]))
		f, ok := file[u.Name]
		calls = append(calls, setUser{addr, u.Name, ok && f.PasswordHash == u.PasswordHash && slices.Equal(f.Rules, u.Rules)})
	}
	rc := h.settle(t)
	first := h.staged(t)
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	cur := h.staged(t)
	if cur.Username == first.Username {
		t.Fatal("no rotation")
	}

	for _, c := range calls {
		if !c.inFile {
			t.Errorf("node %s got user %s by ACL SETUSER before the aclfile had it", c.addr, c.name)
		}
	}
	for _, user := range []string{first.Username, cur.Username} {
		i := slices.IndexFunc(calls, func(c setUser) bool { return c.name == user })
		if i < 0 || calls[i].addr != nodeAddr(2) {
			t.Errorf("user %s: want it set first on orders-2 (the highest replica), calls %+v", user, calls)
		}
	}
}

// A node that takes ACL SETUSER but does not let the new user log in has not accepted it: the
// consumers' Secret keeps the old credential, and the nodes after it are not changed, until it
// does.
func TestANodeThatRefusesTheNewUsersLoginBlocksTheConsumers(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	old := h.staged(t)
	h.redis.RefusesLogin[nodeAddr(1)] = true
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}

	rc = h.settle(t)

	cur := h.staged(t)
	if cur.Username == old.Username {
		t.Fatal("no new credential was issued")
	}
	if !h.redis.Accepts(nodeAddr(1), cur.Username, cur.Password) {
		t.Fatal("orders-1 did not get the new user: the test does not test a refused login")
	}
	if got := string(h.secret(t, "orders-credentials").Data["username"]); got != old.Username {
		t.Errorf("the consumers' Secret has user %s, want the old %s while orders-1 refuses the new one", got, old.Username)
	}
	if h.redis.Accepts(nodeAddr(0), cur.Username, cur.Password) {
		t.Error("orders-0 got the new user although orders-1, before it, had not accepted it")
	}
	c := condition(rc, v1beta1.ConditionUsersApplied)
	if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "orders-1") || !strings.Contains(c.Message, cur.Username) {
		t.Errorf("UsersApplied %+v: want False naming orders-1 and the user it refuses", c)
	}

	delete(h.redis.RefusesLogin, nodeAddr(1))
	h.settle(t)
	if got := string(h.secret(t, "orders-credentials").Data["username"]); got != cur.Username {
		t.Errorf("once orders-1 accepts the new user the consumers' Secret has %s, want %s", got, cur.Username)
	}
}

// aclRules changed on a live cluster to rules Redis refuses are reported, and change nothing: no
// node's users, not the aclfile, not the consumers' Secret.
func TestInvalidACLRulesOnALiveClusterLeaveTheNodesAndTheACLFile(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ACLRules = []string{"~app:*", "+@read", "+@write"}
	}))
	rc := h.settle(t)
	acl, creds := h.secret(t, "orders-acl"), h.secret(t, "orders-credentials")
	var nodes []map[string]redisnode.User
	for i := range 3 {
		nodes = append(nodes, h.redis.UserSet(nodeAddr(i)))
	}
	app := nodes[0][h.staged(t).Username]
	if !slices.Contains(app.Rules, "+@write") {
		t.Fatalf("the app user has rules %v before the change: want the valid rules applied", app.Rules)
	}

	h.redis.Refused["+@nosuchcategory"] = "Unknown command or category name in ACL"
	rc.Spec.Credentials.ACLRules = []string{"~app:*", "+@read", "+@nosuchcategory"}
	rc.Generation++
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)

	if c := condition(rc, v1beta1.ConditionUsersApplied); c == nil || c.Reason != v1beta1.ReasonInvalidACLRules || !strings.Contains(c.Message, "+@nosuchcategory") {
		t.Errorf("UsersApplied %+v: want InvalidACLRules naming the rule", c)
	}
	for i := range 3 {
		if got := h.redis.UserSet(nodeAddr(i)); !maps.EqualFunc(got, nodes[i], sameUser) {
			t.Errorf("node %d's users changed: before %v, after %v", i, nodes[i], got)
		}
	}
	after := h.secret(t, "orders-acl")
	if !bytes.Equal(after.Data[render.ACLFileKey], acl.Data[render.ACLFileKey]) ||
		after.Annotations[render.AnnotationRulesAccepted] != acl.Annotations[render.AnnotationRulesAccepted] {
		t.Errorf("the aclfile changed:\n%s\nwas\n%s", after.Data[render.ACLFileKey], acl.Data[render.ACLFileKey])
	}
	if !maps.EqualFunc(h.secret(t, "orders-credentials").Data, creds.Data, bytes.Equal) {
		t.Error("the consumers' Secret changed")
	}
}

func sameUser(a, b redisnode.User) bool {
	return a.Name == b.Name && a.PasswordHash == b.PasswordHash && slices.Equal(a.Rules, b.Rules)
}
