package render

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/testground"
)

// pod runs what a Redis pod runs (the ConfigMap's start script, with the ACL Secret mounted) with
// a real redis-server, under a temporary directory, with keyroll's mount paths and Redis port
// moved there; a replica's primary is another such pod.
type pod struct {
	t         *testing.T
	rc        *v1beta1.RedisCluster
	root      string
	port      int
	probePort int // the probe sidecar's
	probeOut  strings.Builder
	relocate  *strings.Replacer
	out       *strings.Builder
	cmd       *exec.Cmd
	exited    chan error
}

func startPod(t *testing.T, rc *v1beta1.RedisCluster, acl map[string][]byte, name string, primary *pod) *pod {
	t.Helper()
	return startPodIn(t, rc, acl, name, primary, t.TempDir(), nil, "")
}

// startPodIn is startPod in the pod directory root (a container restarted in the same pod finds
// its volumes as the first left them), as the user of cred (nil: the test's), with extraConf
// added to redis.conf.
// aclOf is the ACL Secret's data of rc with keyroll's users in and the app's credential (none:
// nil).
func aclOf(t *testing.T, rc *v1beta1.RedisCluster, in Internal, app *Credential) map[string][]byte {
	t.Helper()
	var apps []ACLUser
	if app != nil {
		apps = AppUsers(rc, app, nil)
	}
	file, err := ClusterUsers(rc, in, apps).ACLFile()
	if err != nil {
		t.Fatal(err)
	}
	return ACLSecret(rc, file, in, "").Data
}

// primaryAndReplica starts orders-0 and orders-1 of rc with acl and waits until both are Ready
// and the primary counts the replica online (its first REPLCONF ACK in, a moment after the
// replica's sync: what keyroll waits for before a failover).
func primaryAndReplica(t *testing.T, rc *v1beta1.RedisCluster, acl map[string][]byte) (primary, replica *pod) {
	t.Helper()
	primary = startPod(t, rc, acl, "orders-0", nil)
	within(t, 10*time.Second, "the primary is Ready", primary.ready, primary.out)
	replica = startPod(t, rc, acl, "orders-1", primary)
	within(t, 30*time.Second, "the replica is Ready", replica.ready, primary.out, replica.out)
	online := func() bool {
		info, err := testground.RedisDo(primary.addr(), ProbeUser, string(acl[ProbePasswordKey]), "INFO", "replication")
		return err == nil && strings.Contains(info, fmt.Sprintf("port=%d,state=online", replica.port))
	}
	within(t, 5*time.Second, "the primary counts the replica online", online, primary.out, replica.out)
	return primary, replica
}

func startPodIn(t *testing.T, rc *v1beta1.RedisCluster, acl map[string][]byte, name string, primary *pod, root string, cred *syscall.Credential, extraConf string) *pod {
	t.Helper()
	port, err := testground.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &pod{t: t, rc: rc, root: root, port: port, out: &strings.Builder{}, exited: make(chan error, 1)}
	primaryAt := "no-primary 0"
	var others []*pod
	if primary != nil {
		primaryAt = "127.0.0.1 " + strconv.Itoa(primary.port)
		others = append(others, primary)
	}
	p.relocate = strings.NewReplacer(
		fmt.Sprintf("%s-0.%s %d", rc.Name, HeadlessServiceName(rc), RedisPort), primaryAt,
		configMountDir, filepath.Join(root, "config"), aclMountDir, filepath.Join(root, "acl"), tlsMountDir, filepath.Join(root, "tls"),
		runDir, filepath.Join(root, "run"), "dir /data", "dir "+filepath.Join(root, "data"),
		strconv.Itoa(RedisPort), strconv.Itoa(port))
	for _, d := range []string{"config", "acl", "run", "data"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cm := ConfigMap(rc)
	p.write("config", "redis.conf", p.relocate.Replace(cm.Data["redis.conf"])+"bind 127.0.0.1\n"+extraConf)
	p.write("config", "start.sh", p.relocate.Replace(cm.Data["start.sh"]))
	for k, v := range acl {
		p.write("acl", k, string(v))
	}
	// The start script asks its peers who the primary is: here, the primary given.
	peers := ""
	for _, o := range others {
		peers += fmt.Sprintf("127.0.0.1 %d\n", o.port)
	}
	p.write("config", "peers", peers)
	p.cmd = exec.Command("sh", filepath.Join(root, "config", "start.sh"))
	p.cmd.Env = append(os.Environ(), "POD_NAME="+name, "POD_IP=127.0.0.1")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if cred != nil {
		chownAll(t, root, int(cred.Uid), int(cred.Gid))
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) })
	go func() { p.exited <- p.cmd.Wait() }()
	p.startProbe(t)
	return p
}

