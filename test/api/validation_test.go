package api

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	krender "github.com/keyroll/keyroll/controllers/render"
)

const validRedisCluster = `
apiVersion: keyroll.dev/v1beta1
kind: RedisCluster
spec:
  replicas: 3
  credentials:
    source: VaultLease
    vaultLease:
      connectionRef: {name: vault}
      path: database/creds/orders
  rotation:
    schedule: "@every 6h"
  rollout:
    readinessTimeout: 2m
    consumers:
    - {kind: Deployment, name: api}
`

const validExternalSecretCluster = `
apiVersion: keyroll.dev/v1beta1
kind: RedisCluster
spec:
  credentials:
    source: ExternalSecret
    externalSecret:
      storeRef: {name: vault, kind: ClusterSecretStore}
      remoteKey: database/creds/orders
`

const validVaultConnection = `
apiVersion: keyroll.dev/v1beta1
kind: VaultConnection
spec:
  address: https://vault.example:8200
  auth:
    kubernetes: {role: keyroll}
  allowedNamespaces: [default]
  allowedPaths: ["database/creds/{namespace}", "database/creds/{namespace}.*"]
`

// aclSyntax is how the API server names the field and the rule when the aclRules rule-syntax
// rule refuses an ACL rule.
const aclSyntax = "spec.credentials.aclRules: Invalid value: aclRules: each rule must be"

// invalidCase changes a valid object into an invalid one; the API server must refuse it with an
// error that names field.
type invalidCase struct {
	base   string
	change func(obj map[string]any)
	field  string
}

