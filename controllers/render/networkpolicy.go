package render

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// NetworkPolicyName is the NetworkPolicy keyroll keeps for a cluster's Redis pods.
func NetworkPolicyName(rc *v1alpha1.RedisCluster) string { return rc.Name + "-redis" }

// ManagerPodLabels are the labels of keyroll's manager pods (deploy/manager, the Helm chart).
var ManagerPodLabels = map[string]string{"app.kubernetes.io/name": "keyroll"}

// NetworkPolicy admits traffic to the cluster's Redis pods on the Redis port only from keyroll's
// manager (its pods in operatorNamespace), the cluster's own Redis pods (replication), the pods
// of the consumers (consumers: their workloads' pod selectors) and spec.networkPolicy.from.
func NetworkPolicy(rc *v1alpha1.RedisCluster, operatorNamespace string, consumers []*metav1.LabelSelector) *networkingv1.NetworkPolicy {
	peers := []networkingv1.NetworkPolicyPeer{
		{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: operatorNamespace}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: ManagerPodLabels},
		},
		{PodSelector: &metav1.LabelSelector{MatchLabels: SelectorLabels(rc)}},
	}
	for _, sel := range consumers {
		peers = append(peers, networkingv1.NetworkPolicyPeer{PodSelector: sel})
	}
	if np := rc.Spec.NetworkPolicy; np != nil {
		peers = append(peers, np.From...)
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: objectMeta(rc, NetworkPolicyName(rc)),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: SelectorLabels(rc)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  peers,
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(redisPort))}},
			}},
		},
	}
}
