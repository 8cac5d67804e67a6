// Package plugin runs the kubectl keyroll plugin, built from cmd/kubectl-keyroll and found by the
// test ground's kubectl on PATH, against a real kube-apiserver with keyroll's CRDs: RedisClusters
// whose status the test writes through the status subresource, as keyroll would.
package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	fw *framework.Framework
	// pluginDir holds the kubectl-keyroll binary built for this package.
	pluginDir string
)

func TestMain(m *testing.M) {
	if _, err := testground.Binary("kubectl"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fw = framework.New(framework.Config{Name: "plugin", Setup: buildPlugin})
	os.Exit(fw.Run(m))
}

// buildPlugin builds kubectl-keyroll into the ground's directory, which goes when the ground stops.
func buildPlugin(_ context.Context, f *framework.Framework) error {
	dir := filepath.Join(f.Ground.Dir, "plugin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-keyroll"), "./cmd/kubectl-keyroll")
	build.Dir = testground.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the plugin: %v\n%s", err, out)
	}
	pluginDir = dir
	return nil
}

// kubeconfigIn writes a copy of the ground's admin kubeconfig whose context's namespace is ns:
// kubectl and the plugin work there when no -n is given.
func kubeconfigIn(t *testing.T, ns string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(fw.Ground.CP.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c := kc.Contexts[kc.CurrentContext]
	if c == nil {
		t.Fatalf("the ground's kubeconfig has no current context %q", kc.CurrentContext)
	}
	c.Namespace = ns
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// cluster creates a RedisCluster in namespace (one of fw.Namespace) and writes its status as
// keyroll would during a rollout: an Active lease, a Superseded one, one pod of three updated. No
// operator or Vault runs here: its VaultConnection and Vault paths are names in the status only.
func cluster(t *testing.T, namespace, name string) *v1beta1.RedisCluster {
	t.Helper()
	ctx := context.Background()
	rc := &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1beta1.RedisClusterSpec{
			Replicas: 3,
			Credentials: v1beta1.CredentialsSpec{Source: v1beta1.SourceVaultLease, VaultLease: &v1beta1.VaultLeaseSource{
				ConnectionRef: v1beta1.ConnectionReference{Name: "vault"}, Path: "database/creds/" + name}},
			Rotation: v1beta1.RotationSpec{Schedule: "0 3 * * *"},
			Rollout: v1beta1.RolloutSpec{RedisPods: v1beta1.RedisPodsRestart,
				Consumers: []v1beta1.ConsumerReference{{Kind: "Deployment", Name: name + "-api"}}},
		},
	}
	fw.Create(t, rc)
	now := time.Now().Truncate(time.Second)
	at := func(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(d))) }
	rc.Status = v1beta1.RedisClusterStatus{
		ObservedGeneration: rc.Generation, Phase: v1beta1.PhaseRolling, ReadyReplicas: 3,
		Conditions: []metav1.Condition{
			{Type: v1beta1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1beta1.ReasonAvailable, Message: "serving", LastTransitionTime: *at(-10 * time.Minute)},
			{Type: v1beta1.ConditionRolloutProgressing, Status: metav1.ConditionTrue, Reason: v1beta1.ReasonRolloutInProgress, Message: "1/3 pods", LastTransitionTime: *at(-time.Minute)},
		},
		Credential: &v1beta1.CredentialStatus{
			Version: "new" + name, Source: v1beta1.SourceVaultLease, Username: "V_TOKEN_" + strings.ToUpper(name),
			IssuedAt:     at(-time.Minute),
			Lease:        v1beta1.CredentialLease{LeaseID: "database/creds/" + name + "/new", ExpiresAt: at(9 * time.Minute), Renewable: true, NextRenewal: at(5 * time.Minute)},
			VaultLease:   v1beta1.VaultLeaseCredential{TokenAccessor: "accessor-new"},
			LastRotation: at(-time.Minute), NextRotation: at(12 * time.Hour),
		},
		Leases: []v1beta1.LeaseRecord{
			{LeaseID: "database/creds/" + name + "/new", State: v1beta1.LeaseActive, Version: "new" + name, Connection: "vault", TokenAccessor: "accessor-new", ExpiresAt: at(9 * time.Minute)},
			{LeaseID: "database/creds/" + name + "/old", State: v1beta1.LeaseSuperseded, Version: "old" + name, Connection: "vault", TokenAccessor: "accessor-old", ExpiresAt: at(3 * time.Minute)},
		},
		Rollout: &v1beta1.RolloutStatus{TargetVersion: "new" + name, PodsUpdated: 1, PodInFlight: name + "-1", PodRestartedAt: at(-20 * time.Second), StartedAt: at(-time.Minute)},
	}
	if err := fw.Client.Status().Update(ctx, rc); err != nil {
		t.Fatalf("writing the status: %v", err)
	}
	return rc
}

