package nodetrust

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// lookAlike is a pod with rc's Redis pod labels and a container named redis that runs a real
// redis-server anyone may use (the default user, no password): what a namespace member who may
// create pods but not read Secrets could run to be sent keyroll's passwords. Redis itself records
// every connection and command it receives (INFO stats and commandstats) and every failed AUTH
// (ACL LOG).
func lookAlike(rc *v1beta1.RedisCluster, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: rc.Namespace, Name: name, Labels: maps.Clone(render.SelectorLabels(rc))},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](999)},
			Containers: []corev1.Container{{
				Name: "redis", Image: testground.RedisImage,
				Command: []string{"redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no"},
				Ports:   []corev1.ContainerPort{{Name: "redis", ContainerPort: 6379}},
			}},
		},
	}
}

// Twenty pods with the cluster's labels and a redis container, each running a redis-server that
// records what it receives, are sent nothing by keyroll (no connection at all: no AUTH, so no
// password; no ACL SETUSER, so no hash; no REPLICAOF or FAILOVER) through a rotation and several
// checks of the nodes' users; none is made the primary or labelled with a role; each is named in a
// Warning event; status.nodes holds the two nodes only, and status writes go on (the rotation is
// recorded).
func TestLookAlikePodGetsNothing(t *testing.T) {
	ns := fw.Namespace(t, "lookalike")
	vc := fw.VaultConnection(t, "vault-lookalike", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(2))
	cur := fw.WaitReady(t, rc, 3*time.Minute)
	ctx := context.Background()
	const count = 20
	var names []string
	for i := range count {
		p := lookAlike(rc, fmt.Sprintf("cache-fake-%d", i))
		if _, err := fw.Clientset.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, p.Name)
	}
	running := map[string]string{} // pod: address
	framework.Eventually(t, 3*time.Minute, func() string {
		for _, name := range names {
			p, err := fw.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if p.Status.PodIP == "" || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
				return fmt.Sprintf("look-alike %s not running yet: %s", name, fw.PodSummary(ns))
			}
			running[name] = framework.PodAddr(p)
		}
		return ""
	})

	from := cur.Status.Credential.Version
	fw.RotateNow(t, rc)
	framework.Eventually(t, 3*time.Minute, func() string {
		got := fw.Get(t, rc)
		if c := got.Status.Credential; c == nil || c.Version == from || got.Status.Rollout != nil || len(got.Status.Leases) != 1 {
			return fmt.Sprintf("rotation not done: credential %+v, rollout %+v", got.Status.Credential, got.Status.Rollout)
		}
		return ""
	})
	time.Sleep(2 * usersCheckInterval) // two checks of the nodes' users at least

	got := fw.Get(t, rc)
	if len(got.Status.Nodes) != 2 || got.Status.Primary == "" || strings.Contains(got.Status.Primary, "fake") {
		t.Errorf("status.nodes %+v, primary %q: want the two nodes only, and one of them the primary", got.Status.Nodes, got.Status.Primary)
	}
	if u := framework.Condition(got, v1beta1.ConditionUsersApplied); u == nil || u.Status != metav1.ConditionTrue || !strings.Contains(u.Message, "All 2 Redis nodes") {
		t.Errorf("UsersApplied %+v", u)
	}
	for name, addr := range running {
		c := framework.RedisClient(addr, "", "")
		stats, err := c.Info(ctx, "stats", "commandstats").Result()
		aclLog, logErr := c.Do(ctx, "ACL", "LOG").Slice()
		_ = c.Close()
		if err != nil || logErr != nil {
			t.Fatalf("reading what %s received: %v, %v", name, err, logErr)
		}
		f := redisnode.InfoFields(stats)
		// This test's connection: go-redis's HELLO on connecting (INFO counts itself only after
		// it has answered).
		var cmds []string
		for k := range f {
			if strings.HasPrefix(k, "cmdstat_") && k != "cmdstat_hello" {
				cmds = append(cmds, k)
			}
		}
		if f["total_connections_received"] != "1" || len(cmds) != 0 || len(aclLog) != 0 {
			t.Errorf("look-alike %s received %s connections (this test's one only expected), commands %v besides this test's, failed logins %v", name, f["total_connections_received"], cmds, aclLog)
		}
		p, err := fw.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if role, ok := p.Labels[v1beta1.LabelRole]; ok {
			t.Errorf("look-alike %s was labelled %s=%s", name, v1beta1.LabelRole, role)
		}
	}
	framework.Eventually(t, 10*time.Second, func() string {
		evs := framework.Warnings(fw.ClusterEvents(t, ns, rc.Name))
		for _, name := range names {
			if len(framework.Naming(evs, "Pod "+name+" carries")) == 0 {
				return fmt.Sprintf("no Warning event names look-alike %s: %v", name, framework.Notes(evs))
			}
		}
		return ""
	})
}