// chownAll gives a pod directory to the user a container runs as.
func chownAll(t *testing.T, root string, uid, gid int) {
	t.Helper()
	err := filepath.Walk(root, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (p *pod) write(dir, name, content string) {
	p.t.Helper()
	if err := os.WriteFile(filepath.Join(p.root, dir, name), []byte(content), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pod) addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

// ready asks the pod's probe sidecar as the kubelet's readiness probe does.
func (p *pod) ready() bool {
	return p.probe(p.redis().ReadinessProbe) == nil
}

// alive asks the pod's probe sidecar as the kubelet's liveness (and startup) probe does, with the
// probe's timeout as the kubelet enforces it.
func (p *pod) alive() error {
	return p.probe(p.redis().LivenessProbe)
}

// redis is the Redis container of the pod's template.
func (p *pod) redis() corev1.Container {
	return StatefulSet(p.rc, "v", testProbeImage).Spec.Template.Spec.Containers[0]
}

func (p *pod) probe(pr *corev1.Probe) error {
	c := http.Client{Timeout: time.Duration(pr.TimeoutSeconds) * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", p.probePort, pr.HTTPGet.Path))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode < 200 || resp.StatusCode >= 400 { // the kubelet's success
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	return nil
}

// startProbe runs the probe sidecar's command (cmd/keyroll-probe, built once) beside the pod's
// Redis, with the pod's paths and Redis port, answering on a loopback port of its own: in a
// process group of its own, so that stopping Redis's leaves it running.
func (p *pod) startProbe(t *testing.T) {
	t.Helper()
	bin, err := probeBinary()
	if err != nil {
		t.Fatal(err)
	}
	if p.probePort, err = testground.FreePort(); err != nil {
		t.Fatal(err)
	}
	sidecar := StatefulSet(p.rc, "v", testProbeImage).Spec.Template.Spec.InitContainers[0]
	args := []string{}
	for _, a := range sidecar.Command[1:] {
		switch {
		case a == "--listen-ip=$(POD_IP)":
			a = "--listen-ip=127.0.0.1" // as the kubelet expands it, with the pod's IP
		case strings.HasPrefix(a, "--port="):
			a = fmt.Sprintf("--port=%d", p.probePort)
		}
		args = append(args, p.relocate.Replace(a))
	}
	cmd := exec.Command(bin, args...)
	// Its log apart from the script's: a strings.Builder takes one writer at a time.
	cmd.Stdout, cmd.Stderr = &p.probeOut, &p.probeOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// probeBinary builds cmd/keyroll-probe once for the package's tests (TestMain removes it).
var probeBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "keyroll-probe-")
	if err != nil {
		return "", err
	}
	probeBinDir = dir
	bin := filepath.Join(dir, "keyroll-probe")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/keyroll/keyroll/cmd/keyroll-probe")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building cmd/keyroll-probe: %w: %s", err, out)
	}
	return bin, nil
})

var probeBinDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if probeBinDir != "" {
		_ = os.RemoveAll(probeBinDir)
	}
	os.Exit(code)
}

func within(t *testing.T, d time.Duration, what string, ok func() bool, out ...*strings.Builder) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			var logs []string
			for _, o := range out {
				logs = append(logs, o.String())
			}
			t.Fatalf("%s: not within %s\n%s", what, d, strings.Join(logs, "\n---\n"))
		}
	}
}

