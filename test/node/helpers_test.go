package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/harness"
)

// eventually polls check until it returns "" or the timeout passes; the last message explains a failure.
func eventually(t *testing.T, timeout time.Duration, check func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	msg := ""
	for time.Now().Before(deadline) {
		if msg = check(); msg == "" {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("after %s: %s", timeout, msg)
}

func namespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}

// vaultConnection creates a VaultConnection to the ground's Vault through the node's bridge (the
// address pods use; the operator in this process reaches it there too), with Kubernetes auth.
func vaultConnection(t *testing.T, name string, allowed ...string) {
	t.Helper()
	vc := &v1alpha1.VaultConnection{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VaultConnectionSpec{
			Address:           ground.Vault.PodAddr,
			Auth:              v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: harness.OperatorRole}},
			AllowedNamespaces: allowed,
		},
	}
	if err := k8s.Create(context.Background(), vc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), vc) })
}

// redisCluster creates a RedisCluster of Redis 7.0 (the image the node has) in VaultLease mode.
func redisCluster(t *testing.T, ns, name, connection, path string, replicas int32) *v1alpha1.RedisCluster {
	t.Helper()
	rc := &v1alpha1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RedisClusterSpec{
			Replicas: replicas, Version: "7.0",
			Credentials: v1alpha1.CredentialsSpec{
				Source: v1alpha1.SourceVaultLease,
				VaultLease: &v1alpha1.VaultLeaseSource{
					ConnectionRef: v1alpha1.ConnectionReference{Name: connection}, Path: path,
				},
			},
		},
	}
	if err := k8s.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// waitReady waits until the RedisCluster is Ready and returns it.
func waitReady(t *testing.T, key client.ObjectKey, timeout time.Duration) *v1alpha1.RedisCluster {
	t.Helper()
	rc := &v1alpha1.RedisCluster{}
	eventually(t, timeout, func() string {
		if err := k8s.Get(context.Background(), key, rc); err != nil {
			return err.Error()
		}
		if c := meta.FindStatusCondition(rc.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("RedisCluster %s not Ready: %+v\npods: %s", key, c, podSummary(key.Namespace))
		}
		return ""
	})
	return rc
}

// podSummary is one line per pod of a namespace: name, node, phase, readiness, restarts.
func podSummary(ns string) string {
	pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "\n  %s on %s: %s ready=%v", p.Name, p.Spec.NodeName, p.Status.Phase, podReady(&p))
		for _, c := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " [%s restarts=%d %+v]", c.Name, c.RestartCount, c.State)
		}
	}
	return b.String()
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// credentials reads a RedisCluster's credentials Secret.
func credentials(t *testing.T, ns, name string) (user, pass string) {
	t.Helper()
	s := &corev1.Secret{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name + "-credentials"}, s); err != nil {
		t.Fatal(err)
	}
	return string(s.Data["username"]), string(s.Data["password"])
}

// redisCLI runs redis-cli inside a Redis pod as keyroll's probe user, whose password the pod
// mounts (it goes through REDISCLI_AUTH, never argv): it may run PING and INFO.
func redisCLI(ctx context.Context, ns, pod string, args ...string) (string, error) {
	script := `REDISCLI_AUTH="$(cat /etc/keyroll/acl/probe-password)" exec redis-cli --no-auth-warning --user keyroll-probe "$@"`
	out, _, err := ground.Node.Exec(ctx, ns, pod, "redis", append([]string{"sh", "-c", script, "redis-cli"}, args...)...)
	return out, err
}

// deleteAndWait deletes a RedisCluster and waits until it is gone (its finalizer revokes its leases).
func deleteAndWait(t *testing.T, rc *v1alpha1.RedisCluster) {
	t.Helper()
	if err := k8s.Delete(context.Background(), rc); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() string {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), &v1alpha1.RedisCluster{}); err == nil {
			return "RedisCluster " + rc.Name + " still exists"
		}
		return ""
	})
}
