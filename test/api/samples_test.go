package api

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestEverySampleIsAccepted(t *testing.T) {
	objs := render(t, "samples")
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	if kinds["VaultConnection"] < 1 || kinds["RedisCluster"] < 2 {
		t.Fatalf("deploy/samples should hold a VaultConnection and a RedisCluster per credentials source, has %v", kinds)
	}
	sources := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "RedisCluster" {
			s, _, _ := unstructured.NestedString(o.Object, "spec", "credentials", "source")
			sources[s] = true
		}
	}
	if !sources["VaultLease"] || !sources["ExternalSecret"] {
		t.Fatalf("samples cover credentials sources %v, want VaultLease and ExternalSecret", sources)
	}
	apply(t, objs)
	t.Cleanup(func() {
		for _, o := range objs {
			_ = fw.Client.Delete(context.Background(), o)
		}
	})
}
