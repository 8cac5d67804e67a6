package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/docblocks"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// The playground command, run as a newcomer would run it (make playground, non-interactively),
// with the README's five-minute tour and the owners' guide run against it block by block, as
// written: the samples become Ready on real Redis pods (the tour logs in inside one and sees a
// replica replicating) with credentials that Vault's database engine issued on orders itself
// (spec.vaultPlugin), a rotation asked for with the kubectl plugin completes, a deleted
// RedisCluster leaves no lease in Vault, and Ctrl-C leaves no process, no port, no file and nothing of the real node behind.
func TestPlaygroundRunsTheSamplesAndCleansUp(t *testing.T) {
	dir := t.TempDir()
	kubeconfig, stateFile, envFile := filepath.Join(dir, "playground.kubeconfig"), filepath.Join(dir, "state.json"), filepath.Join(dir, "playground.env")
	logFile, err := os.Create(filepath.Join(dir, "playground.log"))
	if err != nil {
		t.Fatal(err)
	}
	// As a newcomer keeping a log would run it, piped into tee: Ctrl-C ends tee as well, and the
	// playground's clean-up must not depend on its output still being read.
	logFile.Close()
	cmd := exec.Command("bash", "-c", fmt.Sprintf("make playground PLAYGROUND_DIR=%q PLAYGROUND_FLAGS=--state-file=%q 2>&1 | tee %q >/dev/null", dir, stateFile, logFile.Name()))
	cmd.Dir = testground.RepoRoot()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	showLog := func() string { b, _ := os.ReadFile(logFile.Name()); return tail(string(b)) }

	state := waitState(t, stateFile, logFile.Name(), exited, showLog)
	c := clientFor(t, state.Kubeconfig)
	orders, payments := &v1beta1.RedisCluster{}, &v1beta1.RedisCluster{}
	key := client.ObjectKey{Namespace: "default", Name: "orders"}
	for _, rc := range []struct {
		name string
		obj  *v1beta1.RedisCluster
	}{{"orders", orders}, {"payments", payments}} {
		waitFor(t, 3*time.Minute, showLog, func() bool {
			return c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: rc.name}, rc.obj) == nil &&
				meta.IsStatusConditionTrue(rc.obj.Status.Conditions, v1beta1.ConditionReady)
		})
	}
	if lt := payments.Status.Credential.ExternalSecret.LeasesTracked; lt == nil || !*lt {
		t.Errorf("payments (ExternalSecret mode, Raw generator) does not track its lease: %+v", payments.Status.Credential)
	}
	// Vault's database engine issues the users of orders on orders itself: the user is on every
	// node, and not in the playground's other Redis (payments' source).
	user, pass := secretCredential(t, c, "orders")
	onEveryOrdersPod(t, c, user, pass)
	if who, err := testground.RedisWhoAmI(state.RedisAddr, user, pass); err == nil {
		t.Errorf("the credential of orders logs in (%q) on the Redis of payments' Vault role, want it only on orders", who)
	}

	// The tour, in a terminal where playground.env was sourced.
	env := sourced(t, dir, envFile)
	tour := tourBlocks(t)
	run := func(name string) string {
		t.Helper()
		b, ok := tour[name]
		if !ok {
			t.Fatalf("no tour block %q", name)
		}
		delete(tour, name)
		return docblocks.Run(t, b, dir, env, 2*time.Minute)
	}
	if out := run("look"); !strings.Contains(out, orders.Status.Credential.Lease.LeaseID) {
		t.Errorf("the tour's first look does not show the lease %s:\n%s", orders.Status.Credential.Lease.LeaseID, out)
	}
	if out := run("login"); !strings.Contains(out, "OK\n"+user+"\n") || !strings.Contains(out, "NOPERM") {
		t.Errorf("the tour's login (inside orders-0) printed %q, want OK, the user %s read back, and NOPERM for ACL LIST", out, user)
	}
	// A replica is Ready once its own Redis knows the credential; its link to the primary comes up
	// seconds later (it retries every second), so the look is repeated until it shows the link.
	replication, out := tour["replication"], ""
	delete(tour, "replication")
	deadline := time.Now().Add(time.Minute)
	for out = docblocks.Run(t, replication, dir, env, time.Minute); !strings.Contains(out, "master_link_status:up") && time.Now().Before(deadline); {
		time.Sleep(time.Second)
		out = docblocks.Run(t, replication, dir, env, time.Minute)
	}
	if !strings.Contains(out, "master_host:orders-0.orders-headless") || !strings.Contains(out, "master_link_status:up") {
		t.Errorf("the tour's replication look printed:\n%s\nwant orders-1 replicating from orders-0 by its DNS name", out)
	}
	run("renew")
	run("explain")
	oldVersion, oldLease := orders.Status.Credential.Version, orders.Status.Credential.Lease.LeaseID
	// The plugin's rotate waits until keyroll has issued the new credential; its status then shows
	// the ledger with the lease states and the rollout.
	out = run("rotate")
	for _, want := range []string{"Leases:", "Redis nodes:", "orders-2", "Rollout:"} {
		if !strings.Contains(out, want) {
			t.Errorf("the tour's rotate (kubectl keyroll rotate --wait, then status) does not show %q:\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`rotated: credential version (\S+), rollout: `).FindStringSubmatch(out)
	if m == nil || m[1] == oldVersion {
		t.Fatalf("the tour's rotate does not report a new credential version (the old one is %s):\n%s", oldVersion, out)
	}
	checkRotating(t, out, dir, env, oldLease, m[1])
	for _, b := range docblocks.Tagged(t, testground.RepoRoot(), "watch") {
		docblocks.RunWatch(t, b, dir, env, 3*time.Second)
	}
	waitFor(t, 2*time.Minute, showLog, func() bool {
		return c.Get(context.Background(), key, orders) == nil && orders.Status.Credential.Version != oldVersion &&
			orders.Status.Rollout == nil && len(orders.Status.Leases) == 1
	})
	newUser, newPass := secretCredential(t, c, "orders")
	onEveryOrdersPod(t, c, newUser, newPass)
	if who, err := testground.RedisWhoAmI(ordersPodAddr(t, c, "orders-0"), user, pass); err == nil {
		t.Errorf("the superseded user %s still logs in on orders-0 (as %q) after the rollout", user, who)
	}
	// The ledger's lines are "<lease>  <state>"; the events may name the old lease (revoked).
	out = run("rotated")
	if strings.Contains(out, oldLease+"  ") || !strings.Contains(out, orders.Status.Credential.Lease.LeaseID+"  Active") ||
		!strings.Contains(out, "ConsumerRestarted") {
		t.Errorf("after the rotation the tour shows:\n%s\nwant a ConsumerRestarted event, the new lease %s in the ledger and not the old %s", out, orders.Status.Credential.Lease.LeaseID, oldLease)
	}
	if !regexp.MustCompile(`(?m)^orders\s+` + regexp.QuoteMeta(orders.Status.Credential.Lease.LeaseID) + `\s+Active`).MatchString(out) {
		t.Errorf("kubectl keyroll leases in the tour does not list the new lease %s as Active:\n%s", orders.Status.Credential.Lease.LeaseID, out)
	}
	// The block's status line, not the pause command's own report, shows the rotations paused.
	if out := run("pause"); !regexp.MustCompile(`(?m)^Rotation:.*\bpaused \(renewals go on\)`).MatchString(out) {
		t.Errorf("the tour's pause printed:\n%s\nwant kubectl keyroll status's Rotation: line to show the rotations paused", out)
	}
	if err := c.Get(context.Background(), key, orders); err != nil || orders.Spec.Rotation.Paused {
		t.Errorf("after the tour's resume: %v, paused %v", err, orders.Spec.Rotation.Paused)
	}
	if out := run("external"); !strings.Contains(out, "true "+payments.Status.Credential.Lease.LeaseID) {
		t.Errorf("the tour's ExternalSecret look printed:\n%s\nwant leasesTracked true and the lease %s", out, payments.Status.Credential.Lease.LeaseID)
	}
	if out := run("tls"); !strings.Contains(out, "every running node serves certificate") || !strings.Contains(out, "-----BEGIN CERTIFICATE-----") {
		t.Errorf("the tour's TLS look printed:\n%s\nwant TLSReady's message and the CA in the consumers' Secret", out)
	}
	currentLease := orders.Status.Credential.Lease.LeaseID
	if out := run("delete"); !strings.Contains(out, "lease "+currentLease+" is revoked") {
		t.Errorf("the tour's delete printed:\n%s\nwant the lease reported revoked", out)
	}
	// The rest: the owners' guide and the ExternalSecret page, on the payments sample.
	for _, name := range slices.Sorted(maps.Keys(tour)) {
		if tour[name].File != "README.md" {
			run(name)
		}
	}
	if len(tour) > 0 {
		t.Errorf("tour blocks not run: %v", slices.Collect(maps.Keys(tour)))
	}

	pids := descendants(cmd.Process.Pid)
	names := map[int]string{}
	for _, pid := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		names[pid] = strings.Join(strings.Fields(strings.ReplaceAll(string(b), "\x00", " ")), " ")
	}
	ports := []int{portOf(t, state.VaultAddr), portOf(t, "http://"+state.RedisAddr), apiServerPort(t, state.Kubeconfig)}
	if len(pids) < 11 {
		t.Fatalf("the playground runs %d processes, want at least 11 (etcd, kube-apiserver, kube-controller-manager, containerd, kubelet, kube-proxy, coredns, external-secrets, vault, redis-server, keyroll)", len(pids))
	}
	// Every server the playground started listens on loopback or on the real node's own bridge.
	addrs, err := testground.ListeningAddrs(pids)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) < 8 {
		t.Errorf("the playground's processes listen on %v; want at least etcd, kube-apiserver, the kubelet, CoreDNS, Vault, Redis and keyroll", addrs)
	}
	for _, a := range addrs {
		host, _, _ := net.SplitHostPort(a)
		if ip := net.ParseIP(host); ip == nil || (!ip.IsLoopback() && !ip.Equal(testground.NodeIP)) {
			t.Errorf("a playground process listens on %s, neither on loopback nor on the node's bridge %s (all: %v)", a, testground.NodeIP, addrs)
		}
	}
	t.Logf("listening, all on loopback or the node's bridge: %v", addrs)
	// Ctrl-C: the terminal sends SIGINT to the whole foreground process group.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case err := <-exited:
		// make itself ends by the signal; the playground must have stopped cleanly under it.
		if err != nil && !strings.Contains(err.Error(), "interrupt") && !strings.Contains(err.Error(), "exit status 130") {
			t.Errorf("make playground exited with %v after Ctrl-C\n%s", err, showLog())
		}
		// Its clean-up's lines went to the closed pipe: that it ran is seen below, in the files
		// and the ground's directory it removes last.
	case <-time.After(time.Minute):
		t.Fatalf("the playground did not stop within a minute of Ctrl-C\n%s", showLog())
	}
	for _, pid := range pids {
		if testground.Alive(pid) {
			t.Errorf("process %d (%.120s) is still running after Ctrl-C (%s)", pid, names[pid], testground.ProcessState(pid))
		}
	}
	for _, port := range ports {
		if testground.PortBound(port) {
			t.Errorf("port %d is still bound after Ctrl-C", port)
		}
	}
	for _, f := range []string{kubeconfig, stateFile, envFile, state.GroundDir} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s was left behind", f)
		}
	}
	// The playground removes the real node as it stops; if it ended first, the node's janitor
	// removes it within seconds of the playground's end (as for a test that dies). The machine's
	// one node may be another test package's by then, started as soon as the playground let the
	// node go (its record and bridge, seen in fresh-clone runs): then what names the playground's
	// node directory must be gone.
	ours := state.NodeDir
	leftovers := func() []string {
		if d := testground.NodeRecordDir(); d != "" && d != ours {
			return testground.NodeLeftoversUnder(ours)
		}
		return testground.NodeLeftovers(ours)
	}
	stopped := time.Now()
	left := leftovers()
	for len(left) > 0 && time.Since(stopped) < 30*time.Second {
		time.Sleep(200 * time.Millisecond)
		left = leftovers()
	}
	if len(left) > 0 {
		t.Errorf("the real node left behind, 30 s after the playground stopped: %v\n%s", left, showLog())
	} else if d := time.Since(stopped); d > time.Second {
		t.Logf("the real node was gone %s after the playground stopped", d.Round(100*time.Millisecond))
	}
}

