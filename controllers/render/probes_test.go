package render

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/testground"
)

// The probes of the Redis container, run as the kubelet runs them against pods that run the start
// script with a real redis-server (startPod).

// A replica is Ready only while its link to the primary is up: when its primary's Redis stops,
// the replica still answers (liveness passes, it is not restarted) but fails readiness.
func TestReadinessFailsAReplicaWhosePrimaryStopped(t *testing.T) {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	in := Internal{Admin: "admin-pw", Replication: "repl-pw", Probe: "probe-pw"}
	primary, replica := primaryAndReplica(t, rc, aclOf(t, rc, in, nil))

	_ = syscall.Kill(primary.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-primary.exited:
		if err != nil {
			t.Fatalf("the primary's script exited with %v after SIGTERM, want 0\n%s", err, primary.out)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the primary did not stop within 10 s of SIGTERM\n%s", primary.out)
	}
	start := time.Now()
	within(t, 5*time.Second, "the replica fails readiness", func() bool { return !replica.ready() }, replica.out)
	t.Logf("the replica failed readiness %s after its primary stopped", time.Since(start).Round(time.Millisecond))
	if err := replica.alive(); err != nil {
		t.Fatalf("liveness on the replica: %v; want it to pass, the replica answers", err)
	}
	info, err := testground.RedisDo(replica.addr(), ProbeUser, in.Probe, "INFO", "replication")
	if err != nil || !strings.Contains(info, "role:slave") || strings.Contains(info, "master_link_status:up") {
		t.Fatalf("the replica's INFO replication: %q, %v; want a replica that answers, its link down", info, err)
	}
	time.Sleep(2 * time.Second) // the replica tries to reconnect meanwhile
	if replica.ready() {
		t.Error("the replica is Ready again while its primary is still stopped")
	}
}

// The liveness probe leaves a Redis alone that loads its dataset and restarts one that answers
// nothing: a primary with keys saved on its volume starts again in the same pod directory and
// loads them slowly (key-load-delay), answering LOADING meanwhile, and the probe passes; a Redis
// stopped (SIGSTOP, as a hung one answers nothing) fails it within the probe's timeout, and
// passes again once it runs on.
func TestLivenessProbeLeavesALoadAloneAndFailsAHungRedis(t *testing.T) {
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	rc.Spec.Credentials.ACLRules = []string{"~*", "&*", "+@all"}
	in := Internal{Admin: "admin-pw", Replication: "repl-pw", Probe: "probe-pw"}
	app := &Credential{Username: "V_ORDERS_A", Password: "pass-a"}
	file, err := ClusterUsers(rc, in, AppUsers(rc, app, nil)).ACLFile()
	if err != nil {
		t.Fatal(err)
	}
	acl := ACLSecret(rc, file, in, "").Data
	root := t.TempDir()
	first := startPodIn(t, rc, acl, "orders-0", nil, root, nil, "")
	within(t, 10*time.Second, "the primary is Ready", first.ready, first.out)
	if err := first.alive(); err != nil {
		t.Fatalf("liveness on a running primary: %v", err)
	}
	const keys = 2000
	mset := []string{"MSET"}
	for i := range keys {
		mset = append(mset, fmt.Sprintf("app:%d", i), "v")
	}
	if out, err := testground.RedisDo(first.addr(), app.Username, app.Password, mset...); err != nil || out != "OK" {
		t.Fatalf("MSET: %q, %v", out, err)
	}
	_ = syscall.Kill(first.cmd.Process.Pid, syscall.SIGTERM) // Redis saves its dataset as it stops
	select {
	case err := <-first.exited:
		if err != nil {
			t.Fatalf("the script exited with %v after SIGTERM, want 0\n%s", err, first.out)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the primary did not stop within 10 s of SIGTERM\n%s", first.out)
	}
	if fi, err := os.Stat(filepath.Join(root, "data", "dump.rdb")); err != nil || fi.Size() == 0 {
		t.Fatalf("no snapshot on the volume after a clean stop: %v", err)
	}

	// 2,000 keys, 2 ms each: a load of about 4 s.
	again := startPodIn(t, rc, acl, "orders-0", nil, root, nil, "key-load-delay 2000\nloading-process-events-interval-bytes 1024\n")
	loading := func() bool {
		_, err := testground.RedisDo(again.addr(), ProbeUser, in.Probe, "PING")
		return err != nil && strings.Contains(err.Error(), "LOADING")
	}
	within(t, 10*time.Second, "Redis answers LOADING", loading, again.out)
	start := time.Now()
	passed, readyWhileLoading := 0, again.ready()
	for loading() {
		if err := again.alive(); err != nil && loading() {
			t.Fatalf("liveness failed while Redis loads its dataset: %v", err)
		}
		passed++
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("liveness passed %d times in the %s Redis answered LOADING (readiness then: %v)", passed, time.Since(start).Round(time.Millisecond), readyWhileLoading)
	if passed < 3 {
		t.Fatalf("the load lasted too short to tell (%d probes)", passed)
	}
	if readyWhileLoading {
		t.Error("the primary was Ready while it loaded its dataset")
	}
	within(t, 5*time.Second, "the primary is Ready once it has loaded", again.ready, again.out)
	if n, err := testground.RedisDo(again.addr(), app.Username, app.Password, "DBSIZE"); err != nil || n != strconv.Itoa(keys) {
		t.Fatalf("after the load DBSIZE %q, %v; want %d", n, err, keys)
	}
	if err := again.alive(); err != nil {
		t.Fatalf("liveness after the load: %v", err)
	}

	pgid := -again.cmd.Process.Pid
	if err := syscall.Kill(pgid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the last verdict answers for a second (--verdict-ttl)
	start = time.Now()
	err = again.alive()
	took := time.Since(start)
	_ = syscall.Kill(pgid, syscall.SIGCONT)
	if err == nil {
		t.Fatal("liveness passed on a stopped Redis")
	}
	t.Logf("liveness on a stopped Redis failed after %s: %v", took.Round(time.Millisecond), err)
	within(t, 5*time.Second, "liveness passes once Redis runs on", func() bool { return again.alive() == nil }, again.out)
}
