package dataplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/redisnode"
	"github.com/keyroll/keyroll/test/framework"
)

// rotated says whether a rotation from version from is over: a new credential on every node, the
// consumers rolled out (their pods on the new credential and the old ones gone), nothing
// superseded left in the ledger or on the nodes.
func rotated(t testing.TB, rc *v1beta1.RedisCluster, from string) string {
	cur := fw.Get(t, rc)
	c := cur.Status.Credential
	switch {
	case c == nil || c.Version == from:
		return "no new credential yet"
	case cur.Status.Rollout != nil:
		return fmt.Sprintf("rollout in progress: %+v", cur.Status.Rollout)
	case len(cur.Status.Leases) != 1 || len(cur.Status.RetiringUsers) > 0:
		return fmt.Sprintf("ledger %+v, retiring users %v", cur.Status.Leases, cur.Status.RetiringUsers)
	}
	if u := framework.Condition(cur, v1beta1.ConditionUsersApplied); u == nil || u.Status != metav1.ConditionTrue {
		return fmt.Sprintf("UsersApplied %+v", u)
	}
	for _, ref := range cur.Spec.Rollout.Consumers {
		d := &appsv1.Deployment{}
		if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: ref.Name}, d); err != nil {
			return err.Error()
		}
		st := d.Status
		if d.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion] != c.Version || st.UpdatedReplicas != *d.Spec.Replicas ||
			st.Replicas != *d.Spec.Replicas || (st.TerminatingReplicas != nil && *st.TerminatingReplicas > 0) {
			return fmt.Sprintf("consumer %s not rolled out: %+v", ref.Name, st)
		}
	}
	return ""
}

// accepts says whether the node at addr lets user log in with pass (one node, at once: the tests
// time when each node starts or stops accepting a user; fw.OnEveryPod checks all of a cluster's).
func accepts(addr, user, pass string) bool { return acceptsTLS(addr, nil, user, pass) }

// acceptsTLS says whether the node at addr lets user log in with pass, over TLS when conf is set.
func acceptsTLS(addr string, conf *tls.Config, user, pass string) bool {
	n := redisnode.New(addr, user, pass, conf)
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := n.Accepts(ctx, user, pass)
	return err == nil && ok
}

// node is a client of one Redis node as keyroll's admin user.
func node(addr, adminPassword string) *redisnode.Client {
	return redisnode.New(addr, "keyroll-admin", adminPassword, nil)
}

// podRun identifies one run of a pod: a restart or a new pod changes it.
type podRun struct {
	uid      types.UID
	restarts int32
}

func runs(pods []corev1.Pod) map[string]podRun {
	out := map[string]podRun{}
	for _, p := range pods {
		r := podRun{uid: p.UID}
		for _, c := range p.Status.ContainerStatuses {
			r.restarts += c.RestartCount
		}
		out[p.Name] = r
	}
	return out
}