// A primary and a replica as pods run them, with hardened app rules (no dangerous commands, so
// neither PSYNC nor REPLCONF nor INFO): the replica replicates as keyroll's replication user, the
// probe passes on the primary at once and on the replica only once its link is up and its first
// sync done, the app user works with its rules only, and SIGTERM stops Redis and the script.
func TestPodsReplicateAndProbeOnUsersOfTheirOwn(t *testing.T) {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	rc.Spec.Credentials.ACLRules = []string{"~app:*", "+@read", "+@write", "-@dangerous"}
	in := Internal{Admin: "admin-pw", Replication: "repl \"pw\" with\\odd chars", Probe: "probe-pw"}
	app := &Credential{Username: "V_ORDERS_A", Password: "pass-a"}
	users := ClusterUsers(rc, in, AppUsers(rc, app, nil))
	file, err := users.ACLFile()
	if err != nil {
		t.Fatal(err)
	}
	acl := ACLSecret(rc, file, in, "").Data

	primary := startPod(t, rc, acl, "orders-0", nil)
	within(t, 10*time.Second, "the primary is Ready", primary.ready, primary.out)
	replica := startPod(t, rc, acl, "orders-1", primary)
	if replica.ready() {
		t.Fatal("the replica is Ready before its first sync")
	}
	within(t, 30*time.Second, "the replica is Ready", replica.ready, primary.out, replica.out)
	info, err := testground.RedisDo(replica.addr(), AdminUser, in.Admin, "INFO", "replication")
	if err != nil || !strings.Contains(info, "master_link_status:up") {
		t.Fatalf("replica's INFO replication: %q, %v", info, err)
	}

	if out, err := testground.RedisDo(primary.addr(), app.Username, app.Password, "SET", "app:1", "v"); err != nil || out != "OK" {
		t.Fatalf("the app user writes app:1: %q, %v", out, err)
	}
	within(t, 5*time.Second, "the write reaches the replica", func() bool {
		v, err := testground.RedisDo(replica.addr(), app.Username, app.Password, "GET", "app:1")
		return err == nil && v == "v"
	})
	for _, cmd := range [][]string{{"SET", "other:1", "v"}, {"INFO"}, {"PSYNC", "?", "-1"}} {
		if _, err := testground.RedisDo(primary.addr(), app.Username, app.Password, cmd...); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("the app user may run %v: %v", cmd, err)
		}
	}
	if _, err := testground.RedisDo(primary.addr(), ProbeUser, in.Probe, "GET", "app:1"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the probe user may read keys: %v", err)
	}

	for _, p := range []*pod{replica, primary} {
		_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case err := <-p.exited:
			if err != nil {
				t.Errorf("the script exited with %v after SIGTERM, want 0 (Redis stops cleanly)\n%s", err, p.out)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the script did not stop within 10 s of SIGTERM\n%s", p.out)
		}
		within(t, 5*time.Second, "Redis stopped with the script", func() bool { return !testground.PortBound(p.port) })
	}
}

// A Redis container that dies is restarted by the kubelet in the same pod, with the volumes of
// its first start: the start script must run again as it did the first time. A replica runs as
// an unprivileged user (as the image's redis user does; root would ignore the read-only mode the
// first start left on runtime.conf), its Redis is killed, and the script started again in the
// same pod directory: the replica comes back, replicates and is Ready.
func TestStartScriptStartsAgainInTheSamePod(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs the pod's script as another user and needs root, as make unit has")
	}
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	in := Internal{Admin: "admin-pw", Replication: "repl-pw", Probe: "probe-pw"}
	acl := aclOf(t, rc, in, &Credential{Username: "V_ORDERS_A", Password: "pass-a"})
	primary := startPod(t, rc, acl, "orders-0", nil)
	within(t, 10*time.Second, "the primary is Ready", primary.ready, primary.out)

	root := t.TempDir()
	// The user of the pod must reach its directory: open the temporary directories above it.
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	first := startPodIn(t, rc, acl, "orders-1", primary, root, nobody, "")
	within(t, 30*time.Second, "the replica is Ready", first.ready, primary.out, first.out)
	if fi, err := os.Stat(filepath.Join(root, "run", "runtime.conf")); err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("runtime.conf after the first start: %v %v", fi, err)
	}
	if out, err := exec.Command("pkill", "-KILL", "-f", "redis-server.*"+strconv.Itoa(first.port)).CombinedOutput(); err != nil {
		t.Fatalf("killing the replica's Redis: %v\n%s", err, out)
	}
	select {
	case err := <-first.exited:
		t.Logf("the first start's script ended with %v once its Redis was killed", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("the script did not end when its Redis was killed\n%s", first.out)
	}

	again := startPodIn(t, rc, acl, "orders-1", primary, root, nobody, "")
	within(t, 30*time.Second, "the restarted replica is Ready", again.ready, primary.out, again.out)
	info, err := testground.RedisDo(again.addr(), AdminUser, in.Admin, "INFO", "replication")
	if err != nil || !strings.Contains(info, "master_link_status:up") {
		t.Fatalf("the restarted replica's INFO replication: %q, %v\n%s", info, err, again.out)
	}
}

