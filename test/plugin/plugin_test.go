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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	ground *testground.Ground
	k8s    client.Client
	// pluginDir holds the kubectl-keyroll binary built for this package.
	pluginDir string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	if _, err := testground.Binary("kubectl"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "keyroll-plugin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-keyroll"), "./cmd/kubectl-keyroll")
	build.Dir = testground.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the plugin: %v\n%s", err, out)
		return 1
	}
	pluginDir = dir
	g, c, stop, err := harness.StartPackage(testground.Options{}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	ground, k8s = g, c
	return m.Run()
}

// kubectl runs `kubectl ARGS` with the plugin on PATH and the ground's admin kubeconfig.
func kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, _ := testground.Binary("kubectl")
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "PATH="+pluginDir+":"+os.Getenv("PATH"), "KUBECONFIG="+ground.CP.Kubeconfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectl(t, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// cluster creates a RedisCluster and writes its status as keyroll would during a rollout: an
// Active lease, a Superseded one, one pod of three updated.
func cluster(t *testing.T, namespace, name string) *v1alpha1.RedisCluster {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	rc := &v1alpha1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.RedisClusterSpec{
			Replicas: 3,
			Credentials: v1alpha1.CredentialsSpec{Source: v1alpha1.SourceVaultLease, VaultLease: &v1alpha1.VaultLeaseSource{
				ConnectionRef: v1alpha1.ConnectionReference{Name: "vault"}, Path: "database/creds/" + name}},
			Rotation: v1alpha1.RotationSpec{Schedule: "0 3 * * *"},
			Rollout: v1alpha1.RolloutSpec{RedisPods: v1alpha1.RedisPodsRestart,
				Consumers: []v1alpha1.ConsumerReference{{Kind: "Deployment", Name: name + "-api"}}},
		},
	}
	if err := k8s.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	at := func(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(d))) }
	rc.Status = v1alpha1.RedisClusterStatus{
		ObservedGeneration: rc.Generation, Phase: v1alpha1.PhaseRolling, ReadyReplicas: 3,
		Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAvailable, Message: "serving", LastTransitionTime: *at(-10 * time.Minute)},
			{Type: v1alpha1.ConditionRolloutProgressing, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRolloutInProgress, Message: "1/3 pods", LastTransitionTime: *at(-time.Minute)},
		},
		Credential: &v1alpha1.CredentialStatus{
			Version: "new" + name, Source: v1alpha1.SourceVaultLease, Username: "V_TOKEN_" + strings.ToUpper(name),
			LeaseID: "database/creds/" + name + "/new", IssuedAt: at(-time.Minute), ExpiresAt: at(9 * time.Minute),
			Renewable: true, TokenAccessor: "accessor-new", NextRenewal: at(5 * time.Minute),
			LastRotation: at(-time.Minute), NextRotation: at(12 * time.Hour),
		},
		Leases: []v1alpha1.LeaseRecord{
			{LeaseID: "database/creds/" + name + "/new", State: v1alpha1.LeaseActive, Version: "new" + name, Connection: "vault", TokenAccessor: "accessor-new", ExpiresAt: at(9 * time.Minute)},
			{LeaseID: "database/creds/" + name + "/old", State: v1alpha1.LeaseSuperseded, Version: "old" + name, Connection: "vault", TokenAccessor: "accessor-old", ExpiresAt: at(3 * time.Minute)},
		},
		Rollout: &v1alpha1.RolloutStatus{TargetVersion: "new" + name, PodsUpdated: 1, PodInFlight: name + "-1", PodRestartedAt: at(-20 * time.Second), StartedAt: at(-time.Minute)},
	}
	if err := k8s.Status().Update(ctx, rc); err != nil {
		t.Fatalf("writing the status: %v", err)
	}
	return rc
}