// checkRotating requires that kubectl keyroll status shows the rotation to version under way: in
// the ledger the new version's lease Active and the old lease Superseded (it stays live until the
// rollout is done), and the rollout to version with the consumers' progress. keyroll starts the
// rollout once every Redis node accepts the new user, which can be after the tour's status ran
// (out): then the status is asked again, for up to a minute. The rollout takes seconds (it
// restarts the consumer's pods one at a time), so it is seen while it runs.
func checkRotating(t *testing.T, out, dir string, env []string, oldLease, version string) {
	t.Helper()
	superseded := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(oldLease) + `\s+Superseded\s`)
	active := regexp.MustCompile(`(?m)^\s+\S+\s+Active\s.*\s` + regexp.QuoteMeta(version) + `\s*$`)
	rollout := regexp.MustCompile(`(?m)^Rollout:\n\s+to version ` + regexp.QuoteMeta(version) + `\b.*\d+/\d+ consumers updated`)
	missing := func(out string) string {
		switch {
		case !active.MatchString(out):
			return "no Active lease of version " + version + " in the ledger"
		case !superseded.MatchString(out):
			return "the old lease " + oldLease + " not Superseded in the ledger"
		case !rollout.MatchString(out):
			return "no rollout to version " + version + " with the consumers' progress"
		}
		return ""
	}
	what, polled := missing(out), 0
	for deadline := time.Now().Add(time.Minute); what != "" && superseded.MatchString(out) && time.Now().Before(deadline); polled++ {
		time.Sleep(200 * time.Millisecond)
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", "kubectl keyroll status orders")
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl keyroll status orders: %v\n%s", err, b)
		}
		out, what = string(b), missing(string(b))
	}
	if what != "" {
		t.Errorf("kubectl keyroll status orders after the tour's rotate (asked again %d times) shows %s:\n%s", polled, what, out)
	} else if polled > 0 {
		t.Logf("kubectl keyroll status orders showed the rotation under way when asked again (%d times):\n%s", polled, out)
	}
}