func TestInvalidObjectsAreRefusedNamingTheField(t *testing.T) {
	rc, es, vc := validRedisCluster, validExternalSecretCluster, validVaultConnection
	cases := map[string]invalidCase{
		"zero replicas":                       {rc, set("spec.replicas", int64(0)), "spec.replicas"},
		"too many replicas":                   {rc, set("spec.replicas", int64(16)), "spec.replicas"},
		"image with a tag":                    {rc, set("spec.image", "redis:7.2"), "spec.image"},
		"version not a version":               {rc, set("spec.version", "latest"), "spec.version"},
		"version without ACLs":                {rc, set("spec.version", "5.0"), "spec.version"},
		"version without FAILOVER":            {rc, set("spec.version", "6.0.16"), "spec.version"},
		"network policy peer not a peer":      {rc, set("spec.networkPolicy", map[string]any{"enabled": true, "from": []any{"everyone"}}), "spec.networkPolicy.from"},
		"no credentials":                      {rc, del("spec.credentials"), "spec.credentials"},
		"unknown source":                      {rc, set("spec.credentials.source", "Vault"), "spec.credentials.source"},
		"VaultLease source without block":     {rc, del("spec.credentials.vaultLease"), "spec.credentials"},
		"VaultLease with externalSecret":      {rc, set("spec.credentials.externalSecret", map[string]any{"generatorRef": map[string]any{"name": "g"}}), "spec.credentials"},
		"ExternalSecret source without block": {rc, set("spec.credentials.source", "ExternalSecret"), "spec.credentials"},
		"empty Vault path":                    {rc, set("spec.credentials.vaultLease.path", ""), "spec.credentials.vaultLease.path"},
		"absolute Vault path":                 {rc, set("spec.credentials.vaultLease.path", "/database/creds/orders"), "spec.credentials.vaultLease.path"},
		"Vault path climbing out":             {rc, set("spec.credentials.vaultLease.path", "database/creds/../../sys/raw"), "spec.credentials.vaultLease.path"},
		"renewal percent too low":             {rc, set("spec.credentials.vaultLease.renewalPercent", int64(5)), "spec.credentials.vaultLease.renewalPercent"},
		"renewal percent too high":            {rc, set("spec.credentials.vaultLease.renewalPercent", int64(95)), "spec.credentials.vaultLease.renewalPercent"},
		"negative minTTL":                     {rc, set("spec.credentials.vaultLease.minTTL", "-1m"), "spec.credentials.vaultLease.minTTL"},
		"connection name not a name":          {rc, set("spec.credentials.vaultLease.connectionRef.name", "Vault_1"), "spec.credentials.vaultLease.connectionRef.name"},
		"same key for user and password":      {rc, set("spec.credentials.passwordKey", "username"), "spec.credentials"},
		"secret name not a name":              {rc, set("spec.credentials.secretName", "Bad_Name"), "spec.credentials.secretName"},
		"ACL rule sets a password":            {rc, set("spec.credentials.aclRules", []any{"~*", ">secret"}), "spec.credentials.aclRules"},
		"ACL rule turns the user off":         {rc, set("spec.credentials.aclRules", []any{"off"}), "spec.credentials.aclRules"},
		"no ACL rules":                        {rc, set("spec.credentials.aclRules", []any{}), "spec.credentials.aclRules"},
		"ACL rule a bare word":                {rc, set("spec.credentials.aclRules", []any{"~*", "read"}), aclSyntax},
		"ACL category without a name":         {rc, set("spec.credentials.aclRules", []any{"+@"}), aclSyntax},
		"ACL category not lower case":         {rc, set("spec.credentials.aclRules", []any{"+@Read"}), aclSyntax},
		"ACL key pattern without a pattern":   {rc, set("spec.credentials.aclRules", []any{"~"}), aclSyntax},
		"ACL channel pattern without pattern": {rc, set("spec.credentials.aclRules", []any{"&"}), aclSyntax},
		"ACL key permission unknown":          {rc, set("spec.credentials.aclRules", []any{"%X~app:*"}), aclSyntax},
		"ACL command with empty subcommand":   {rc, set("spec.credentials.aclRules", []any{"+config|"}), aclSyntax},
		"empty schedule":                      {rc, set("spec.rotation.schedule", ""), "spec.rotation.schedule"},
		"schedule not cron":                   {rc, set("spec.rotation.schedule", "every day"), "spec.rotation.schedule"},
		"window start not a time":             {rc, set("spec.rotation.maintenanceWindow", map[string]any{"start": "25:00", "duration": "1h"}), "spec.rotation.maintenanceWindow.start"},
		"window too short":                    {rc, set("spec.rotation.maintenanceWindow", map[string]any{"start": "02:00", "duration": "1m"}), "spec.rotation.maintenanceWindow.duration"},
		"readiness timeout too short":         {rc, set("spec.rollout.readinessTimeout", "1s"), "spec.rollout.readinessTimeout"},
		"readiness timeout too long":          {rc, set("spec.rollout.readinessTimeout", "2h"), "spec.rollout.readinessTimeout"},
		"unlisted clients' grace too long":    {rc, set("spec.rollout.unlistedClients", map[string]any{"action": "Proceed", "grace": "25h"}), "spec.rollout.unlistedClients.grace"},
		"unlisted clients held too long":      {rc, set("spec.rollout.unlistedClients", map[string]any{"maxHold": "169h"}), "spec.rollout.unlistedClients.maxHold"},
		"unlisted clients held too briefly":   {rc, set("spec.rollout.unlistedClients", map[string]any{"maxHold": "30s"}), "spec.rollout.unlistedClients.maxHold"},
		"unlisted clients' unknown action":    {rc, set("spec.rollout.unlistedClients", map[string]any{"action": "Kill"}), "spec.rollout.unlistedClients.action"},
		"consumer of unknown kind":            {rc, set("spec.rollout.consumers", []any{map[string]any{"kind": "Job", "name": "x"}}), "spec.rollout.consumers[0].kind"},
		"duplicate consumer": {rc, set("spec.rollout.consumers", []any{
			map[string]any{"kind": "Deployment", "name": "x"}, map[string]any{"kind": "Deployment", "name": "x"}}), "spec.rollout.consumers[1]"},
		"unknown deletion policy":  {rc, set("spec.deletionPolicy", "Delete"), "spec.deletionPolicy"},
		"zero storage":             {rc, set("spec.storage", map[string]any{"size": "0"}), "spec.storage.size"},
		"unknown podAntiAffinity":  {rc, set("spec.podAntiAffinity", "Soft"), "spec.podAntiAffinity"},
		"remote key and generator": {es, set("spec.credentials.externalSecret.generatorRef", map[string]any{"name": "g"}), "spec.credentials.externalSecret"},
		"remote key without store": {es, del("spec.credentials.externalSecret.storeRef"), "spec.credentials.externalSecret"},
		"unknown store kind":       {es, set("spec.credentials.externalSecret.storeRef.kind", "Store"), "spec.credentials.externalSecret.storeRef.kind"},
		"unknown generator kind": {es, func(o map[string]any) {
			del("spec.credentials.externalSecret.storeRef")(o)
			del("spec.credentials.externalSecret.remoteKey")(o)
			set("spec.credentials.externalSecret.generatorRef", map[string]any{"kind": "Password", "name": "g"})(o)
		}, "spec.credentials.externalSecret.generatorRef.kind"},
		"unknown refresh policy": {es, set("spec.credentials.externalSecret.refreshPolicy", "Never"), "spec.credentials.externalSecret.refreshPolicy"},
		"negative refresh":       {es, set("spec.credentials.externalSecret.refreshInterval", "-1h"), "spec.credentials.externalSecret.refreshInterval"},
		"refresh not shorter than the credential": {es, func(o map[string]any) {
			set("spec.credentials.externalSecret.refreshInterval", "1h")(o)
			set("spec.credentials.externalSecret.credentialLifetime", "1h")(o)
		}, "spec.credentials.externalSecret"},
		"zero credential lifetime":   {es, set("spec.credentials.externalSecret.credentialLifetime", "0s"), "spec.credentials.externalSecret.credentialLifetime"},
		"connection without name":    {es, set("spec.credentials.externalSecret.connectionRef", map[string]any{}), "spec.credentials.externalSecret.connectionRef.name"},
		"address not a URL":          {vc, set("spec.address", "vault:8200"), "spec.address"},
		"address without a host":     {vc, set("spec.address", "http://"), "spec.address"},
		"name too long for its pods": {rc, set("metadata.name", strings.Repeat("a", 53)), "metadata.name must be at most 52"},
		"credentials Secret named as the ACL Secret": {rc, func(o map[string]any) {
			set("metadata.name", "orders")(o)
			set("spec.credentials.secretName", "orders-acl")(o)
		}, "spec.credentials.secretName"},
		"credentials Secret named as the TLS Secret": {rc, func(o map[string]any) {
			set("metadata.name", "orders")(o)
			set("spec.credentials.secretName", "orders-tls")(o)
		}, "spec.credentials.secretName"},
		"client certificates with keyroll's CA": {rc, set("spec.tls", map[string]any{"clientAuth": "Required"}), "spec.tls.clientAuth"},
		"client certificates with Vault's plugin": {rc, func(o map[string]any) {
			set("spec.tls", map[string]any{"clientAuth": "Required", "certificateSecretRef": map[string]any{"name": "c"}})(o)
			set("spec.vaultPlugin", map[string]any{"username": "vault"})(o)
		}, "spec.tls.clientAuth"},
		"client certificates asked for by another name": {rc, set("spec.tls", map[string]any{"clientAuth": "Optional", "certificateSecretRef": map[string]any{"name": "c"}}), "spec.tls.clientAuth"},
		"credentials Secret named as the TLS CA's": {rc, func(o map[string]any) {
			set("metadata.name", "orders")(o)
			set("spec.credentials.secretName", "orders-tls-ca")(o)
		}, "spec.credentials.secretName"},
		"TLS certificate Secret not a name": {rc, set("spec.tls", map[string]any{"certificateSecretRef": map[string]any{"name": "Bad_Name"}}), "spec.tls.certificateSecretRef.name"},
		"no auth method":                    {vc, set("spec.auth", map[string]any{}), "spec.auth"},
		"two auth methods":                  {vc, set("spec.auth.token", map[string]any{"secretRef": map[string]any{"namespace": "a", "name": "b", "key": "c"}}), "spec.auth"},
		"kubernetes auth without role":      {vc, del("spec.auth.kubernetes.role"), "spec.auth.kubernetes.role"},
		"token lifetime too short":          {vc, set("spec.auth.kubernetes.tokenExpirationSeconds", int64(60)), "spec.auth.kubernetes.tokenExpirationSeconds"},
		"appRole without secret id": {vc, func(o map[string]any) {
			set("spec.auth", map[string]any{"appRole": map[string]any{"roleID": "r"}})(o)
		}, "spec.auth.appRole.secretIDRef"},
		"token secret without namespace": {vc, func(o map[string]any) {
			set("spec.auth", map[string]any{"token": map[string]any{"secretRef": map[string]any{"name": "b", "key": "c"}}})(o)
		}, "spec.auth.token.secretRef.namespace"},
		"wildcard with other namespaces": {vc, set("spec.allowedNamespaces", []any{"*", "default"}), "spec.allowedNamespaces"},
		"allowed namespace not a name":   {vc, set("spec.allowedNamespaces", []any{"Bad NS"}), "spec.allowedNamespaces[0]"},
		"allowed path ambiguous":         {vc, set("spec.allowedPaths", []any{"database/creds/{namespace}-*"}), "spec.allowedPaths"},
		"namespace identity without kubernetes auth": {vc, func(o map[string]any) {
			set("spec.identity", "Namespace")(o)
			set("spec.auth", map[string]any{"token": map[string]any{"secretRef": map[string]any{"namespace": "keyroll-system", "name": "t", "key": "token"}}})(o)
		}, "spec"},
		"role placeholder without namespace identity": {vc, set("spec.auth.kubernetes.role", "keyroll-{namespace}"), "spec"},
		"unknown identity":                            {vc, set("spec.identity", "Team"), "spec.identity"},
		"allowed path with ..":                        {vc, set("spec.allowedPaths", []any{"database/creds/../{namespace}"}), "spec.allowedPaths"},
		"allowed path wildcard inside":                {vc, set("spec.allowedPaths", []any{"database/*/{namespace}"}), "spec.allowedPaths[0]"},
		"allowed path other placeholder":              {vc, set("spec.allowedPaths", []any{"database/creds/{name}"}), "spec.allowedPaths[0]"},
		"burst below qps":                             {vc, set("spec.rateLimit", map[string]any{"qps": int64(50), "burst": int64(10)}), "spec.rateLimit"},
		"zero qps":                                    {vc, set("spec.rateLimit", map[string]any{"qps": int64(0), "burst": int64(10)}), "spec.rateLimit.qps"},
		"two CA sources": {vc, set("spec.tls", map[string]any{"caBundle": "-----BEGIN CERTIFICATE-----",
			"caSecretRef": map[string]any{"namespace": "a", "name": "b", "key": "ca.crt"}}), "spec.tls"},
		"CA bundle not PEM":       {vc, set("spec.tls", map[string]any{"caBundle": "not a certificate"}), "spec.tls.caBundle"},
		"Vault namespace invalid": {vc, set("spec.namespace", "bad ns!"), "spec.namespace"},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d invalid cases", len(cases))
	}
	ctx := context.Background()
	ns := fw.Namespace(t, "invalid")
	i := 0
	for name, tc := range cases {
		i++
		t.Run(name, func(t *testing.T) {
			obj := parse(t, tc.base, ns)
			obj.SetName(fw.Name(fmt.Sprintf("invalid-%d", i))) // VaultConnections are cluster-scoped
			tc.change(obj.Object)
			err := fw.Client.Create(ctx, obj)
			if err == nil {
				_ = fw.Client.Delete(ctx, obj)
				t.Fatalf("the API server accepted the object")
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("the error does not name %s: %v", tc.field, err)
			}
		})
	}
}