func get(t *testing.T, rc *v1alpha1.RedisCluster) *v1alpha1.RedisCluster {
	t.Helper()
	cur := &v1alpha1.RedisCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

func TestKubectlKeyrollAgainstTheAPIServer(t *testing.T) {
	orders := cluster(t, "default", "orders")
	cluster(t, "shop", "carts")

	out := mustKubectl(t, "keyroll", "status", "orders")
	for _, want := range []string{"default/orders", "Rolling", "3/3 ready", "database/creds/orders through VaultConnection vault",
		"RolloutProgressing", "RolloutInProgress", "Version:", "neworders", "accessor-new",
		"Next renewal:", "(in 4m", "Next rotation:", "(in 11h",
		"database/creds/orders/new", "Active", "database/creds/orders/old", "Superseded", "accessor-old",
		"to version neworders: 1/3 Redis pods updated, orders-1 in flight", "0/1 consumers updated"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl keyroll status orders does not show %q:\n%s", want, out)
		}
	}

	// rotate: a new rotate-now value each time, shown as pending until keyroll acts on it.
	out = mustKubectl(t, "keyroll", "rotate", "orders")
	first := get(t, orders).Annotations[v1alpha1.AnnotationRotateNow]
	if first == "" || !strings.Contains(out, first) {
		t.Fatalf("rotate set %q and said:\n%s", first, out)
	}
	mustKubectl(t, "keyroll", "rotate", "orders")
	second := get(t, orders).Annotations[v1alpha1.AnnotationRotateNow]
	if second == first {
		t.Errorf("a second rotate reused the value %q", second)
	}
	if out := mustKubectl(t, "keyroll", "status", "orders"); !strings.Contains(out, "not yet acted upon") {
		t.Errorf("status does not show the pending rotation:\n%s", out)
	}

	// rotate --wait returns once the request is acknowledged (here by the test, as keyroll would).
	acked := make(chan error, 1)
	go func() { acked <- acknowledge(orders, second) }()
	out, err := kubectl(t, "keyroll", "rotate", "orders", "--wait", "--timeout=30s")
	if ackErr := <-acked; ackErr != nil {
		t.Fatal(ackErr)
	}
	if err != nil || !strings.Contains(out, "rotated: credential version rotated") {
		t.Errorf("rotate --wait: %v\n%s", err, out)
	}

	// pause and resume flip spec.rotation.paused and nothing else.
	mustKubectl(t, "keyroll", "pause", "orders")
	if cur := get(t, orders); !cur.Spec.Rotation.Paused || cur.Spec.Rotation.Schedule != "0 3 * * *" {
		t.Errorf("after pause: %+v", cur.Spec.Rotation)
	}
	if out := mustKubectl(t, "keyroll", "status", "orders", "-o", "json"); !strings.Contains(out, `"paused": true`) {
		t.Errorf("status -o json after pause:\n%s", out)
	}
	mustKubectl(t, "keyroll", "resume", "orders")
	if get(t, orders).Spec.Rotation.Paused {
		t.Error("resume left rotations paused")
	}

	// leases: one namespace, all of them, and JSON for scripts; --kubeconfig and -n as flags.
	out = mustKubectl(t, "keyroll", "leases", "--kubeconfig", ground.CP.Kubeconfig, "-n", "shop")
	if !strings.Contains(out, "database/creds/carts/old") || strings.Contains(out, "orders") {
		t.Errorf("leases -n shop:\n%s", out)
	}
	var list struct {
		Items []struct {
			Namespace, Cluster, LeaseID, State, Connection, TokenAccessor string
		}
	}
	if err := json.Unmarshal([]byte(mustKubectl(t, "keyroll", "leases", "-A", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, l := range list.Items {
		states[l.Namespace+"/"+l.Cluster+" "+l.LeaseID] = l.State
	}
	if len(list.Items) != 4 || states["shop/carts database/creds/carts/old"] != "Superseded" || states["default/orders database/creds/orders/new"] != "Active" {
		t.Errorf("leases -A -o json: %+v", list.Items)
	}

	if out, err := kubectl(t, "keyroll", "status", "nope"); err == nil || !strings.Contains(out, `"nope" not found`) {
		t.Errorf("status of a missing RedisCluster: %v\n%s", err, out)
	}
}

// acknowledge waits until the rotate-now annotation differs from before and records it as acted
// upon, with a new credential version, as keyroll's controller does.
func acknowledge(rc *v1alpha1.RedisCluster, before string) error {
	ctx := context.Background()
	for range 200 {
		cur := &v1alpha1.RedisCluster{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rc), cur); err != nil {
			return err
		}
		if v := cur.Annotations[v1alpha1.AnnotationRotateNow]; v != before {
			cur.Status.RotateNowAcknowledged = v
			cur.Status.Credential.Version = "rotated"
			return k8s.Status().Update(ctx, cur)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no new rotate-now value appeared")
}
