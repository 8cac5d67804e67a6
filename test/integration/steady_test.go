package integration

import (
	"context"
	"fmt"
	"maps"
	"os"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// steadyStateWritesNothing reconciles rc twice more with nothing changed, through a client that
// counts the operator's writes: none is made to the API server, no call to Vault (through the
// VaultConnection connection), no ACL command to a Redis node.
func steadyStateWritesNothing(t *testing.T, rc *v1beta1.RedisCluster, connection string) {
	t.Helper()
	var writes atomic.Int64
	var written []string
	count := func(verb string, o client.Object) {
		writes.Add(1)
		written = append(written, fmt.Sprintf("%s %T %s", verb, o, o.GetName()))
	}
	reconciler := fw.Operator().Reconciler
	r := reconciler.WithClient(interceptor.NewClient(withoutWatch{reconciler.Client}, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			count("create", o)
			return c.Create(ctx, o, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			count("update", o)
			return c.Update(ctx, o, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
			count("patch", o)
			return c.Patch(ctx, o, p, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
			count("delete", o)
			return c.Delete(ctx, o, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, s string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			count("patch "+s, o)
			return c.SubResource(s).Patch(ctx, o, p, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, s string, o client.Object, opts ...client.SubResourceUpdateOption) error {
			count("update "+s, o)
			return c.SubResource(s).Update(ctx, o, opts...)
		},
	}))
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rc)}
	calls := vaultCalls.of(connection)
	aclBefore := aclCommands(t, rc)
	for i := range 2 {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatalf("reconcile %d: %v", i, err)
		}
		if res.RequeueAfter <= 0 {
			t.Errorf("reconcile %d: no RequeueAfter for the next renewal", i)
		}
	}
	if n := writes.Load(); n != 0 {
		t.Errorf("reconciling an unchanged RedisCluster made %d API writes: %q", n, written)
	}
	if connection != "" {
		if n := vaultCalls.of(connection) - calls; n != 0 {
			t.Errorf("reconciling an unchanged RedisCluster made %d Vault calls", n)
		}
	}
	if after := aclCommands(t, rc); !maps.Equal(after, aclBefore) {
		t.Errorf("reconciling an unchanged RedisCluster sent ACL commands to the Redis nodes:\nbefore %v\nafter  %v", aclBefore, after)
	}
}

// TestSteadyStateWritesNothingWithEveryOptionalObject: a cluster with every object keyroll may
// keep for it (the NetworkPolicy, a persistent volume per pod, the Vault plugin's user and its
// Secret, besides the PodDisruptionBudget every cluster has), and a cluster in ExternalSecret mode
// (its ExternalSecret), reconciled again with nothing changed, write nothing: each owned kind's
// fields compare equal to what keyroll applies.
func TestSteadyStateWritesNothingWithEveryOptionalObject(t *testing.T) {
	t.Parallel()
	t.Run("every optional object", func(t *testing.T) {
		t.Parallel()
		ns := fw.Namespace(t, "steady-all")
		vc := fw.VaultConnection(t, "vault-steady-all", framework.Allow(ns))
		class := localVolumes(t, ns, 2)
		rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(2), func(rc *v1beta1.RedisCluster) {
			rc.Spec.NetworkPolicy = &v1beta1.NetworkPolicySpec{Enabled: true}
			rc.Spec.Storage = &v1beta1.StorageSpec{Size: resource.MustParse("64Mi"), StorageClassName: &class}
			rc.Spec.VaultPlugin = &v1beta1.VaultPluginSpec{Username: "vault-plugin"}
		})
		fw.WaitReady(t, rc, 3*time.Minute)
		steadyStateWritesNothing(t, rc, vc.Name)
	})
	t.Run("ExternalSecret mode", func(t *testing.T) {
		t.Parallel()
		ns := fw.Namespace(t, "steady-es")
		vc := fw.VaultConnection(t, "vault-steady-es", framework.Allow(ns))
		fw.VaultDynamicSecret(t, ns, "redis-orders", "es-long", true)
		rc := fw.ExternalSecretCluster(t, ns, "orders", v1beta1.ExternalSecretSource{
			GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-orders"},
			RefreshInterval: &metav1.Duration{Duration: time.Hour},
			ConnectionRef:   &v1beta1.ConnectionReference{Name: vc.Name},
		})
		fw.WaitReady(t, rc, 2*time.Minute)
		steadyStateWritesNothing(t, rc, vc.Name)
	})
}

// localVolumes makes n persistent volumes on the real node (host directories), of a storage class
// of their own, which the ground has no provisioner for: each Redis pod's claim binds one. It
// returns the class; the volumes and directories go when the test ends.
func localVolumes(t *testing.T, ns string, n int) string {
	t.Helper()
	class := ns + "-local"
	for i := range n {
		// Redis runs as a user of its own: the directory (and the way to it) must let it in.
		dir, err := os.MkdirTemp("", "keyroll-"+class+"-")
		if err == nil {
			err = os.Chmod(dir, 0o777)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		fw.Create(t, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", class, i)},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain, // no deleter for host paths
				StorageClassName:              class,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			},
		})
	}
	return class
}
