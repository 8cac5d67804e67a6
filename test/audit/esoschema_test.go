package audit

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
)

// TestExternalSecretObjectsMatchESOSchema creates, on the API server with the CRDs of the External
// Secrets Operator release the test ground runs, the ExternalSecret keyroll renders for each shape
// of spec.credentials.externalSecret, and the VaultDynamicSecrets the tests and the samples
// use, each with fieldValidation=Strict: a field of keyroll's narrow view of ESO's API
// (apis/externalsecrets) that ESO's schema does not have is refused. That it would be is shown
// with one misspelt field.
//
// Each RedisCluster is first created as a dry run, so that the rendering sees the API server's
// defaults, as the operator does.
func TestExternalSecretObjectsMatchESOSchema(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "eso-schema")
	duration := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	generator := func() *v1beta1.GeneratorReference {
		return &v1beta1.GeneratorReference{Kind: "VaultDynamicSecret", Name: "redis"}
	}
	shapes := map[string]v1beta1.CredentialsSpec{
		"a generator, defaults": {ExternalSecret: &v1beta1.ExternalSecretSource{GeneratorRef: generator()}},
		"a generator, refreshed on change": {ExternalSecret: &v1beta1.ExternalSecretSource{
			GeneratorRef: generator(), RefreshPolicy: "OnChange", RefreshInterval: duration(0)}},
		// CreatedOnce is also what keyroll renders while refreshes are paused (a full ledger).
		"a generator, created once": {ExternalSecret: &v1beta1.ExternalSecretSource{
			GeneratorRef:  &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis"},
			RefreshPolicy: "CreatedOnce"}},
		"a generator, leases tracked": {ExternalSecret: &v1beta1.ExternalSecretSource{
			GeneratorRef: generator(), ConnectionRef: &v1beta1.ConnectionReference{Name: "vault"},
			RefreshInterval: duration(15 * time.Minute), CredentialLifetime: duration(time.Hour)}},
		"a SecretStore key": {ExternalSecret: &v1beta1.ExternalSecretSource{
			StoreRef: &v1beta1.StoreReference{Name: "vault"}, RemoteKey: "database/creds/orders"}},
		"a ClusterSecretStore key, own keys": {UsernameKey: "REDIS_USER", PasswordKey: "REDIS_PASSWORD",
			ExternalSecret: &v1beta1.ExternalSecretSource{
				StoreRef: &v1beta1.StoreReference{Name: "vault", Kind: "ClusterSecretStore"}, RemoteKey: "database/creds/orders",
				RefreshInterval: duration(90 * time.Second)}},
	}
	var first *externalsecrets.ExternalSecret
	i := 0
	for shape, creds := range shapes {
		i++
		creds.Source = v1beta1.SourceExternalSecret
		rc := &v1beta1.RedisCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "schema-" + string(rune('a'+i))},
			Spec:       v1beta1.RedisClusterSpec{Replicas: 1, Credentials: creds},
		}
		if err := fw.Client.Create(ctx, rc, client.DryRunAll); err != nil {
			t.Fatalf("%s: the RedisCluster (dry run): %v", shape, err)
		}
		es := render.ExternalSecret(rc)
		if first == nil {
			first = es.DeepCopy()
		}
		if err := createStrict(ctx, t, es); err != nil {
			t.Errorf("%s: ESO's schema refuses the ExternalSecret keyroll renders: %v", shape, err)
		}
	}

	for _, raw := range []bool{true, false} {
		vds := fw.VaultDynamicSecretObject(ns, map[bool]string{true: "raw", false: "plain"}[raw], "orders", "eso-auth", raw)
		if err := createStrict(ctx, t, vds); err != nil {
			t.Errorf("ESO's schema refuses the VaultDynamicSecret (raw %v): %v", raw, err)
		}
	}

	// The check can fail: one misspelt field is refused, and named.
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(first)
	if err != nil {
		t.Fatal(err)
	}
	misspelt := &unstructured.Unstructured{Object: obj}
	misspelt.SetName("misspelt")
	misspelt.SetGroupVersionKind(externalsecrets.GroupVersion.WithKind(externalsecrets.Kind))
	target := obj["spec"].(map[string]any)["target"].(map[string]any)
	target["creationPolicyy"] = target["creationPolicy"]
	delete(target, "creationPolicy")
	err = createStrict(ctx, t, misspelt)
	if err == nil || !strings.Contains(err.Error(), "creationPolicyy") {
		t.Errorf("an ExternalSecret with a misspelt field: %v; want it refused, naming the field", err)
	}
}

// createStrict creates obj with fieldValidation=Strict: a field the schema does not know fails.
// What it creates is deleted when the test ends, so that ESO on the shared ground stops syncing it.
func createStrict(ctx context.Context, t *testing.T, obj client.Object) error {
	err := fw.Client.Create(ctx, obj, client.FieldValidation("Strict"))
	if err == nil {
		t.Cleanup(func() { _ = fw.Client.Delete(context.Background(), obj) })
	}
	return err
}
