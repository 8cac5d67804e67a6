package framework

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/testground"
)

// RedisVersion is the Redis version of the RedisClusters the framework makes: the real node has
// only the image of Debian's Redis 7.0 (testground.RedisImage).
const RedisVersion = "7.0"

// Namespace creates the package's namespace base (named by Name) and returns its name. When the
// test ends its RedisClusters (their StatefulSets and pods go with them), Deployments,
// StatefulSets and pods are deleted, so that the real node runs the pods of running tests only.
func (f *Framework) Namespace(t testing.TB, base string) string {
	t.Helper()
	name := f.Name(base)
	if err := f.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, in := context.Background(), client.InNamespace(name)
		for _, obj := range []client.Object{&v1beta1.RedisCluster{}, &appsv1.Deployment{}, &appsv1.StatefulSet{}, &corev1.Pod{}} {
			if err := f.Client.DeleteAllOf(ctx, obj, in, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
				t.Logf("cleaning up namespace %s: %v", name, err)
			}
		}
	})
	return name
}

// VaultConnectionOption changes a VaultConnection before it is created.
type VaultConnectionOption func(*v1beta1.VaultConnection)

// Allow lets the namespaces use the connection.
func Allow(namespaces ...string) VaultConnectionOption {
	return func(vc *v1beta1.VaultConnection) {
		vc.Spec.AllowedNamespaces = append(vc.Spec.AllowedNamespaces, namespaces...)
	}
}

// Paths sets the connection's spec.allowedPaths, in place of the package's own roles.
func Paths(paths ...string) VaultConnectionOption {
	return func(vc *v1beta1.VaultConnection) { vc.Spec.AllowedPaths = paths }
}

// Address points the connection at another address than the ground's Vault (a proxy, say).
func Address(addr string) VaultConnectionOption {
	return func(vc *v1beta1.VaultConnection) { vc.Spec.Address = addr }
}

// AuthRole logs the operator in with another Kubernetes auth role than its own.
func AuthRole(role string) VaultConnectionOption {
	return func(vc *v1beta1.VaultConnection) {
		vc.Spec.Auth = v1beta1.VaultAuth{Kubernetes: &v1beta1.KubernetesAuth{Role: role}}
	}
}

// VaultConnection creates the package's VaultConnection base (named by Name) to the ground's
// Vault, logging in with the operator's Kubernetes auth role, and deletes it when the test ends.
// It allows the paths of the package's own roles (Path), unless Paths says otherwise.
func (f *Framework) VaultConnection(t testing.TB, base string, opts ...VaultConnectionOption) *v1beta1.VaultConnection {
	t.Helper()
	vc := &v1beta1.VaultConnection{
		ObjectMeta: metav1.ObjectMeta{Name: f.Name(base)},
		Spec: v1beta1.VaultConnectionSpec{
			Address:      f.Ground.Vault.Addr,
			Auth:         v1beta1.VaultAuth{Kubernetes: &v1beta1.KubernetesAuth{Role: f.OperatorRole}},
			AllowedPaths: []string{f.Path("") + "*"},
		},
	}
	for _, o := range opts {
		o(vc)
	}
	f.Label(vc)
	if err := f.Client.Create(context.Background(), vc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Client.Delete(context.Background(), vc) })
	return vc
}

// GetConnection reads a VaultConnection by its full name.
func (f *Framework) GetConnection(t testing.TB, name string) *v1beta1.VaultConnection {
	t.Helper()
	vc := &v1beta1.VaultConnection{}
	if err := f.Client.Get(context.Background(), client.ObjectKey{Name: name}, vc); err != nil {
		t.Fatal(err)
	}
	return vc
}

// ClusterOption changes a RedisCluster before it is created.
type ClusterOption func(*v1beta1.RedisCluster)

// Replicas sets the number of Redis nodes.
func Replicas(n int32) ClusterOption {
	return func(rc *v1beta1.RedisCluster) { rc.Spec.Replicas = n }
}

