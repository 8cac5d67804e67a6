package dataplane

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

var hardened = []string{"~app:*", "+@read", "+@write", "-@dangerous"}

// The common hardening, no dangerous commands for the app user, breaks neither replication (the
// replicas authenticate as keyroll's replication user) nor readiness (the probe has its own user),
// and a rotation works with it.
func TestHardenedACLRulesKeepReplicationAndReadiness(t *testing.T) {
	ns := fw.Namespace(t, "hardened")
	vc := fw.VaultConnection(t, "vault-hardened", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("hardened"), framework.Replicas(3), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ACLRules = hardened
	})
	fw.WaitReady(t, rc, 3*time.Minute)
	pods := fw.RedisPods(t, rc)
	admin := fw.AdminPassword(rc)
	for _, p := range pods[1:] {
		n := node(framework.PodAddr(&p), admin)
		st, err := n.Replication(context.Background())
		n.Close()
		if err != nil || !st.LinkUp || st.SyncInProgress {
			t.Errorf("replica %s: %+v, %v", p.Name, st, err)
		}
	}
	user, pass, _ := fw.Credentials(rc)
	// The test's own client closes before the rotation: a client still logged in with the old user
	// would hold its retirement (rollout.unlistedClients).
	c := framework.RedisClient(framework.PodAddr(&pods[0]), user, pass)
	ctx := context.Background()
	if err := c.Set(ctx, "app:1", "v", 0).Err(); err != nil {
		t.Fatalf("the app user writes app:1: %v", err)
	}
	for _, cmd := range [][]any{{"SET", "other:1", "v"}, {"INFO"}, {"CONFIG", "GET", "*"}} {
		if err := c.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("the hardened app user may run %v: %v", cmd, err)
		}
	}
	framework.Eventually(t, 10*time.Second, func() string {
		r := framework.RedisClient(framework.PodAddr(&pods[2]), user, pass)
		defer r.Close()
		if v, err := r.Get(ctx, "app:1").Result(); err != nil || v != "v" {
			return fmt.Sprintf("app:1 on the replica: %q, %v", v, err)
		}
		return ""
	})

	_ = c.Close()
	from := fw.Get(t, rc).Status.Credential.Version
	fw.RotateNow(t, rc)
	framework.Eventually(t, 3*time.Minute, func() string { return rotated(t, rc, from) })
	newUser, newPass, _ := fw.Credentials(rc)
	for _, p := range fw.RedisPods(t, rc) {
		if !accepts(framework.PodAddr(&p), newUser, newPass) || accepts(framework.PodAddr(&p), user, pass) {
			t.Errorf("after the rotation, pod %s: new user accepted %v, old user accepted %v", p.Name, accepts(framework.PodAddr(&p), newUser, newPass), accepts(framework.PodAddr(&p), user, pass))
		}
	}
	if got := runs(fw.RedisPods(t, rc)); fmt.Sprint(got) != fmt.Sprint(runs(pods)) {
		t.Errorf("Redis pods restarted: %v, then %v", runs(pods), got)
	}
}

// A category Redis does not know is reported on the RedisCluster with Redis's own words and the
// rule named; nothing is applied (no app user on the nodes, no consumers' Secret), and no pod
// crash-loops on its aclfile.
func TestUnknownACLRuleIsReported(t *testing.T) {
	ns := fw.Namespace(t, "unknown")
	vc := fw.VaultConnection(t, "vault-unknown", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(2), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ACLRules = []string{"~*", "+@read", "+@nosuchcategory"}
	})
	var cond *metav1.Condition
	framework.Eventually(t, 3*time.Minute, func() string {
		cond = framework.Condition(fw.Get(t, rc), v1beta1.ConditionUsersApplied)
		if cond == nil || cond.Reason != v1beta1.ReasonInvalidACLRules {
			return fmt.Sprintf("UsersApplied %+v", cond)
		}
		return ""
	})
	t.Logf("UsersApplied: %s", cond.Message)
	if !strings.Contains(cond.Message, "+@nosuchcategory") || !strings.Contains(cond.Message, "Unknown command or category name in ACL") {
		t.Errorf("the condition does not name the rule with Redis's words: %s", cond.Message)
	}
	if d := framework.Condition(fw.Get(t, rc), v1beta1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue || d.Reason != v1beta1.ReasonInvalidACLRules {
		t.Errorf("Degraded %+v", d)
	}
	if _, _, ok := fw.Credentials(rc); ok {
		t.Error("a consumers' Secret was written")
	}
	// The pods come up, run on and stay Ready: watched for longer than a crash loop would take
	// to show.
	framework.Eventually(t, 2*time.Minute, func() string {
		pods := fw.RedisPods(t, rc)
		if len(pods) != 2 || !framework.PodReady(&pods[0]) || !framework.PodReady(&pods[1]) {
			return fmt.Sprintf("%d pods, not all Ready", len(pods))
		}
		return ""
	})
	deadline := time.Now().Add(15 * time.Second)
	first := runs(fw.RedisPods(t, rc))
	for time.Now().Before(deadline) {
		pods := fw.RedisPods(t, rc)
		for _, p := range pods {
			if !framework.PodReady(&p) {
				t.Fatalf("pod %s is not Ready: %+v", p.Name, p.Status.ContainerStatuses)
			}
		}
		if got := runs(pods); fmt.Sprint(got) != fmt.Sprint(first) || len(pods) != 2 {
			t.Fatalf("pods restarted: %v, then %v", first, got)
		}
		time.Sleep(time.Second)
	}
	user, _ := staged(t, rc)
	admin := fw.AdminPassword(rc)
	for _, p := range fw.RedisPods(t, rc) {
		n := node(framework.PodAddr(&p), admin)
		users, err := n.Users(context.Background())
		n.Close()
		if err != nil || strings.Contains(strings.Join(users, " "), user) {
			t.Errorf("pod %s has users %v (%v): the app user must not be applied", p.Name, users, err)
		}
	}
}
