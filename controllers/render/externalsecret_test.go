package render

import (
	"encoding/json"
	"strings"
	"testing"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

func esRedisCluster(src v1beta1.ExternalSecretSource) *v1beta1.RedisCluster {
	return &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "u1"},
		Spec: v1beta1.RedisClusterSpec{Credentials: v1beta1.CredentialsSpec{
			Source: v1beta1.SourceExternalSecret, ExternalSecret: &src, UsernameKey: "user", PasswordKey: "pass",
		}},
	}
}

func syncedSecret(data map[string]string) *corev1.Secret {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "orders-credentials"}, Data: map[string][]byte{}}
	for k, v := range data {
		sec.Data[k] = []byte(v)
	}
	return sec
}

func TestParseSyncedReadsPlainAndRawSecrets(t *testing.T) {
	rc := esRedisCluster(v1beta1.ExternalSecretSource{GeneratorRef: &v1beta1.GeneratorReference{Name: "g"}})
	plain, problem := ParseSynced(syncedSecret(map[string]string{"user": "app", "pass": "s3cret"}), rc)
	if plain == nil || plain.Username != "app" || plain.Password != "s3cret" || plain.LeaseID != "" {
		t.Fatalf("plain Secret: %+v, %q", plain, problem)
	}
	raw, problem := ParseSynced(syncedSecret(map[string]string{
		"data": `{"username":"v-user","password":"p@ss"}`, "lease_id": "database/creds/orders/abc",
		"lease_duration": "3600", "renewable": "true", "request_id": "r",
	}), rc)
	if raw == nil || raw.Username != "v-user" || raw.Password != "p@ss" || raw.LeaseID != "database/creds/orders/abc" ||
		raw.LeaseDuration != time.Hour || !raw.Renewable {
		t.Fatalf("raw Secret: %+v, %q", raw, problem)
	}
	if raw.Version != CredentialVersion("v-user", "p@ss") {
		t.Errorf("version %s is not the credential's", raw.Version)
	}
	for name, data := range map[string]map[string]string{
		"no keys":           {"other": "x"},
		"empty password":    {"user": "app", "pass": ""},
		"raw data not JSON": {"data": "{", "lease_id": "l", "lease_duration": "1"},
		"raw bad duration":  {"data": `{"username":"u","password":"p"}`, "lease_id": "l", "lease_duration": "soon"},
		"invalid user name": {"user": "bad user", "pass": "x"},
	} {
		sc, problem := ParseSynced(syncedSecret(data), rc)
		if sc != nil || !strings.Contains(problem, "orders-credentials") {
			t.Errorf("%s: got %+v, problem %q; want a problem naming the Secret", name, sc, problem)
		}
		if strings.Contains(problem, "s3cret") || strings.Contains(problem, `"p"`) {
			t.Errorf("%s: the problem shows a password: %q", name, problem)
		}
	}
}

func TestBuildExternalSecretFromGeneratorAndFromStore(t *testing.T) {
	hour := &metav1.Duration{Duration: time.Hour}
	rc := esRedisCluster(v1beta1.ExternalSecretSource{
		GeneratorRef:    &v1beta1.GeneratorReference{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis"},
		RefreshInterval: hour, RefreshPolicy: "Periodic",
	})
	es := ExternalSecret(rc)
	if es.Name != "orders" || es.Namespace != "shop" || es.Spec.Target.Name != "orders-eso" || es.Spec.Target.CreationPolicy != "Owner" {
		t.Fatalf("ExternalSecret %s/%s targets %+v", es.Namespace, es.Name, es.Spec.Target)
	}
	if g := es.Spec.DataFrom[0].SourceRef.GeneratorRef; g == nil || g.Kind != "VaultDynamicSecret" || g.Name != "redis" {
		t.Errorf("generatorRef %+v", g)
	}
	if es.Spec.RefreshInterval != hour || es.Spec.RefreshPolicy != "Periodic" {
		t.Errorf("refresh %v %s", es.Spec.RefreshInterval, es.Spec.RefreshPolicy)
	}
	tpl := es.Spec.Target.Template
	if tpl.MergePolicy != "Merge" || tpl.Metadata.Labels[v1beta1.LabelCluster] != "orders" ||
		tpl.Metadata.Labels[v1beta1.LabelManagedBy] != v1beta1.ManagedByValue {
		t.Errorf("template %+v", tpl)
	}
	if _, ok := tpl.Data["user"]; !ok || tpl.Data["pass"] == "" {
		t.Errorf("template data keys %v, want credentials.usernameKey and passwordKey", tpl.Data)
	}
	if _, ok := es.Annotations[v1beta1.AnnotationRefreshRequested]; ok {
		t.Errorf("annotations %v: the refresh request is a patch of its own, not part of the applied spec", es.Annotations)
	}

	store := esRedisCluster(v1beta1.ExternalSecretSource{
		StoreRef: &v1beta1.StoreReference{Kind: "ClusterSecretStore", Name: "vault"}, RemoteKey: "database/creds/orders",
	})
	es = ExternalSecret(store)
	if es.Spec.SecretStoreRef.Kind != "ClusterSecretStore" || es.Spec.SecretStoreRef.Name != "vault" ||
		es.Spec.DataFrom[0].Extract == nil || es.Spec.DataFrom[0].Extract.Key != "database/creds/orders" {
		t.Errorf("store source: %+v %+v", es.Spec.SecretStoreRef, es.Spec.DataFrom)
	}
}

// The template keyroll gives ESO picks the field from the raw response's JSON, or takes it as it
// is; rendered here with text/template and a fromJson like sprig's (ESO renders it for real in the
// integration tests).
func TestCredentialFieldTemplateHandlesRawAndPlainData(t *testing.T) {
	funcs := template.FuncMap{"fromJson": func(s string) map[string]any {
		out := map[string]any{}
		_ = json.Unmarshal([]byte(s), &out)
		return out
	}}
	tpl := template.Must(template.New("f").Funcs(funcs).Parse(credentialField("username")))
	for name, tc := range map[string]struct {
		data map[string]string
		want string
	}{
		"raw":   {map[string]string{"data": `{"username":"v-user","password":"p"}`, "lease_id": "l"}, "v-user"},
		"plain": {map[string]string{"username": "app", "password": "p"}, "app"},
	} {
		var b strings.Builder
		if err := tpl.Execute(&b, tc.data); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b.String() != tc.want {
			t.Errorf("%s: rendered %q, want %q", name, b.String(), tc.want)
		}
	}
}
