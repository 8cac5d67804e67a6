package render

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// NetworkPolicyName is the NetworkPolicy keyroll keeps for a cluster's Redis pods.
func NetworkPolicyName(rc *v1beta1.RedisCluster) string { return rc.Name + "-redis" }

// ManagerPodLabels are the labels of keyroll's manager pods (deploy/manager, the Helm chart).
var ManagerPodLabels = map[string]string{"app.kubernetes.io/name": "keyroll"}

// NetworkPolicy admits traffic to the cluster's Redis pods on the Redis port only from keyroll's
// manager (its pods in operatorNamespace), the cluster's own Redis pods (replication), the pods
// of the consumers (consumers: their workloads' pod selectors) and spec.networkPolicy.from; from
// the Redis pods, only to each other on the Redis port, and DNS.
func NetworkPolicy(rc *v1beta1.RedisCluster, operatorNamespace string, consumers []*metav1.LabelSelector) *networkingv1.NetworkPolicy {
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
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  peers,
				Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, RedisPort)},
			}},
			// A Redis pod reaches its peers (replication, the start script's question who the
			// primary is) and resolves their names; nothing else.
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: SelectorLabels(rc)}}},
					Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, RedisPort)}},
				{Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolUDP, 53), port(corev1.ProtocolTCP, 53)}},
			},
		},
	}
}

func port(proto corev1.Protocol, n int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: ptr.To(proto), Port: ptr.To(intstr.FromInt32(n))}
}
