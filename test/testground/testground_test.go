package testground

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestVaultIssuesRedisCredentialUntilRevoked(t *testing.T) {
	g := StartT(t, Options{Redis: true, Vault: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.Vault.ConfigureRedis(ctx, g.Redis, RedisRole{Name: "orders", DefaultTTL: time.Minute, MaxTTL: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	sec, err := g.Vault.Root.Logical().ReadWithContext(ctx, "database/creds/orders")
	if err != nil {
		t.Fatalf("reading database/creds/orders: %v", err)
	}
	user, _ := sec.Data["username"].(string)
	pass, _ := sec.Data["password"].(string)
	if user == "" || pass == "" || sec.LeaseID == "" {
		t.Fatalf("credential incomplete: username %q, password set %v, lease %q", user, pass != "", sec.LeaseID)
	}
	if who, err := g.Redis.WhoAmI(user, pass); err != nil || who != user {
		t.Fatalf("issued credential does not authenticate: whoami %q, %v", who, err)
	}
	if _, err := g.Redis.WhoAmI(user, pass+"x"); err == nil {
		t.Fatal("a wrong password authenticated")
	}
	if err := g.Vault.Root.Sys().RevokeWithContext(ctx, sec.LeaseID); err != nil {
		t.Fatalf("revoking: %v", err)
	}
	if who, err := g.Redis.WhoAmI(user, pass); err == nil {
		t.Fatalf("credential still authenticates as %q after its lease was revoked", who)
	}
}

func TestStatefulSetPodsBecomeReady(t *testing.T) {
	g := StartT(t, Options{Workloads: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := g.CP.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sts"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "redis"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "redis", Namespace: "sts"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To[int32](3),
			ServiceName: "redis",
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "redis", Image: "redis:7.2"}}},
			},
		},
	}
	if _, err := cs.AppsV1().StatefulSets("sts").Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		got, err := cs.AppsV1().StatefulSets("sts").Get(ctx, "redis", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.ReadyReplicas == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("StatefulSet has %d/3 Ready pods after %s", got.Status.ReadyReplicas, time.Since(start))
		}
		time.Sleep(100 * time.Millisecond)
	}
	pods, err := cs.CoreV1().Pods("sts").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := 0
	_, kwokPods, _ := net.ParseCIDR(KwokPodCIDR)
	for _, p := range pods.Items {
		// kwok's pods have addresses on this machine's loopback: nothing that dials one leaves it.
		if ip := net.ParseIP(p.Status.PodIP); ip == nil || !ip.IsLoopback() || !kwokPods.Contains(ip) {
			t.Errorf("pod %s has IP %q, want one of %s (loopback)", p.Name, p.Status.PodIP, KwokPodCIDR)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.Spec.NodeName == NodeName {
				ready++
			}
		}
	}
	if ready != 3 {
		t.Fatalf("%d pods Ready on %s, want 3", ready, NodeName)
	}
	t.Logf("3/3 pods Ready %s after the StatefulSet was created", time.Since(start).Round(time.Millisecond))
}