// The credential source cannot change: the leases of one source are not the other's to manage.
func TestCredentialSourceCannotBeChanged(t *testing.T) {
	ctx := context.Background()
	obj := parse(t, validRedisCluster, fw.Namespace(t, "source-change"))
	obj.SetName("source-change")
	if err := fw.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Client.Delete(ctx, obj) })
	es := parse(t, validExternalSecretCluster, obj.GetNamespace())
	credentials, _, _ := unstructured.NestedMap(es.Object, "spec", "credentials")
	if err := unstructured.SetNestedMap(obj.Object, credentials, "spec", "credentials"); err != nil {
		t.Fatal(err)
	}
	err := fw.Client.Update(ctx, obj)
	if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "credentials.source cannot be changed") {
		t.Fatalf("changing credentials.source: want Invalid naming credentials.source, got %v", err)
	}
}

// spec.storage becomes the StatefulSet's volume claim templates, which a StatefulSet cannot
// change: adding, removing or changing it after creation is refused, naming the field, and an
// update that leaves it alone is accepted.
func TestStorageChangeIsRefused(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "storage")
	size := func(q string) func(map[string]any) {
		return set("spec.storage", map[string]any{"size": q})
	}
	for name, tc := range map[string]struct{ create, change func(map[string]any) }{
		"added":                {func(map[string]any) {}, size("1Gi")},
		"removed":              {size("1Gi"), del("spec.storage")},
		"resized":              {size("1Gi"), size("2Gi")},
		"another storageClass": {size("1Gi"), set("spec.storage.storageClassName", "fast")},
	} {
		t.Run(name, func(t *testing.T) {
			obj := parse(t, validRedisCluster, ns)
			obj.SetName("storage-" + strings.ReplaceAll(strings.ToLower(name), " ", "-"))
			tc.create(obj.Object)
			if err := fw.Client.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fw.Client.Delete(ctx, obj) })
			set("spec.replicas", int64(5))(obj.Object) // a change that is allowed
			if err := fw.Client.Update(ctx, obj); err != nil {
				t.Fatalf("an update that leaves spec.storage alone was refused: %v", err)
			}
			tc.change(obj.Object)
			err := fw.Client.Update(ctx, obj)
			if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.storage") || !strings.Contains(err.Error(), "create a new RedisCluster") {
				t.Fatalf("storage %s: want Invalid naming spec.storage, got %v", name, err)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// Turning TLS on or off on a live cluster would cut every client off at once (they connect with
// TLS or without, not both): it is refused, naming spec.tls; the certificate's Secret may change.
func TestTLSCannotBeTurnedOnOrOff(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "tls")
	withTLS := set("spec.tls", map[string]any{"certificateSecretRef": map[string]any{"name": "orders-cert"}})
	for name, tc := range map[string]struct{ create, change func(map[string]any) }{
		"turned on":                           {func(map[string]any) {}, withTLS},
		"turned off":                          {withTLS, del("spec.tls")},
		"own CA to the owner's":               {set("spec.tls", map[string]any{}), withTLS},
		"the owner's to own CA":               {withTLS, set("spec.tls", map[string]any{})},
		"client certificates asked for later": {withTLS, set("spec.tls.clientAuth", "Required")},
	} {
		t.Run(name, func(t *testing.T) {
			obj := parse(t, validRedisCluster, ns)
			obj.SetName("tls-" + strings.NewReplacer(" ", "-", "'", "").Replace(strings.ToLower(name)))
			tc.create(obj.Object)
			if err := fw.Client.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fw.Client.Delete(ctx, obj) })
			tc.change(obj.Object)
			err := fw.Client.Update(ctx, obj)
			if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.tls") || !strings.Contains(err.Error(), "create a new RedisCluster") {
				t.Logf("object: %v", obj.Object["spec"])
				t.Fatalf("TLS %s: want Invalid naming spec.tls, got %v", name, err)
			}
			t.Logf("refused: %v", err)
		})
	}
	obj := parse(t, validRedisCluster, ns)
	obj.SetName("tls-new-secret")
	withTLS(obj.Object)
	if err := fw.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Client.Delete(ctx, obj) })
	set("spec.tls.certificateSecretRef.name", "orders-cert-2")(obj.Object)
	if err := fw.Client.Update(ctx, obj); err != nil {
		t.Fatalf("another certificate Secret was refused: %v", err)
	}
}