func TestKubectlKeyrollAgainstTheAPIServer(t *testing.T) {
	defaultNS, shopNS := fw.Namespace(t, "default"), fw.Namespace(t, "shop")
	orders := cluster(t, defaultNS, "orders")
	cluster(t, shopNS, "carts")
	// kubectl finds the plugin on PATH; without -n, both work in the kubeconfig's namespace,
	// defaultNS.
	env := []string{"PATH=" + pluginDir + ":" + os.Getenv("PATH"), "KUBECONFIG=" + kubeconfigIn(t, defaultNS)}

	out := fw.MustKubectl(t, env, "keyroll", "status", "orders")
	for _, want := range []string{defaultNS + "/orders", "Rolling", "3/3 ready", "database/creds/orders through VaultConnection vault",
		"RolloutProgressing", "RolloutInProgress", "Version:", "neworders", "accessor-new",
		"Next renewal:", "(in 4m", "Next rotation:", "(in 11h",
		"database/creds/orders/new", "Active", "database/creds/orders/old", "Superseded", "accessor-old",
		"to version neworders: 1/3 Redis pods updated, orders-1 in flight", "0/1 consumers updated"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl keyroll status orders does not show %q:\n%s", want, out)
		}
	}

	// rotate: a new rotate-now value each time, shown as pending until keyroll acts on it.
	out = fw.MustKubectl(t, env, "keyroll", "rotate", "orders")
	first := fw.Get(t, orders).Annotations[v1beta1.AnnotationRotateNow]
	if first == "" || !strings.Contains(out, first) {
		t.Fatalf("rotate set %q and said:\n%s", first, out)
	}
	fw.MustKubectl(t, env, "keyroll", "rotate", "orders")
	second := fw.Get(t, orders).Annotations[v1beta1.AnnotationRotateNow]
	if second == first {
		t.Errorf("a second rotate reused the value %q", second)
	}
	if out := fw.MustKubectl(t, env, "keyroll", "status", "orders"); !strings.Contains(out, "not yet acted upon") {
		t.Errorf("status does not show the pending rotation:\n%s", out)
	}

	// rotate --wait returns once the request is acknowledged (here by the test, as keyroll would).
	acked := make(chan error, 1)
	go func() { acked <- acknowledge(orders, second) }()
	out, err := fw.Kubectl(env, "keyroll", "rotate", "orders", "--wait", "--timeout=30s")
	if ackErr := <-acked; ackErr != nil {
		t.Fatal(ackErr)
	}
	if err != nil || !strings.Contains(out, "rotated: credential version rotated") {
		t.Errorf("rotate --wait: %v\n%s", err, out)
	}

	// pause and resume flip spec.rotation.paused and nothing else.
	fw.MustKubectl(t, env, "keyroll", "pause", "orders")
	if cur := fw.Get(t, orders); !cur.Spec.Rotation.Paused || cur.Spec.Rotation.Schedule != "0 3 * * *" {
		t.Errorf("after pause: %+v", cur.Spec.Rotation)
	}
	if out := fw.MustKubectl(t, env, "keyroll", "status", "orders", "-o", "json"); !strings.Contains(out, `"paused": true`) {
		t.Errorf("status -o json after pause:\n%s", out)
	}
	fw.MustKubectl(t, env, "keyroll", "resume", "orders")
	if fw.Get(t, orders).Spec.Rotation.Paused {
		t.Error("resume left rotations paused")
	}

	// leases: one namespace, all of them, and JSON for scripts; --kubeconfig and -n as flags.
	out = fw.MustKubectl(t, env, "keyroll", "leases", "--kubeconfig", fw.Ground.CP.Kubeconfig, "-n", shopNS)
	if !strings.Contains(out, "database/creds/carts/old") || strings.Contains(out, "orders") {
		t.Errorf("leases -n %s:\n%s", shopNS, out)
	}
	var list struct {
		Items []struct {
			Namespace, Cluster, LeaseID, State, Connection, TokenAccessor string
		}
	}
	if err := json.Unmarshal([]byte(fw.MustKubectl(t, env, "keyroll", "leases", "-A", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, l := range list.Items {
		states[l.Namespace+"/"+l.Cluster+" "+l.LeaseID] = l.State
	}
	if len(list.Items) != 4 || states[shopNS+"/carts database/creds/carts/old"] != "Superseded" || states[defaultNS+"/orders database/creds/orders/new"] != "Active" {
		t.Errorf("leases -A -o json: %+v", list.Items)
	}

	if out, err := fw.Kubectl(env, "keyroll", "status", "nope"); err == nil || !strings.Contains(out, `"nope" not found`) {
		t.Errorf("status of a missing RedisCluster: %v\n%s", err, out)
	}
}

// acknowledge waits until the rotate-now annotation differs from before and records it as acted
// upon, with a new credential version, as keyroll's controller does.
func acknowledge(rc *v1beta1.RedisCluster, before string) error {
	ctx := context.Background()
	for range 200 {
		cur := &v1beta1.RedisCluster{}
		if err := fw.Client.Get(ctx, client.ObjectKeyFromObject(rc), cur); err != nil {
			return err
		}
		if v := cur.Annotations[v1beta1.AnnotationRotateNow]; v != before {
			cur.Status.RotateNowAcknowledged = v
			cur.Status.Credential.Version = "rotated"
			return fw.Client.Status().Update(ctx, cur)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no new rotate-now value appeared")
}