func TestVaultKubernetesAuthWithServiceAccountToken(t *testing.T) {
	g := StartT(t, Options{Vault: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := g.Vault.EnableKubernetesAuth(ctx, g.CP, KubernetesAuthRole{
		Name: "keyroll", ServiceAccounts: []string{"keyroll-manager"}, Namespaces: []string{"keyroll-system"},
		Policies: []string{"default"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"keyroll-manager", "intruder"} {
		if err := g.CP.EnsureServiceAccount(ctx, "keyroll-system", sa); err != nil {
			t.Fatal(err)
		}
	}
	jwt, err := g.CP.ServiceAccountToken(ctx, "keyroll-system", "keyroll-manager", 10*time.Minute, "vault")
	if err != nil {
		t.Fatal(err)
	}
	sec, err := g.Vault.LoginKubernetes(ctx, "keyroll", jwt)
	if err != nil {
		t.Fatalf("login with the operator's service-account token: %v", err)
	}
	if sec.Auth == nil || sec.Auth.ClientToken == "" || sec.Auth.Metadata["service_account_name"] != "keyroll-manager" {
		t.Fatalf("login returned no token for keyroll-manager: %+v", sec.Auth)
	}
	other, err := g.CP.ServiceAccountToken(ctx, "keyroll-system", "intruder", 10*time.Minute, "vault")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Vault.LoginKubernetes(ctx, "keyroll", other); err == nil {
		t.Fatal("a service account the role does not bind logged in")
	}
}

// helperEnv tells the test binary, started again by TestEveryProcessStopsWhenATestFails, to run
// TestHelperFailsWithEverythingRunning for real.
const helperEnv = "KEYROLL_TESTGROUND_FAILING_HELPER"

// record is what the failing helper leaves for its parent test.
type record struct {
	PIDs  []int `json:"pids"`
	Ports []int `json:"ports"`
	// NodeDir is the real node's directory; the containerd shims name it.
	NodeDir string `json:"nodeDir"`
}

func TestEveryProcessStopsWhenATestFails(t *testing.T) {
	// A failed test runs its cleanups, and so does a panicking one (the testing package runs them
	// before it re-panics); a killed process runs nothing at all (as when a CI runner kills it), and
	// the parent-death signal, the control plane's watchdog and the node's janitor must clean up
	// all the same. Each run must also find the machine as the one before left it: clean.
	for _, mode := range []string{"fail", "panic", "kill"} {
		t.Run(mode, func(t *testing.T) {
			// This test holds the node lock from before the helper's node to after its cleanup, and
			// hands it to the helper: no other node of this machine can start in between, so what
			// is seen is the helper's node and its cleanup alone.
			lock, err := lockNode()
			if err != nil {
				t.Fatal(err)
			}
			defer lock.Close()
			before := machineState()
			out := filepath.Join(t.TempDir(), "record.json")
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFailsWithEverythingRunning$", "-test.count=1")
			cmd.Env = append(os.Environ(), helperEnv+"="+mode+":"+out, inheritedLockEnv+"=3")
			cmd.ExtraFiles = []*os.File{lock}
			output, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the helper test was expected to fail; output:\n%s", output)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("the helper left no record (%v); output:\n%s", err, output)
			}
			var rec record
			if err := json.Unmarshal(b, &rec); err != nil {
				t.Fatal(err)
			}
			// etcd, kube-apiserver, kube-controller-manager, kwok, redis-server, vault, external-secrets,
			// and the node's containerd, kubelet, kube-proxy, coredns, janitor and a shim.
			if len(rec.PIDs) < 13 {
				t.Fatalf("the helper started %d processes, want at least 13: %v", len(rec.PIDs), rec.PIDs)
			}
			if strings.Contains(string(output), "cleaning up what an earlier real node left") {
				t.Errorf("the helper's node did not start clean:\n%s", output)
			}
			// The watchdog looks once a second; the node's janitor cleans up after the test process is gone.
			deadline := time.Now().Add(time.Minute)
			for _, pid := range rec.PIDs {
				for Alive(pid) && time.Now().Before(deadline) {
					time.Sleep(100 * time.Millisecond)
				}
				if Alive(pid) {
					t.Errorf("process %d is still running after the test ended (%s)", pid, mode)
				}
			}
			for _, port := range rec.Ports {
				if PortBound(port) {
					t.Errorf("port %d is still bound after the test ended (%s)", port, mode)
				}
			}
			checkNodeCleanedUp(t, rec.NodeDir, before, deadline)
			// A failed or panicking test removes its ground's directory; a killed one cannot, and
			// leaves its logs for whoever looks into why (the node's part goes with the node's
			// cleanup). This test removes that one itself.
			dir := filepath.Dir(rec.NodeDir)
			if _, err := os.Stat(dir); mode != "kill" && err == nil {
				t.Errorf("the ground's directory %s is still there after the helper's cleanups (%s)", dir, mode)
			}
			if mode == "kill" {
				if err := os.RemoveAll(dir); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// hostState is what a real node may change on the machine.
type hostState struct {
	Links, FixedPaths []string
	Sysctls           map[string]string
}

func machineState() hostState {
	s := hostState{Sysctls: readSysctls()}
	links, _ := os.ReadDir("/sys/class/net")
	for _, l := range links {
		s.Links = append(s.Links, l.Name())
	}
	for _, p := range fixedHostPaths {
		if _, err := os.Lstat(p); err == nil {
			s.FixedPaths = append(s.FixedPaths, p)
		}
	}
	return s
}

// checkNodeCleanedUp asserts that the node left nothing: no process naming its directory (the
// shims), no mount under it, no network device, iptables chain, cgroup, fixed host path or
// changed sysctl, and no record of what to clean.
func checkNodeCleanedUp(t *testing.T, nodeDir string, before hostState, deadline time.Time) {
	t.Helper()
	if nodeDir == "" {
		t.Fatal("the helper recorded no node directory")
	}
	for time.Now().Before(deadline) {
		if _, err := os.Stat(nodeStateFile); os.IsNotExist(err) && len(processesNaming(nodeDir)) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if pids := processesNaming(nodeDir); len(pids) > 0 {
		t.Errorf("processes of the node are still running: %v", pids)
	}
	if _, err := os.Stat(nodeStateFile); err == nil {
		t.Errorf("the node's record %s is still there: nothing cleaned up", nodeStateFile)
	}
	if m := MountsUnder(nodeDir); len(m) > 0 {
		t.Errorf("still mounted under the node's directory: %v", m)
	}
	after := machineState()
	if !slices.Equal(after.Links, before.Links) {
		t.Errorf("network devices changed: before %v, after %v", before.Links, after.Links)
	}
	if !slices.Equal(after.FixedPaths, before.FixedPaths) {
		t.Errorf("fixed host paths changed: before %v, after %v", before.FixedPaths, after.FixedPaths)
	}
	if !maps.Equal(after.Sysctls, before.Sysctls) {
		t.Errorf("sysctls changed: before %v, after %v", before.Sysctls, after.Sysctls)
	}
	if c := NodeIPTablesChains(); len(c) > 0 {
		t.Errorf("iptables chains left: %v", c)
	}
	if c := NodeCgroups(); len(c) > 0 {
		t.Errorf("cgroups left: %v", c)
	}
}

// TestHelperFailsWithEverythingRunning is not a test on its own: TestEveryProcessStopsWhenATestFails
// runs it in a child process, where it starts every component and then fails.
func TestHelperFailsWithEverythingRunning(t *testing.T) {
	mode, out, _ := strings.Cut(os.Getenv(helperEnv), ":")
	if out == "" {
		t.Log("runs only as the child of TestEveryProcessStopsWhenATestFails")
		return
	}
	g := StartT(t, Options{Node: true, Workloads: true, Redis: true, Vault: true, ExternalSecrets: true})
	u, err := url.Parse(g.CP.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	// A running pod: a shim, mounts, cgroups, a veth on the bridge.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitNamespaceReady(t, ctx, g, "default")
	if _, err := g.CP.Clientset.CoreV1().Pods("default").Create(ctx, sleeperPod("left-running", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodReady(t, ctx, g, "default", "left-running")
	apiPort, _ := strconv.Atoi(u.Port())
	rec := record{PIDs: append(ChildPIDs(), processesNaming(g.Node.Dir)...), Ports: []int{apiPort, g.Redis.Port, g.Vault.Port}, NodeDir: g.Node.Dir}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(out, b, 0o600); err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "panic":
		panic("panicking on purpose, with every component running")
	case "kill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	t.Fatal("failing on purpose, with every component running")
}
