package integration

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// A manager run with --watch-selector (as every operator of the test suite is, with its package's
// label) leaves a RedisCluster the selector does not match alone: no finalizer, no status, no
// object, no Vault call; once the cluster carries the label, it handles it as any other.
func TestWatchSelectorLeavesOtherClustersAlone(t *testing.T) {
	ns := fw.Namespace(t, "selector")
	vc := fw.VaultConnection(t, "vault-selector", framework.Allow(ns))
	fw.WaitConnectionReady(t, vc.Name, 30*time.Second)
	rc := &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "foreign"},
		Spec: v1beta1.RedisClusterSpec{Replicas: 1, Version: framework.RedisVersion, Credentials: v1beta1.CredentialsSpec{
			Source:     v1beta1.SourceVaultLease,
			VaultLease: &v1beta1.VaultLeaseSource{ConnectionRef: v1beta1.ConnectionReference{Name: vc.Name}, Path: fw.Path("orders")},
		}},
	}
	// Created without the package's label (not through fw.Create, which adds it).
	if err := fw.Client.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Client.Delete(context.Background(), rc) })
	calls := vaultCalls.of(vc.Name)
	time.Sleep(10 * time.Second)
	cur := fw.Get(t, rc)
	if len(cur.Finalizers) > 0 || len(cur.Status.Conditions) > 0 || cur.Status.Credential != nil {
		t.Fatalf("a RedisCluster outside the selector was handled: finalizers %v, status %+v", cur.Finalizers, cur.Status)
	}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), &appsv1.StatefulSet{}); err == nil {
		t.Fatal("a StatefulSet was made for a RedisCluster outside the selector")
	}
	if n := vaultCalls.of(vc.Name) - calls; n != 0 {
		t.Fatalf("%d Vault calls through %s for a RedisCluster outside the selector", n, vc.Name)
	}

	patch := client.MergeFrom(cur.DeepCopy())
	fw.Label(cur)
	if err := fw.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
	cur = fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionTrue, "", 60*time.Second)
	if len(cur.Finalizers) == 0 {
		t.Error("the labelled RedisCluster has no finalizer")
	}
}
