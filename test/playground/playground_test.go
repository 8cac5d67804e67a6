package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

// The playground command, run as a newcomer would run it (non-interactively): the sample
// RedisCluster becomes Ready with a credential that works against the playground's Redis, a
// rotation asked for with the annotation completes, and Ctrl-C leaves no process and no port behind.
func TestPlaygroundRunsTheSamplesAndCleansUp(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "playground")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the playground: %v\n%s", err, out)
	}
	kubeconfig, stateFile := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "state.json")
	logFile, err := os.Create(filepath.Join(dir, "playground.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig-out="+kubeconfig, "--state-file="+stateFile)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	showLog := func() string { b, _ := os.ReadFile(logFile.Name()); return tail(string(b)) }

	state := waitState(t, stateFile, exited, showLog)
	c := clientFor(t, state.Kubeconfig)
	rc := &v1alpha1.RedisCluster{}
	key := client.ObjectKey{Namespace: "default", Name: "orders"}
	waitFor(t, 3*time.Minute, showLog, func() bool {
		return c.Get(context.Background(), key, rc) == nil && meta.IsStatusConditionTrue(rc.Status.Conditions, v1alpha1.ConditionReady)
	})
	user, pass := secretCredential(t, c)
	if who, err := testground.RedisWhoAmI(state.RedisAddr, user, pass); err != nil || who != user {
		t.Fatalf("the sample's credential does not work against the playground's Redis: %q, %v", who, err)
	}

	// The rotation the playground's tour tells how to ask for.
	oldVersion := rc.Status.Credential.Version
	patch := client.MergeFrom(rc.DeepCopy())
	rc.Annotations = map[string]string{v1alpha1.AnnotationRotateNow: "playground-test"}
	if err := c.Patch(context.Background(), rc, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, showLog, func() bool {
		return c.Get(context.Background(), key, rc) == nil && rc.Status.Credential.Version != oldVersion &&
			rc.Status.Rollout == nil && len(rc.Status.Leases) == 1
	})
	newUser, newPass := secretCredential(t, c)
	if _, err := testground.RedisWhoAmI(state.RedisAddr, newUser, newPass); err != nil {
		t.Fatalf("the rotated credential does not work: %v", err)
	}

	pids := descendants(cmd.Process.Pid)
	ports := []int{portOf(t, state.VaultAddr), portOf(t, "http://"+state.RedisAddr), apiServerPort(t, state.Kubeconfig)}
	if len(pids) < 7 {
		t.Fatalf("the playground runs %d processes, want at least 7 (etcd, kube-apiserver, kube-controller-manager, kwok, vault, redis-server, keyroll)", len(pids))
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGINT)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the playground exited with %v after Ctrl-C\n%s", err, showLog())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the playground did not stop within a minute of Ctrl-C\n%s", showLog())
	}
	for _, pid := range pids {
		if testground.Alive(pid) {
			t.Errorf("process %d is still running after Ctrl-C", pid)
		}
	}
	for _, port := range ports {
		if testground.PortBound(port) {
			t.Errorf("port %d is still bound after Ctrl-C", port)
		}
	}
	for _, f := range []string{kubeconfig, stateFile} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s was left behind", f)
		}
	}
}

func waitState(t *testing.T, path string, exited <-chan error, showLog func() string) State {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			t.Fatalf("the playground exited early: %v\n%s", err, showLog())
		default:
		}
		if b, err := os.ReadFile(path); err == nil {
			var s State
			if json.Unmarshal(b, &s) == nil {
				return s
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("the playground did not come up\n%s", showLog())
	return State{}
}

func waitFor(t *testing.T, timeout time.Duration, showLog func() string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s\n%s", timeout, showLog())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func clientFor(t *testing.T, kubeconfig string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func secretCredential(t *testing.T, c client.Client) (string, string) {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "orders-credentials"}, s); err != nil {
		t.Fatal(err)
	}
	return string(s.Data["username"]), string(s.Data["password"])
}

// descendants lists a process's children, grandchildren and so on.
func descendants(root int) []int {
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range testground.ChildPIDsOf(p) {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

func portOf(t *testing.T, raw string) int {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

func apiServerPort(t *testing.T, kubeconfig string) int {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return portOf(t, cfg.Host)
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}
