package dataplane

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// pointVaultAt configures, as a Vault administrator would, a connection of Vault's database
// engine to the RedisCluster's client Service as the plugin's user keyroll keeps on every node
// (its password from the Secret keyroll generated), and a role on it.
func pointVaultAt(t *testing.T, rc *v1alpha1.RedisCluster, role string) {
	t.Helper()
	ctx := context.Background()
	svc := &corev1.Service{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name}, svc); err != nil {
		t.Fatal(err)
	}
	conn := "cluster-" + rc.Namespace + "-" + rc.Name
	password := secretData(t, rc.Namespace, rc.Name+"-vault-plugin", "password")
	if password == "" {
		t.Fatal("keyroll generated no password for Vault's plugin user")
	}
	_, err := ground.Vault.Root.Logical().WriteWithContext(ctx, "database/config/"+conn, map[string]any{
		"plugin_name": "redis-database-plugin", "host": svc.Spec.ClusterIP, "port": 6379,
		"username": secretData(t, rc.Namespace, rc.Name+"-vault-plugin", "username"), "password": password,
		"allowed_roles": role, "verify_connection": true,
	})
	if err != nil {
		t.Fatalf("configuring Vault's connection to the cluster's Service: %v", err)
	}
	_, err = ground.Vault.Root.Logical().WriteWithContext(ctx, "database/roles/"+role, map[string]any{
		"db_name": conn, "creation_statements": `["~*", "&*", "+@all"]`, "default_ttl": "10m", "max_ttl": "1h",
	})
	if err != nil {
		t.Fatal(err)
	}
}

// With Vault's plugin pointed at the cluster's own Service, Vault creates the users on the primary
// and keyroll carries them to every node; `vault lease revoke` of the live lease cuts the user off
// on the primary at once (Vault deletes it there) and on every replica within the lease-check
// interval (keyroll, onRevokedOutside CutOff), and a new credential takes its place.
func TestVaultRevokeCutsTheCredentialOffEverywhere(t *testing.T) {
	namespace(t, "plugin")
	vaultConnection(t, "vault-plugin", "plugin")
	rc := redisCluster(t, "plugin", "cache", "vault-plugin", "database/creds/plugin-cache", 3, func(rc *v1alpha1.RedisCluster) {
		rc.Spec.VaultPlugin = &v1alpha1.VaultPluginSpec{Username: "vault"}
	})
	// The pods come up before there is a credential; until Vault is configured, its refusal is
	// reported.
	eventually(t, 3*time.Minute, func() string {
		if pods := redisPods(t, rc); len(pods) != 3 || !podReady(pods[2]) {
			return fmt.Sprintf("%d pods, the last not Ready yet", len(pods))
		}
		return ""
	})
	pointVaultAt(t, rc, "plugin-cache")
	rotateNow(t, rc, "vault-configured") // any change wakes a cluster that waits after a refusal
	cur := waitReady(t, rc, 2*time.Minute)
	pods := redisPods(t, rc)
	user, pass := published(t, rc)
	for _, p := range pods {
		if !accepts(podAddr(p), user, pass) {
			t.Fatalf("pod %s does not accept the user Vault created on the primary", p.Name)
		}
	}

	if err := ground.Vault.Root.Sys().Revoke(cur.Status.Credential.LeaseID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if accepts(podAddr(pods[0]), user, pass) {
		t.Error("the primary still accepts the user right after vault lease revoke")
	}
	gone := map[string]time.Duration{}
	eventually(t, leaseCheckInterval+30*time.Second, func() string {
		for _, p := range pods[1:] {
			if _, ok := gone[p.Name]; !ok && !accepts(podAddr(p), user, pass) {
				gone[p.Name] = time.Since(revoked)
			}
		}
		if len(gone) < 2 {
			return fmt.Sprintf("replicas that refuse the revoked user: %v", gone)
		}
		return ""
	})
	for name, after := range gone {
		t.Logf("replica %s refuses the revoked user %s after the revocation", name, after.Round(time.Millisecond))
		if after > leaseCheckInterval+5*time.Second {
			t.Errorf("replica %s refused it only %s after the revocation (lease-check interval %s)", name, after, leaseCheckInterval)
		}
	}
	eventually(t, time.Minute, func() string {
		u, p := published(t, rc)
		if u == user {
			return "no new credential published"
		}
		for _, pod := range pods {
			if !accepts(podAddr(pod), u, p) {
				return "pod " + pod.Name + " does not accept the new credential"
			}
		}
		return ""
	})
}
