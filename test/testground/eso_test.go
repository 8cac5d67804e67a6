package testground

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// The real External Secrets Operator syncs a dynamic Redis credential from the real Vault through
// a VaultDynamicSecret generator, and the credential authenticates against the real Redis.
func TestExternalSecretsSyncsAVaultCredential(t *testing.T) {
	g := StartT(t, Options{ExternalSecrets: true, Redis: true, Vault: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := g.Vault.ConfigureRedis(ctx, g.Redis, RedisRole{Name: "eso", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	cs := g.CP.Clientset
	token := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vault-token"},
		StringData: map[string]string{"token": g.Vault.RootToken}}
	if _, err := cs.CoreV1().Secrets("default").Create(ctx, token, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(g.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	generator := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "generators.external-secrets.io/v1alpha1", "kind": "VaultDynamicSecret",
		"metadata": map[string]any{"name": "redis-eso", "namespace": "default"},
		"spec": map[string]any{
			"path": "database/creds/eso", "method": "GET",
			"provider": map[string]any{"server": g.Vault.Addr,
				"auth": map[string]any{"tokenSecretRef": map[string]any{"name": "vault-token", "key": "token"}}},
		},
	}}
	external := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "external-secrets.io/v1", "kind": "ExternalSecret",
		"metadata": map[string]any{"name": "redis-eso", "namespace": "default"},
		"spec": map[string]any{
			"refreshInterval": "1h",
			"target":          map[string]any{"name": "eso-credentials"},
			"dataFrom": []any{map[string]any{"sourceRef": map[string]any{"generatorRef": map[string]any{
				"apiVersion": "generators.external-secrets.io/v1alpha1", "kind": "VaultDynamicSecret", "name": "redis-eso"}}}},
		},
	}}
	for gvr, obj := range map[schema.GroupVersionResource]*unstructured.Unstructured{
		{Group: "generators.external-secrets.io", Version: "v1alpha1", Resource: "vaultdynamicsecrets"}: generator,
		{Group: "external-secrets.io", Version: "v1", Resource: "externalsecrets"}:                      external,
	} {
		if _, err := dyn.Resource(gvr).Namespace("default").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for {
		s, err := cs.CoreV1().Secrets("default").Get(ctx, "eso-credentials", metav1.GetOptions{})
		if err == nil && len(s.Data["username"]) > 0 {
			user, pass := string(s.Data["username"]), string(s.Data["password"])
			if who, err := g.Redis.WhoAmI(user, pass); err != nil || who != user {
				t.Fatalf("the credential ESO synced does not authenticate: %q, %v", who, err)
			}
			t.Logf("ESO synced a working credential %s after the ExternalSecret was created", time.Since(start).Round(time.Millisecond))
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("ESO did not sync the Secret (last error %v); its log:\n%s", err, g.ExternalSecrets.Tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
