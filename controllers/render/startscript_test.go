package render

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/testground"
)

// podFiles lays out what a Redis pod mounts (the ConfigMap, the ACL Secret, the credentials
// Secret) under a temporary directory, with keyroll's mount paths and Redis port moved there.
type podFiles struct {
	root, acl string
	port      int
	relocate  *strings.Replacer
}

func newPodFiles(t *testing.T) *podFiles {
	t.Helper()
	root := t.TempDir()
	port, err := testground.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &podFiles{root: root, acl: filepath.Join(root, "acl"), port: port}
	p.relocate = strings.NewReplacer(configMountDir, filepath.Join(root, "config"), aclMountDir, p.acl,
		credsMountDir, filepath.Join(root, "credentials"), runDir, filepath.Join(root, "run"),
		"dir /data", "dir "+filepath.Join(root, "data"), strconv.Itoa(redisPort), strconv.Itoa(port))
	for _, d := range []string{"config", "acl", "credentials", "run", "data"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// write writes a file the way the kubelet updates a mounted Secret: atomically.
func (p *podFiles) write(t *testing.T, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(p.root, dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(p.root, dir, name)); err != nil {
		t.Fatal(err)
	}
}

// setACL writes the ACL Secret for the current credential and the superseded users of rc's ledger.
func (p *podFiles) setACL(t *testing.T, rc *v1alpha1.RedisCluster, cur *Credential, reload string) {
	t.Helper()
	old, _ := os.ReadFile(filepath.Join(p.acl, ACLFileKey))
	file, err := ACLFile(rc, cur, ParseACLUsers(string(old)), reload)
	if err != nil {
		t.Fatal(err)
	}
	p.write(t, "acl", ACLFileKey, file)
	p.write(t, "acl", ReloadPasswordKey, reload)
}

// The script a Redis pod runs, with a real redis-server: the pod reloads its aclfile when the
// mounted Secret changes, so a new user is known and a dropped (revoked) user is forgotten
// without a restart; SIGTERM stops Redis and the script.
func TestStartScriptReloadsTheACLFileAndStopsOnSIGTERM(t *testing.T) {
	rc := &v1alpha1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	rc.Spec.Credentials.ACLRules = []string{"~*", "&*", "+@all"}
	p := newPodFiles(t)
	cm := ConfigMap(rc)
	p.write(t, "config", "redis.conf", p.relocate.Replace(cm.Data["redis.conf"])+"bind 127.0.0.1\n")
	p.write(t, "config", "start.sh", p.relocate.Replace(cm.Data["start.sh"]))
	a := &Credential{Username: "V_ORDERS_A", Password: "pass-a"}
	b := &Credential{Username: "V_ORDERS_B", Password: "pass-b"}
	p.write(t, "credentials", "username", a.Username)
	p.write(t, "credentials", "password", a.Password)
	p.setACL(t, rc, a, "reload-pw")

	cmd := exec.Command("sh", filepath.Join(p.root, "config", "start.sh"))
	cmd.Env = append(os.Environ(), "POD_NAME=orders-0", "KEYROLL_ACL_RELOAD_SECONDS=1")
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	addr := fmt.Sprintf("127.0.0.1:%d", p.port)
	works := func(c *Credential) bool {
		who, err := testground.RedisWhoAmI(addr, c.Username, c.Password)
		return err == nil && who == c.Username
	}
	within := func(d time.Duration, what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s\n%s", what, d, out)
			}
		}
	}
	within(10*time.Second, "credential A works at start", func() bool { return works(a) })
	if works(b) {
		t.Fatal("credential B works before it is in the aclfile")
	}

	// A rotation: B is current, A superseded and still in the aclfile.
	rc.Status.Leases = []v1alpha1.LeaseRecord{
		{LeaseID: "l-a", State: v1alpha1.LeaseSuperseded, Username: a.Username},
		{LeaseID: "l-b", State: v1alpha1.LeaseActive, Username: b.Username},
	}
	p.setACL(t, rc, b, "reload-pw")
	within(5*time.Second, "the running Redis knows B after the aclfile changed", func() bool { return works(b) })
	if !works(a) {
		t.Fatal("A stopped working while it was still in the aclfile")
	}
	// A's lease is revoked: keyroll drops A from the aclfile, and the running Redis forgets A.
	rc.Status.Leases = rc.Status.Leases[1:]
	p.setACL(t, rc, b, "reload-pw")
	within(5*time.Second, "the running Redis forgets A after it was dropped from the aclfile", func() bool { return !works(a) })
	if !works(b) {
		t.Fatal("B stopped working")
	}
	// The reload user can reload the aclfile and nothing else.
	if _, err := testground.RedisDo(addr, reloadUser, "reload-pw", "GET", "k"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the reload user may read keys: %v", err)
	}

	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the script exited with %v after SIGTERM, want 0 (Redis stops cleanly)\n%s", err, out)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the script did not stop within 10 s of SIGTERM\n%s", out)
	}
	within(5*time.Second, "Redis stopped with the script", func() bool { return !testground.PortBound(p.port) })
}
