package render

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// The cluster's NetworkPolicy admits pods to the Redis port only: no rule admits any pod to the
// probe sidecar's port, which only the node's own traffic (the kubelet's probes) reaches.
func TestNetworkPolicyAdmitsNoPodToTheProbePort(t *testing.T) {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	np := NetworkPolicy(rc, "keyroll-system", []*metav1.LabelSelector{{MatchLabels: map[string]string{"app": "api"}}})
	if len(np.Spec.Ingress) == 0 {
		t.Fatal("no ingress rule")
	}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) == 0 {
			t.Fatalf("an ingress rule admits every port: %+v", rule)
		}
		for _, p := range rule.Ports {
			if p.Port == nil || p.Port.IntValue() != RedisPort {
				t.Errorf("an ingress rule admits port %v, want %d only (never the probe port %d)", p.Port, RedisPort, probePort)
			}
		}
	}
}
