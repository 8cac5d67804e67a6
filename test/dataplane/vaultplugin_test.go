package dataplane

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/docblocks"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// pointVaultAt runs the Vault administrators' guide's commands for a RedisCluster's own primary
// (its blocks tagged tag: "vault-plugin", or "vault-plugin-tls" for a TLS cluster), as written: a
// connection of Vault's database engine to the cluster's client Service as the plugin user
// keyroll keeps on every node, with the password keyroll generated, and a role
// <namespace>-<name> on it.
func pointVaultAt(t *testing.T, rc *v1beta1.RedisCluster, tag string) {
	t.Helper()
	svc := &corev1.Service{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name}, svc); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"KUBECONFIG=" + fw.Ground.CP.Kubeconfig, "PATH=" + testground.BinDir() + ":" + os.Getenv("PATH"),
		"VAULT_ADDR=" + fw.Ground.Vault.Addr, "VAULT_TOKEN=" + fw.Ground.Vault.RootToken,
		"CLUSTER_NS=" + rc.Namespace, "CLUSTER=" + rc.Name, "REDIS_SERVICE_HOST=" + svc.Spec.ClusterIP,
	}
	root := testground.RepoRoot()
	blocks := docblocks.Tagged(t, root, tag)
	for _, b := range blocks {
		docblocks.Run(t, b, root, env, time.Minute)
	}
}

// connectPlugin points a connection of Vault's database engine at a RedisCluster's client Service
// as its plugin user, with the password keyroll generated, and writes role on it (both named
// fw.Role(role.Name)): what the guide's commands do (pointVaultAt), for a role whose TTLs the test
// chooses. Then it wakes the cluster (vaultConfigured).
func connectPlugin(t *testing.T, rc *v1beta1.RedisCluster, role testground.RedisRole) {
	t.Helper()
	svc := &corev1.Service{}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), svc); err != nil {
		t.Fatal(err)
	}
	secret := rc.Name + "-vault-plugin"
	user, pass := fw.SecretData(rc.Namespace, secret, "username"), fw.SecretData(rc.Namespace, secret, "password")
	if user == "" || pass == "" {
		t.Fatalf("Secret %s/%s holds no plugin user", rc.Namespace, secret)
	}
	role.Name = fw.Role(role.Name)
	if err := fw.Ground.Vault.ConnectRedis(context.Background(), role.Name, svc.Spec.ClusterIP, 6379, user, pass, role); err != nil {
		t.Fatal(err)
	}
	vaultConfigured(t, rc)
}

// vaultConfigured wakes a cluster that waits after Vault's refusal (any change of it does), so that
// it asks Vault again at once. Not with rotate-now: a retry may have issued the credential
// meanwhile, and a rotation would then replace it, perhaps after WaitReady has returned it.
func vaultConfigured(t *testing.T, rc *v1beta1.RedisCluster) {
	t.Helper()
	fw.Annotate(t, rc, "test.keyroll.dev/vault-configured", time.Now().UTC().Format(time.RFC3339Nano))
}

// pluginCluster creates a RedisCluster "cache" with spec.vaultPlugin, and waits for its pods,
// which come up before its credential (Vault refuses it, and keyroll reports the refusal, until
// it is pointed at them). When the test ends it is deleted before its pods: its finalizer revokes
// its leases, and Vault deletes their users through the plugin, on the primary.
func pluginCluster(t *testing.T, ns, connection, path string, opts ...framework.ClusterOption) *v1beta1.RedisCluster {
	t.Helper()
	plugin := func(rc *v1beta1.RedisCluster) { rc.Spec.VaultPlugin = &v1beta1.VaultPluginSpec{Username: "vault"} }
	rc := fw.RedisCluster(t, ns, "cache", connection, path, append([]framework.ClusterOption{plugin}, opts...)...)
	t.Cleanup(func() { fw.DeleteAndWait(t, rc, time.Minute) })
	framework.Eventually(t, 3*time.Minute, func() string {
		pods := fw.RedisPods(t, rc)
		if len(pods) != int(rc.Spec.Replicas) || !framework.PodReady(&pods[len(pods)-1]) {
			return fmt.Sprintf("%d of %d pods, the last not Ready yet", len(pods), rc.Spec.Replicas)
		}
		return ""
	})
	return rc
}

// With Vault's plugin pointed at the cluster's own Service, Vault creates the users on the primary
// and keyroll carries them to every node; `vault lease revoke` of the live lease cuts the user off
// on the primary at once (Vault deletes it there) and on every replica within the lease-check
// interval (keyroll, onRevokedOutside CutOff), and a new credential takes its place.
func TestVaultRevokeCutsTheCredentialOffEverywhere(t *testing.T) {
	ns := fw.Namespace(t, "plugin")
	// The role the guide's commands make is named <namespace>.<name>, and the connection allows
	// each namespace the roles named after it, as the guide's tenancy section sets it up.
	vc := fw.VaultConnection(t, "vault-plugin", framework.Allow(ns), framework.Paths("database/creds/{namespace}.*"))
	rc := pluginCluster(t, ns, vc.Name, "database/creds/"+ns+".cache", framework.Replicas(3))
	pointVaultAt(t, rc, "vault-plugin")
	vaultConfigured(t, rc)
	cur := fw.WaitReady(t, rc, 2*time.Minute)
	pods := fw.RedisPods(t, rc)
	user, pass, _ := fw.Credentials(rc)
	for _, p := range pods {
		if !accepts(framework.PodAddr(&p), user, pass) {
			t.Fatalf("pod %s does not accept the user Vault created on the primary", p.Name)
		}
	}

	if err := fw.Ground.Vault.Root.Sys().Revoke(cur.Status.Credential.Lease.LeaseID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if accepts(framework.PodAddr(&pods[0]), user, pass) {
		t.Error("the primary still accepts the user right after vault lease revoke")
	}
	gone := map[string]time.Duration{}
	framework.Eventually(t, leaseCheckInterval+30*time.Second, func() string {
		for _, p := range pods[1:] {
			if _, ok := gone[p.Name]; !ok && !accepts(framework.PodAddr(&p), user, pass) {
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
	framework.Eventually(t, time.Minute, func() string {
		u, p, _ := fw.Credentials(rc)
		if u == user {
			return "no new credential published"
		}
		for _, pod := range pods {
			if !accepts(framework.PodAddr(&pod), u, p) {
				return "pod " + pod.Name + " does not accept the new credential"
			}
		}
		return ""
	})
}
