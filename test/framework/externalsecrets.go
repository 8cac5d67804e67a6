package framework

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// External Secrets Operator's side of a test: its Vault access, its generator and a RedisCluster
// in ExternalSecret mode (the real ESO controller runs on the ground with ExternalSecrets).

// ESOKubernetesAuth gives ESO Kubernetes-auth access to Vault as the service account
// "external-secrets" of the package's namespace ns (Vault role "<package>-eso-<namespace base>"),
// as deploy/samples/externalsecret-generator.yaml expects it (with its own role name).
func (f *Framework) ESOKubernetesAuth(t testing.TB, ns string, tokenTTL ...time.Duration) string {
	t.Helper()
	ttl := time.Hour
	if len(tokenTTL) > 0 {
		ttl = tokenTTL[0]
	}
	role := ns + "-eso"
	if err := f.ExternalSecretsAuth(context.Background(), ns, role, f.Name("eso"), ttl); err != nil {
		t.Fatal(err)
	}
	return role
}

// VaultDynamicSecret creates ESO's VaultDynamicSecret generator for the package's Redis role
// (f.Path(role)), deleted when the test ends; raw asks for the raw Vault response (resultType
// Raw), which includes the lease. tokenTTL is the TTL of the Vault tokens ESO logs in with
// (default 1h).
func (f *Framework) VaultDynamicSecret(t testing.TB, ns, name, role string, raw bool, tokenTTL ...time.Duration) {
	t.Helper()
	f.Create(t, f.VaultDynamicSecretObject(ns, name, role, f.ESOKubernetesAuth(t, ns, tokenTTL...), raw))
}

// VaultDynamicSecretObject is the VaultDynamicSecret VaultDynamicSecret creates, logging in with
// the Kubernetes auth role authRole.
func (f *Framework) VaultDynamicSecretObject(ns, name, role, authRole string, raw bool) *unstructured.Unstructured {
	spec := map[string]any{
		"path": f.Path(role), "method": "GET",
		"provider": map[string]any{
			"server": f.Ground.Vault.Addr,
			"auth": map[string]any{"kubernetes": map[string]any{
				"mountPath": "kubernetes", "role": authRole,
				"serviceAccountRef": map[string]any{"name": "external-secrets", "audiences": []any{"vault"}},
			}},
		},
	}
	if raw {
		spec["resultType"] = "Raw"
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "generators.external-secrets.io/v1alpha1", "kind": "VaultDynamicSecret",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec,
	}}
}

// ExternalSecretCluster creates a RedisCluster in ExternalSecret mode, with one Redis node of Redis 7.0 (as
// f.RedisCluster does in VaultLease mode), deleted when the test ends.
func (f *Framework) ExternalSecretCluster(t testing.TB, ns, name string, src v1beta1.ExternalSecretSource, opts ...ClusterOption) *v1beta1.RedisCluster {
	t.Helper()
	rc := &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1beta1.RedisClusterSpec{
			Replicas: 1, Version: RedisVersion,
			Credentials: v1beta1.CredentialsSpec{Source: v1beta1.SourceExternalSecret, ExternalSecret: &src},
		},
	}
	for _, o := range opts {
		o(rc)
	}
	f.Create(t, rc)
	return rc
}
