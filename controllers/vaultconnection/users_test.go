package vaultconnection

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
)

// A RedisCluster of a namespace the VaultConnection does not allow may name it (a tenant writes
// its own spec), but it does not use it: deleting the connection does not wait for it.
func TestDisallowedNamespacesDoNotHoldTheDeletion(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1beta1.AddToScheme(scheme)
	rc := func(ns string) *v1beta1.RedisCluster {
		return &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orders"},
			Spec: v1beta1.RedisClusterSpec{Credentials: v1beta1.CredentialsSpec{Source: v1beta1.SourceVaultLease,
				VaultLease: &v1beta1.VaultLeaseSource{ConnectionRef: v1beta1.ConnectionReference{Name: "vault"}, Path: "database/creds/orders"}}}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(rc("team-a"), rc("team-b")).
		WithIndex(&v1beta1.RedisCluster{}, connection.ClusterIndex, func(o client.Object) []string { return o.(*v1beta1.RedisCluster).VaultConnections() }).
		Build()
	r := &Reconciler{Client: c}
	vc := &v1beta1.VaultConnection{ObjectMeta: metav1.ObjectMeta{Name: "vault"}, Spec: v1beta1.VaultConnectionSpec{AllowedNamespaces: []string{"team-a"}}}
	users, _, err := r.users(context.Background(), vc)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(users, []string{"team-a/orders"}) {
		t.Errorf("users %v, want team-a/orders only: team-b is not allowed", users)
	}
}
