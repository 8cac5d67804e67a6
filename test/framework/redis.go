package framework

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/testground"
)

// SecretData reads one key of a Secret ("" when the Secret or the key is missing).
func (f *Framework) SecretData(ns, name, key string) string {
	s := &corev1.Secret{}
	if err := f.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
		return ""
	}
	return string(s.Data[key])
}

// Credentials reads the consumers' Secret of a RedisCluster (<name>-credentials); ok is false
// while there is none.
func (f *Framework) Credentials(rc *v1beta1.RedisCluster) (user, pass string, ok bool) {
	s := &corev1.Secret{}
	if err := f.Client.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name + "-credentials"}, s); err != nil {
		return "", "", false
	}
	return string(s.Data["username"]), string(s.Data["password"]), true
}

// Authenticates says whether a credential logs in on the ground's Redis, which Vault's database
// engine manages users on (it deletes the user there when it revokes the lease).
func (f *Framework) Authenticates(user, pass string) bool {
	who, err := f.Ground.Redis.WhoAmI(user, pass)
	return err == nil && who == user
}

// AdminPassword is keyroll's admin password of a cluster, from its state Secret (<name>-keyroll).
func (f *Framework) AdminPassword(rc *v1beta1.RedisCluster) string {
	return f.SecretData(rc.Namespace, rc.Name+"-keyroll", "admin-password")
}

// InternalPasswords are the passwords of keyroll's own users of a cluster: the admin's from its
// state Secret, the replication and probe users' from the ACL Secret the pods mount.
func (f *Framework) InternalPasswords(t testing.TB, rc *v1beta1.RedisCluster) map[string]string {
	t.Helper()
	out := map[string]string{}
	for secret, keys := range map[string][]string{rc.Name + "-keyroll": {"admin-password"}, rc.Name + "-acl": {"replication-password", "probe-password"}} {
		for _, k := range keys {
			v := f.SecretData(rc.Namespace, secret, k)
			if v == "" {
				t.Fatalf("Secret %s/%s has no %s", rc.Namespace, secret, k)
			}
			out[k] = v
		}
	}
	return out
}

// ListRedisPods lists the Redis pods of a cluster, by name.
func (f *Framework) ListRedisPods(rc *v1beta1.RedisCluster) ([]corev1.Pod, error) {
	list := &corev1.PodList{}
	if err := f.Client.List(context.Background(), list, client.InNamespace(rc.Namespace), client.MatchingLabels{v1beta1.LabelCluster: rc.Name}); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return list.Items, nil
}

// RedisPods is ListRedisPods in the test's goroutine.
func (f *Framework) RedisPods(t testing.TB, rc *v1beta1.RedisCluster) []corev1.Pod {
	t.Helper()
	pods, err := f.ListRedisPods(rc)
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

// PodAddr is where a Redis pod listens: its pod IP, which the host reaches directly.
func PodAddr(p *corev1.Pod) string { return net.JoinHostPort(p.Status.PodIP, "6379") }

// PodReady says whether a pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodSummary is a line per pod of a namespace: name, node, phase, readiness and each container's
// restarts and state, to explain a failure.
func (f *Framework) PodSummary(ns string) string {
	pods, err := f.Clientset.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "\n  %s on %s: %s ready=%v", p.Name, p.Spec.NodeName, p.Status.Phase, PodReady(&p))
		for _, c := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " [%s restarts=%d %+v]", c.Name, c.RestartCount, c.State)
		}
	}
	return b.String()
}

// NodeLogins logs in as user on every Redis pod of rc (pods 0 to spec.replicas-1, by pod IP) and
// sorts the pods by the outcome: accepted (ACL WHOAMI names user), refused (WRONGPASS) and failed
// (anything else: no pod, no IP, no answer), each with the pod's name and, for failed, why.
func (f *Framework) NodeLogins(rc *v1beta1.RedisCluster, user, pass string) (accepted, refused, failed []string, err error) {
	cur := &v1beta1.RedisCluster{}
	if err := f.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), cur); err != nil {
		return nil, nil, nil, err
	}
	for i := range cur.Spec.Replicas {
		name := fmt.Sprintf("%s-%d", rc.Name, i)
		pod := &corev1.Pod{}
		switch err := f.Client.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: name}, pod); {
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s (%v)", name, err))
			continue
		case pod.Status.PodIP == "":
			failed = append(failed, name+" (no pod IP)")
			continue
		}
		addr := PodAddr(pod)
		who, err := testground.RedisWhoAmI(addr, user, pass)
		switch {
		case err == nil && who == user:
			accepted = append(accepted, name)
		case err != nil && strings.Contains(err.Error(), "WRONGPASS"):
			refused = append(refused, name)
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s at %s (%v)", name, addr, err))
		default:
			failed = append(failed, fmt.Sprintf("%s at %s (logged in as %q)", name, addr, who))
		}
	}
	return accepted, refused, failed, nil
}

// OnEveryPod checks a credential on each of the cluster's Redis pods: with accept, it must log in
// as user on every one; without, be refused (WRONGPASS) on every one. It returns "" or what went
// otherwise.
func (f *Framework) OnEveryPod(rc *v1beta1.RedisCluster, user, pass string, accept bool) string {
	accepted, refused, failed, err := f.NodeLogins(rc, user, pass)
	switch {
	case err != nil:
		return err.Error()
	case len(failed) > 0:
		return fmt.Sprintf("user %s: no answer from %v (accepted on %v, refused on %v)", user, failed, accepted, refused)
	case accept && len(refused) > 0:
		return fmt.Sprintf("user %s does not log in on %v", user, refused)
	case !accept && len(accepted) > 0:
		return fmt.Sprintf("user %s still logs in on %v", user, accepted)
	}
	return ""
}

// RedisCLI runs redis-cli inside a Redis pod as keyroll's probe user, whose password the pod
// mounts (it goes through REDISCLI_AUTH, never argv): it may run PING and INFO.
func (f *Framework) RedisCLI(ctx context.Context, ns, pod string, args ...string) (string, error) {
	script := `REDISCLI_AUTH="$(cat /etc/keyroll/acl/probe-password)" exec redis-cli --no-auth-warning --user keyroll-probe "$@"`
	out, _, err := f.Ground.Node.Exec(ctx, ns, pod, "redis", append([]string{"sh", "-c", script, "redis-cli"}, args...)...)
	return out, err
}

// RedisClient is a go-redis client of one Redis node (a pod's address) as user: RESP2 and no
// client identity, as Redis 7.0 takes them; a pool of two connections.
func RedisClient(addr, user, pass string) *redis.Client {
	return RedisClientTLS(addr, user, pass, nil)
}

// RedisClientTLS is RedisClient over TLS when conf is set (a TLS cluster's node).
func RedisClientTLS(addr, user, pass string, conf *tls.Config) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pass, Protocol: 2, DisableIdentity: true, PoolSize: 2, TLSConfig: conf})
}