// tourBlocks are the docs' blocks tagged "tour", by name (the word after the tag).
func tourBlocks(t *testing.T) map[string]docblocks.Block {
	t.Helper()
	out := map[string]docblocks.Block{}
	for _, b := range docblocks.Tagged(t, testground.RepoRoot(), "tour") {
		if b.Name == "" || out[b.Name].Text != "" {
			t.Fatalf("%s: a tour block needs a name of its own", b)
		}
		out[b.Name] = b
	}
	return out
}

// sourced is the environment of a shell that sourced the playground's environment file.
func sourced(t *testing.T, dir, envFile string) []string {
	t.Helper()
	out, err := exec.Command("bash", "-c", "source "+envFile+" && env -0").Output()
	if err != nil {
		t.Fatalf("sourcing %s: %v", envFile, err)
	}
	var env []string
	for _, kv := range strings.Split(string(out), "\x00") {
		if kv != "" {
			env = append(env, kv)
		}
	}
	_ = dir
	return env
}

func waitState(t *testing.T, path, logPath string, exited <-chan error, showLog func() string) State {
	t.Helper()
	// Five minutes from the start, or from when the playground got the real node if it had to
	// wait for another package's (only one node runs per machine; the ground bounds that wait).
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if log, _ := os.ReadFile(logPath); strings.Contains(string(log), "another real node runs on this machine") &&
			!strings.Contains(string(log), testground.NodeLockTaken) {
			deadline = time.Now().Add(5 * time.Minute)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the playground did not come up\n%s", showLog())
		}
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
}

