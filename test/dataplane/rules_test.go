package dataplane

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

var hardened = []string{"~app:*", "+@read", "+@write", "-@dangerous"}

// The common hardening, no dangerous commands for the app user, breaks neither replication (the
// replicas authenticate as keyroll's replication user) nor readiness (the probe has its own user),
// and a rotation works with it.
func TestHardenedACLRulesKeepReplicationAndReadiness(t *testing.T) {
	namespace(t, "hardened")
	vaultConnection(t, "vault-hardened", "hardened")
	rc := redisCluster(t, "hardened", "cache", "vault-hardened", "database/creds/hardened", 3, func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Credentials.ACLRules = hardened
	})
	waitReady(t, rc, 3*time.Minute)
	pods := redisPods(t, rc)
	admin := adminPassword(t, rc)
	for _, p := range pods[1:] {
		n := node(podAddr(p), admin)
		st, err := n.Replication(context.Background())
		n.Close()
		if err != nil || !st.LinkUp || st.SyncInProgress {
			t.Errorf("replica %s: %+v, %v", p.Name, st, err)
		}
	}
	user, pass := published(t, rc)
	c := appClient(podAddr(pods[0]), user, pass)
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "app:1", "v", 0).Err(); err != nil {
		t.Fatalf("the app user writes app:1: %v", err)
	}
	for _, cmd := range [][]any{{"SET", "other:1", "v"}, {"INFO"}, {"CONFIG", "GET", "*"}} {
		if err := c.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("the hardened app user may run %v: %v", cmd, err)
		}
	}
	eventually(t, 10*time.Second, func() string {
		r := appClient(podAddr(pods[2]), user, pass)
		defer r.Close()
		if v, err := r.Get(ctx, "app:1").Result(); err != nil || v != "v" {
			return fmt.Sprintf("app:1 on the replica: %q, %v", v, err)
		}
		return ""
	})

	from := get(t, rc).Status.Credential.Version
	rotateNow(t, rc, "hardened-1")
	eventually(t, 3*time.Minute, func() string { return rotated(t, rc, from) })
	newUser, newPass := published(t, rc)
	for _, p := range redisPods(t, rc) {
		if !accepts(podAddr(p), newUser, newPass) || accepts(podAddr(p), user, pass) {
			t.Errorf("after the rotation, pod %s: new user accepted %v, old user accepted %v", p.Name, accepts(podAddr(p), newUser, newPass), accepts(podAddr(p), user, pass))
		}
	}
	if got := runs(redisPods(t, rc)); fmt.Sprint(got) != fmt.Sprint(runs(pods)) {
		t.Errorf("Redis pods restarted: %v, then %v", runs(pods), got)
	}
}

// A category Redis does not know is reported on the RedisCluster with Redis's own words and the
// rule named; nothing is applied (no app user on the nodes, no consumers' Secret), and no pod
// crash-loops on its aclfile.
func TestUnknownACLRuleIsReported(t *testing.T) {
	namespace(t, "unknown")
	vaultConnection(t, "vault-unknown", "unknown")
	rc := redisCluster(t, "unknown", "cache", "vault-unknown", "database/creds/orders", 2, func(rc *v1alpha1.RedisCluster) {
		rc.Spec.Credentials.ACLRules = []string{"~*", "+@read", "+@nosuchcategory"}
	})
	var cond *metav1.Condition
	eventually(t, 3*time.Minute, func() string {
		cond = condition(get(t, rc), v1alpha1.ConditionUsersApplied)
		if cond == nil || cond.Reason != v1alpha1.ReasonInvalidACLRules {
			return fmt.Sprintf("UsersApplied %+v", cond)
		}
		return ""
	})
	t.Logf("UsersApplied: %s", cond.Message)
	if !strings.Contains(cond.Message, "+@nosuchcategory") || !strings.Contains(cond.Message, "Unknown command or category name in ACL") {
		t.Errorf("the condition does not name the rule with Redis's words: %s", cond.Message)
	}
	if d := condition(get(t, rc), v1alpha1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue || d.Reason != v1alpha1.ReasonInvalidACLRules {
		t.Errorf("Degraded %+v", d)
	}
	if user, _ := published(t, rc); user != "" {
		t.Error("a consumers' Secret was written")
	}
	// The pods come up, run on and stay Ready: watched for longer than a crash loop would take
	// to show.
	eventually(t, 2*time.Minute, func() string {
		pods := redisPods(t, rc)
		if len(pods) != 2 || !podReady(pods[0]) || !podReady(pods[1]) {
			return fmt.Sprintf("%d pods, not all Ready", len(pods))
		}
		return ""
	})
	deadline := time.Now().Add(15 * time.Second)
	first := runs(redisPods(t, rc))
	for time.Now().Before(deadline) {
		pods := redisPods(t, rc)
		for _, p := range pods {
			if !podReady(p) {
				t.Fatalf("pod %s is not Ready: %+v", p.Name, p.Status.ContainerStatuses)
			}
		}
		if got := runs(pods); fmt.Sprint(got) != fmt.Sprint(first) || len(pods) != 2 {
			t.Fatalf("pods restarted: %v, then %v", first, got)
		}
		time.Sleep(time.Second)
	}
	user, _ := staged(t, rc)
	admin := adminPassword(t, rc)
	for _, p := range redisPods(t, rc) {
		n := node(podAddr(p), admin)
		users, err := n.Users(context.Background())
		n.Close()
		if err != nil || strings.Contains(strings.Join(users, " "), user) {
			t.Errorf("pod %s has users %v (%v): the app user must not be applied", p.Name, users, err)
		}
	}
}