func TestValidBasesAreAccepted(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "valid")
	for i, base := range []string{validRedisCluster, validExternalSecretCluster, validVaultConnection} {
		obj := parse(t, base, ns)
		obj.SetName(fw.Name(fmt.Sprintf("valid-%d", i))) // VaultConnections are cluster-scoped
		if err := fw.Client.Create(ctx, obj); err != nil {
			t.Fatalf("valid base %d refused: %v", i, err)
		}
		if err := fw.Client.Delete(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
}

// TestACLRulesOfEveryKindAreAccepted keeps the rule-syntax rule from refusing what Redis accepts:
// one rule of each kind it names.
func TestACLRulesOfEveryKindAreAccepted(t *testing.T) {
	ctx := context.Background()
	obj := parse(t, validRedisCluster, fw.Namespace(t, "acl-rules"))
	obj.SetName("acl-rules")
	rules := []any{"~app:*", "%R~ro:*", "%W~wo:*", "%RW~rw:*", "&news.*", "+@read", "-@dangerous",
		"+client|setname", "-flushall", "allkeys", "allchannels", "allcommands", "nocommands", "resetkeys", "resetchannels"}
	set("spec.credentials.aclRules", rules)(obj.Object)
	if err := fw.Client.Create(ctx, obj); err != nil {
		t.Fatalf("valid ACL rules refused: %v", err)
	}
	if err := fw.Client.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultsAreApplied(t *testing.T) {
	ctx := context.Background()
	obj := parse(t, validRedisCluster, fw.Namespace(t, "defaults"))
	obj.SetName("defaults")
	if err := fw.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Client.Delete(ctx, obj) })
	want := map[string]any{
		"spec.image":                                 "docker.io/library/redis",
		"spec.version":                               "7.2",
		"spec.deletionPolicy":                        "Revoke",
		"spec.podAntiAffinity":                       "Preferred",
		"spec.credentials.usernameKey":               "username",
		"spec.credentials.passwordKey":               "password",
		"spec.credentials.vaultLease.renewalPercent": int64(67),
		"spec.credentials.vaultLease.minTTL":         "1m",
	}
	for path, v := range want {
		got, _, _ := unstructured.NestedFieldNoCopy(obj.Object, strings.Split(path, ".")...)
		if got != v {
			t.Errorf("%s defaulted to %v, want %v", path, got, v)
		}
	}
	rules, _, _ := unstructured.NestedStringSlice(obj.Object, "spec", "credentials", "aclRules")
	if strings.Join(rules, " ") != "~* &* +@all" {
		t.Errorf("aclRules defaulted to %v", rules)
	}
}