// waitFor is framework.Eventually for the playground: a failure shows the playground's log.
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
	c, err := client.New(cfg, client.Options{Scheme: framework.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// onEveryOrdersPod checks that a credential logs in on each Redis pod of orders, by its pod IP. (The
// test has no framework.Framework, whose OnEveryPod this resembles: the ground is the playground's,
// in another process; the test has its kubeconfig only.)
func onEveryOrdersPod(t *testing.T, c client.Client, user, pass string) {
	t.Helper()
	pods := &corev1.PodList{}
	if err := c.List(context.Background(), pods, client.InNamespace("default"), client.MatchingLabels{v1beta1.LabelCluster: "orders"}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 3 {
		t.Fatalf("orders has %d Redis pods, want 3", len(pods.Items))
	}
	for _, p := range pods.Items {
		if who, err := testground.RedisWhoAmI(framework.PodAddr(&p), user, pass); err != nil || who != user {
			t.Errorf("user %s on %s: %q, %v", user, p.Name, who, err)
		}
	}
}

// ordersPodAddr is where a Redis pod of orders listens.
func ordersPodAddr(t *testing.T, c client.Client, name string) string {
	t.Helper()
	p := &corev1.Pod{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return framework.PodAddr(p)
}

// secretCredential reads the consumers' Secret of a sample (framework's Credentials, through c).
func secretCredential(t *testing.T, c client.Client, cluster string) (string, string) {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: cluster + "-credentials"}, s); err != nil {
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