// Defect: FAILOVER from a primary the script had started never completed (Redis aborted it
// after its timeout): the old primary, to become the replica of the new one, logs in to it as the
// replication user, and only replicas had that user's password in their configuration.
func TestAPrimaryHandsItsRoleOverByFailover(t *testing.T) {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	in := Internal{Admin: "admin-pw", Replication: "repl-pw", Probe: "probe-pw"}
	primary, replica := primaryAndReplica(t, rc, aclOf(t, rc, in, nil))

	if out, err := testground.RedisDo(primary.addr(), AdminUser, in.Admin, "FAILOVER", "TO", "127.0.0.1", strconv.Itoa(replica.port), "TIMEOUT", "5000"); err != nil || out != "OK" {
		t.Fatalf("FAILOVER as keyroll's admin: %q, %v", out, err)
	}
	role := func(p *pod) string {
		info, _ := testground.RedisDo(p.addr(), AdminUser, in.Admin, "INFO", "replication")
		for _, l := range strings.Split(info, "\n") {
			if r, ok := strings.CutPrefix(strings.TrimSpace(l), "role:"); ok {
				return r
			}
		}
		return ""
	}
	within(t, 10*time.Second, "the replica is the primary and the old primary its replica", func() bool {
		return role(replica) == "master" && role(primary) == "slave"
	}, primary.out, replica.out)
	within(t, 30*time.Second, "the old primary is Ready as a replica", primary.ready, primary.out)
}

// Defect it guards against: a primary whose Redis stopped and started again in the same pod
// (crashed, OOM-killed) came back empty as the primary, and its replicas resynced to empty. Its
// replica still answers, as a replica of it: the script starts it as that replica's replica, the
// replica keeps its data, and once keyroll promotes the replica the old primary syncs from it.
func TestARestartedPrimaryDoesNotEmptyItsReplicas(t *testing.T) {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	rc.Spec.Credentials.ACLRules = []string{"~app:*", "+@read", "+@write"}
	in := Internal{Admin: "admin-pw", Replication: "repl-pw", Probe: "probe-pw"}
	app := &Credential{Username: "V_ORDERS_A", Password: "pass-a"}
	acl := aclOf(t, rc, in, app)
	primary, replica := primaryAndReplica(t, rc, acl)
	if out, err := testground.RedisDo(primary.addr(), app.Username, app.Password, "SET", "app:1", "v"); err != nil || out != "OK" {
		t.Fatalf("SET app:1: %q, %v", out, err)
	}
	has := func(p *pod) func() bool {
		return func() bool {
			v, err := testground.RedisDo(p.addr(), app.Username, app.Password, "GET", "app:1")
			return err == nil && v == "v"
		}
	}
	within(t, 5*time.Second, "the write reaches the replica", has(replica))

	if out, err := exec.Command("pkill", "-KILL", "-f", "redis-server.*"+strconv.Itoa(primary.port)).CombinedOutput(); err != nil {
		t.Fatalf("killing the primary's Redis: %v\n%s", err, out)
	}
	t.Logf("the primary's script ended with %v once its Redis was killed", <-primary.exited)
	again := startPodIn(t, rc, acl, "orders-0", replica, primary.root, nil, "")
	want := fmt.Sprintf("replicaof 127.0.0.1 %d", replica.port)
	within(t, 10*time.Second, "the restarted primary starts as its replica's replica", func() bool {
		conf, _ := os.ReadFile(filepath.Join(primary.root, "run", "runtime.conf"))
		return strings.Contains(string(conf), want)
	}, again.out)
	time.Sleep(2 * time.Second) // long enough for a sync that would empty the replica
	if !has(replica)() {
		t.Fatalf("the replica lost app:1 once its primary started again\n%s", replica.out)
	}
	if again.ready() {
		t.Error("the restarted primary is Ready while it replicates from a replica that has no link to a primary")
	}

	// keyroll promotes the replica; the old primary syncs from it.
	if out, err := testground.RedisDo(replica.addr(), AdminUser, in.Admin, "REPLICAOF", "NO", "ONE"); err != nil || out != "OK" {
		t.Fatalf("REPLICAOF NO ONE as keyroll's admin: %q, %v", out, err)
	}
	within(t, 30*time.Second, "the old primary is Ready as the new primary's replica", again.ready, again.out, replica.out)
	within(t, 5*time.Second, "the old primary has app:1 again", has(again), again.out)
}