// WithConsumers lists Deployments as the cluster's consumers.
func WithConsumers(deployments ...string) ClusterOption {
	return func(rc *v1beta1.RedisCluster) {
		for _, d := range deployments {
			rc.Spec.Rollout.Consumers = append(rc.Spec.Rollout.Consumers, v1beta1.ConsumerReference{Kind: "Deployment", Name: d})
		}
	}
}

// RedisCluster creates a RedisCluster of one Redis 7.0 node (options change it) that takes its
// credential straight from Vault (VaultLease) at path through connection, and deletes it when the
// test ends.
func (f *Framework) RedisCluster(t testing.TB, ns, name, connection, path string, opts ...ClusterOption) *v1beta1.RedisCluster {
	t.Helper()
	rc := &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1beta1.RedisClusterSpec{
			Replicas: 1, Version: RedisVersion,
			Credentials: v1beta1.CredentialsSpec{
				Source:     v1beta1.SourceVaultLease,
				VaultLease: &v1beta1.VaultLeaseSource{ConnectionRef: v1beta1.ConnectionReference{Name: connection}, Path: path},
			},
		},
	}
	for _, o := range opts {
		o(rc)
	}
	f.Create(t, rc)
	return rc
}

// Create creates an object and deletes it when the test ends; a RedisCluster or VaultConnection
// is marked as the package's first (Label), so that the package's operator sees it.
func (f *Framework) Create(t testing.TB, obj client.Object) {
	t.Helper()
	switch obj.(type) {
	case *v1beta1.RedisCluster, *v1beta1.VaultConnection:
		f.Label(obj)
	}
	if err := f.Client.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Client.Delete(context.Background(), obj) })
}

// Get reads a RedisCluster again.
func (f *Framework) Get(t testing.TB, rc *v1beta1.RedisCluster) *v1beta1.RedisCluster {
	t.Helper()
	out := &v1beta1.RedisCluster{}
	if err := f.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// RotateNow asks for one rotation now (the annotation keyroll.dev/rotate-now, with the time as its
// value) and returns the value.
func (f *Framework) RotateNow(t testing.TB, rc *v1beta1.RedisCluster) string {
	t.Helper()
	value := time.Now().UTC().Format(time.RFC3339Nano)
	f.Annotate(t, rc, v1beta1.AnnotationRotateNow, value)
	return value
}

// Annotate sets an annotation of a RedisCluster.
func (f *Framework) Annotate(t testing.TB, rc *v1beta1.RedisCluster, key, value string) {
	t.Helper()
	cur := f.Get(t, rc)
	patch := client.MergeFrom(cur.DeepCopy())
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[key] = value
	if err := f.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// DeleteAndWait deletes a RedisCluster and waits up to timeout until it is gone (its finalizer
// revokes its leases first).
func (f *Framework) DeleteAndWait(t testing.TB, rc *v1beta1.RedisCluster, timeout time.Duration) {
	t.Helper()
	if err := f.Client.Delete(context.Background(), rc); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	Eventually(t, timeout, func() string {
		if err := f.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), &v1beta1.RedisCluster{}); err == nil {
			return "RedisCluster " + rc.Name + " still exists"
		}
		return ""
	})
}

// StandInConsumer creates a consumer Deployment of replicas pods that run nothing, on kwok's fake
// node, where they are Ready at once, and returns its key.
func (f *Framework) StandInConsumer(t testing.TB, ns, name string, replicas int32) client.ObjectKey {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{NodeSelector: map[string]string{testground.NodeLabel: "kwok"},
					Containers: []corev1.Container{{Name: "app", Image: "example/app:1"}}},
			},
		},
	}
	if err := f.Client.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(d)
}

// PauseDeployment sets a Deployment's spec.paused (a paused consumer holds its rollout).
func (f *Framework) PauseDeployment(t testing.TB, key client.ObjectKey, paused bool) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := f.Client.Get(context.Background(), key, d); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Paused = paused
	if err := f.Client.Patch(context.Background(), d, patch); err != nil {
		t.Fatal(err)
	}
}
