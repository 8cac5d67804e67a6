package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
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
		time.Sleep(200 * time.Millisecond)
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

// vaultConnection creates a VaultConnection with Kubernetes auth as the operator's role.
func vaultConnection(t *testing.T, name, address string, allowed ...string) *v1alpha1.VaultConnection {
	t.Helper()
	vc := &v1alpha1.VaultConnection{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VaultConnectionSpec{
			Address:           address,
			Auth:              v1alpha1.VaultAuth{Kubernetes: &v1alpha1.KubernetesAuth{Role: operatorRole}},
			AllowedNamespaces: allowed,
		},
	}
	if err := k8s.Create(context.Background(), vc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), vc) })
	return vc
}

// redisCluster creates a RedisCluster in direct (VaultLease) mode.
func redisCluster(t *testing.T, ns, name, connection, path string, mutate ...func(*v1alpha1.RedisCluster)) *v1alpha1.RedisCluster {
	t.Helper()
	rc := &v1alpha1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RedisClusterSpec{
			Replicas: 3,
			Credentials: v1alpha1.CredentialsSpec{
				Source: v1alpha1.SourceVaultLease,
				VaultLease: &v1alpha1.VaultLeaseSource{
					ConnectionRef: v1alpha1.ConnectionReference{Name: connection}, Path: path,
				},
			},
		},
	}
	for _, m := range mutate {
		m(rc)
	}
	if err := k8s.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

func get(t *testing.T, rc *v1alpha1.RedisCluster) *v1alpha1.RedisCluster {
	t.Helper()
	out := &v1alpha1.RedisCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitCondition waits until the RedisCluster has a condition with the given status and reason.
func waitCondition(t *testing.T, rc *v1alpha1.RedisCluster, condType string, status metav1.ConditionStatus, reason string, timeout time.Duration) *v1alpha1.RedisCluster {
	t.Helper()
	var cur *v1alpha1.RedisCluster
	eventually(t, timeout, func() string {
		cur = get(t, rc)
		c := meta.FindStatusCondition(cur.Status.Conditions, condType)
		if c == nil || c.Status != status || (reason != "" && c.Reason != reason) {
			return fmt.Sprintf("%s: condition %s is %+v, want %s/%s", rc.Name, condType, c, status, reason)
		}
		return ""
	})
	return cur
}

// credentials reads the credentials Secret.
func credentials(t *testing.T, rc *v1alpha1.RedisCluster) (user, pass string, ok bool) {
	t.Helper()
	sec := &corev1.Secret{}
	name := rc.Name + "-credentials"
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: name}, sec); err != nil {
		return "", "", false
	}
	return string(sec.Data["username"]), string(sec.Data["password"]), true
}

// authenticates says whether a credential works against the Redis that Vault manages.
func authenticates(user, pass string) bool {
	who, err := ground.Redis.WhoAmI(user, pass)
	return err == nil && who == user
}

// eventReasons lists the reasons of the events about an object.
func eventReasons(t *testing.T, ns, name string) []string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

// leaseExists asks Vault (as root) whether a lease exists, and when it expires.
func leaseExists(t *testing.T, id string) (bool, time.Time) {
	t.Helper()
	return ground.Vault.LeaseExpiry(id)
}