// parse reads one of the valid bases; a RedisCluster goes into the namespace ns.
func parse(t *testing.T, doc, ns string) *unstructured.Unstructured {
	t.Helper()
	obj := map[string]any{}
	if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	if u.GetKind() == "RedisCluster" {
		u.SetNamespace(ns)
	}
	return u
}

// set returns a change that sets the dotted path to v, creating maps on the way.
func set(path string, v any) func(map[string]any) {
	return func(obj map[string]any) {
		keys := strings.Split(path, ".")
		m := obj
		for _, k := range keys[:len(keys)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		m[keys[len(keys)-1]] = v
	}
}

// del returns a change that removes the dotted path.
func del(path string) func(map[string]any) {
	return func(obj map[string]any) {
		unstructured.RemoveNestedField(obj, strings.Split(path, ".")...)
	}
}

// Rules that grant the application user one of the commands keyroll keeps for itself by name (or
// the whole @admin category) are refused at admission, naming the field and the rule, each of
// them: the walk is derived from keyroll's AppDenyRules, so that a command added there is walked
// too. With spec.credentials.unsafeAllowAdminCommands the owner takes them knowingly.
func TestACLRulesGrantingKeyrollsCommandsAreRefused(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "acl-admin")
	var rules []string
	for _, deny := range krender.AppDenyRules {
		cmd := strings.TrimPrefix(deny, "-")
		rules = append(rules, "+"+cmd, "+"+cmd+"|anything")
	}
	rules = append(rules, "+@admin")
	for i, rule := range rules {
		obj := parse(t, validRedisCluster, ns)
		obj.SetName(fmt.Sprintf("admin-%d", i))
		set("spec.credentials.aclRules", []any{"~*", "+@all", rule})(obj.Object)
		err := fw.Client.Create(ctx, obj)
		if err == nil {
			_ = fw.Client.Delete(ctx, obj)
			t.Errorf("aclRules with %s accepted", rule)
			continue
		}
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.credentials.aclRules: Forbidden: spec.credentials.aclRules: "+rule+" would let the application user") {
			t.Errorf("aclRules with %s: %v; want Forbidden naming the field and the rule", rule, err)
		}
		set("spec.credentials.unsafeAllowAdminCommands", true)(obj.Object)
		if err := fw.Client.Create(ctx, obj); err != nil {
			t.Errorf("aclRules with %s and unsafeAllowAdminCommands refused: %v", rule, err)
		} else if err := fw.Client.Delete(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d rules refused", len(rules))
}

// Every version the pattern admits evaluates in the CEL rule that asks for 6.2 or later: a
// suffixed tag (6.2-alpine), a patch version, the widest numbers. The pattern's edges: what it
// admits is accepted or refused by the rule's message, never by an evaluation error.
func TestVersionEdgesEvaluate(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "version-edges")
	cases := map[string]bool{
		"6.2": true, "6.2-alpine": true, "6.2.14-bookworm": true, "7.0.15": true, "10.0": true, "9999.9999.9999-x": true,
		"6.1": false, "6.1-alpine": false, "5.0.14": false, "0.0": false, "0000.0001": false,
	}
	i := 0
	for version, ok := range cases {
		i++
		obj := parse(t, validRedisCluster, ns)
		obj.SetName(fmt.Sprintf("version-%d", i))
		set("spec.version", version)(obj.Object)
		err := fw.Client.Create(ctx, obj)
		switch {
		case ok && err != nil:
			t.Errorf("version %s refused: %v", version, err)
		case !ok && err == nil:
			t.Errorf("version %s accepted", version)
		case !ok && !strings.Contains(err.Error(), "version: Redis 6.2 or later is required"):
			t.Errorf("version %s refused without the rule's message: %v", version, err)
		}
		if err == nil {
			if err := fw.Client.Delete(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, version := range []string{"12345.0", "7", "7.2.", "7.2-", "7.2-Alpine", "v7.2"} {
		obj := parse(t, validRedisCluster, ns)
		obj.SetName("version-pattern")
		set("spec.version", version)(obj.Object)
		if err := fw.Client.Create(ctx, obj); err == nil || !strings.Contains(err.Error(), "spec.version") || strings.Contains(err.Error(), "evaluat") {
			t.Errorf("version %s: %v; want refused by the pattern, naming spec.version", version, err)
			_ = fw.Client.Delete(ctx, obj)
		}
	}
}

// A duration field's value that is no duration ("10 minutes", "1d", "") is refused by the field's
// pattern, naming the field, and never reaches a CEL rule that could not evaluate it.
func TestDurationEdgesEvaluate(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "duration-edges")
	fields := []struct {
		base, path, valid string
	}{
		{validRedisCluster, "spec.credentials.vaultLease.minTTL", "90s"},
		{validRedisCluster, "spec.rollout.readinessTimeout", "1m30s"},
		{validRedisCluster, "spec.rollout.unlistedClients.grace", "30s"},
		{validRedisCluster, "spec.rollout.unlistedClients.maxHold", "30m"},
		{validExternalSecretCluster, "spec.credentials.externalSecret.refreshInterval", "1h"},
		{validExternalSecretCluster, "spec.credentials.externalSecret.credentialLifetime", "2h"},
		{validVaultConnection, "spec.orphanLeases.gracePeriod", "1m"},
		{validVaultConnection, "spec.orphanLeases.interval", "10m"},
	}
	i := 0
	for _, f := range fields {
		for _, v := range []string{f.valid, "10 minutes", "1d", "", "5", "-"} {
			i++
			obj := parse(t, f.base, ns)
			obj.SetName(fw.Name(fmt.Sprintf("duration-%d", i)))
			set(f.path, v)(obj.Object)
			err := fw.Client.Create(ctx, obj)
			switch {
			case v == f.valid && err != nil:
				t.Errorf("%s %q refused: %v", f.path, v, err)
			case v != f.valid && err == nil:
				t.Errorf("%s %q accepted", f.path, v)
			case v != f.valid && (!strings.Contains(err.Error(), f.path) || strings.Contains(err.Error(), "evaluat")):
				t.Errorf("%s %q: %v; want refused naming the field, without an evaluation error", f.path, v, err)
			}
			if err == nil {
				_ = fw.Client.Delete(ctx, obj)
			}
		}
	}
}
