package rediscluster

import (
	"context"
	"maps"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/render"
)

// With spec.networkPolicy enabled the cluster owns a NetworkPolicy that admits Redis traffic
// (TCP 6379) from keyroll's manager, its own Redis pods, its consumers' pods (by the consumer's
// own selector) and the peers listed; disabled again, the NetworkPolicy goes.
func TestNetworkPolicyAdmitsTheOperatorTheNodesAndTheConsumersOnly(t *testing.T) {
	api := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-api"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders-api"}}}}
	batch := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "batch"}}}
	h := newHarness(t, api, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.Consumers = []v1beta1.ConsumerReference{{Kind: "Deployment", Name: "orders-api"}}
		rc.Spec.NetworkPolicy = &v1beta1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{batch}}
	}))
	rc := h.settle(t)
	np := &networkingv1.NetworkPolicy{}
	key := client.ObjectKey{Namespace: "shop", Name: "orders-redis"}
	if err := h.k8s.Get(context.Background(), key, np); err != nil {
		t.Fatal(err)
	}
	if !apply.OwnedBy(np, rc) || np.Labels[v1beta1.LabelManagedBy] != v1beta1.ManagedByValue {
		t.Errorf("the NetworkPolicy is not keyroll's: owners %+v, labels %v", np.OwnerReferences, np.Labels)
	}
	if !maps.Equal(np.Spec.PodSelector.MatchLabels, render.SelectorLabels(rc)) || len(np.Spec.Ingress) != 1 {
		t.Fatalf("NetworkPolicy spec %+v", np.Spec)
	}
	in := np.Spec.Ingress[0]
	if len(in.Ports) != 1 || in.Ports[0].Port.IntValue() != 6379 || *in.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("ports %+v, want TCP 6379 only", in.Ports)
	}
	want := []networkingv1.NetworkPolicyPeer{
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "keyroll-system"}},
			PodSelector: &metav1.LabelSelector{MatchLabels: render.ManagerPodLabels}},
		{PodSelector: &metav1.LabelSelector{MatchLabels: render.SelectorLabels(rc)}},
		{PodSelector: api.Spec.Selector},
		batch,
	}
	if len(in.From) != len(want) {
		t.Fatalf("peers %+v, want %+v", in.From, want)
	}
	for i := range want {
		if got, w := in.From[i], want[i]; !selectorEqual(got.PodSelector, w.PodSelector) || !selectorEqual(got.NamespaceSelector, w.NamespaceSelector) {
			t.Errorf("peer %d: %+v, want %+v", i, got, w)
		}
	}

	if len(np.Spec.Egress) != 2 || len(np.Spec.Egress[0].To) != 1 || !selectorEqual(np.Spec.Egress[0].To[0].PodSelector, &metav1.LabelSelector{MatchLabels: render.SelectorLabels(rc)}) ||
		np.Spec.Egress[1].Ports[0].Port.IntValue() != 53 {
		t.Errorf("egress %+v, want the cluster's own pods on 6379 and DNS only", np.Spec.Egress)
	}

	rc.Spec.NetworkPolicy.Enabled = false
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.settle(t)
	if err := h.k8s.Get(context.Background(), key, np); !apierrors.IsNotFound(err) {
		t.Errorf("the NetworkPolicy is still there once disabled: %v", err)
	}
}

func selectorEqual(a, b *metav1.LabelSelector) bool {
	if a == nil || b == nil {
		return a == b
	}
	return maps.Equal(a.MatchLabels, b.MatchLabels) && len(a.MatchExpressions) == len(b.MatchExpressions)
}
