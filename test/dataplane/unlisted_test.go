package dataplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// unlistedScene is a cluster of three Redis pods with a listed consumer (app) and an unlisted one
// (report), both Deployments of consumer pods keeping their connections, and a client of the test
// process, outside the pod network, logged in on pod 0: all three with the credential before a
// rotation. The unlisted consumer reads its credential once, as many applications do.
type unlistedScene struct {
	rc             *v1beta1.RedisCluster
	ns             string
	oldUser, oldPw string
	app, report    *framework.Consumers
	rotatedAt      time.Time
	closeHost      func()
}

// readsCredentialOnce makes the consumer an application that reads its credential once, at
// start: the Secret's keys are mounted by subPath, which the kubelet never updates.
func readsCredentialOnce(d *appsv1.Deployment) {
	c := &d.Spec.Template.Spec.Containers[0]
	dir := c.VolumeMounts[0].MountPath
	c.VolumeMounts = []corev1.VolumeMount{
		{Name: "credentials", MountPath: dir + "/username", SubPath: "username", ReadOnly: true},
		{Name: "credentials", MountPath: dir + "/password", SubPath: "password", ReadOnly: true},
	}
}

func startUnlisted(t *testing.T, base string, opts ...framework.ClusterOption) *unlistedScene {
	t.Helper()
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, "vault-"+base, framework.Allow(ns))
	opts = append([]framework.ClusterOption{framework.Replicas(3), framework.WithConsumers("app")}, opts...)
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), opts...)
	rc = fw.WaitReady(t, rc, 3*time.Minute)
	sc := &unlistedScene{rc: rc, ns: ns}
	sc.oldUser, sc.oldPw, _ = fw.Credentials(rc)
	sc.app = fw.StartConsumers(t, ns, "app", 1, "cache:6379", "cache-credentials")
	sc.report = fw.StartConsumers(t, ns, "report", 1, "cache:6379", "cache-credentials", readsCredentialOnce)
	host := framework.RedisClient(framework.PodAddr(&fw.RedisPods(t, rc)[0]), sc.oldUser, sc.oldPw)
	if err := host.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	sc.closeHost = func() { _ = host.Close() }
	t.Cleanup(sc.closeHost)
	fw.RotateNow(t, rc)
	sc.rotatedAt = time.Now()
	return sc
}

// waitHeld waits until the rollout is done and status names both unlisted clients; it returns
// them and how long after the rotation.
func (sc *unlistedScene) waitHeld(t *testing.T) ([]v1beta1.OldUserClient, time.Duration) {
	t.Helper()
	var clients []v1beta1.OldUserClient
	framework.Eventually(t, 3*time.Minute, func() string {
		cur := fw.Get(t, sc.rc)
		clients = cur.Status.OldUserClients
		byPod := slices.ContainsFunc(clients, func(c v1beta1.OldUserClient) bool { return c.Workload == "Deployment/report" && c.User == sc.oldUser })
		byAddr := slices.ContainsFunc(clients, func(c v1beta1.OldUserClient) bool { return c.Workload == "" && c.User == sc.oldUser })
		if cur.Status.Rollout != nil || !byPod || !byAddr {
			return fmt.Sprintf("rollout %+v, status.oldUserClients %+v", cur.Status.Rollout, clients)
		}
		return ""
	})
	return clients, time.Since(sc.rotatedAt)
}

// waitRetired waits, within the given time, until the old user is refused on every pod, and
// returns how long after its clients were first seen (their earliest since, or seen).
func (sc *unlistedScene) waitRetired(t *testing.T, clients []v1beta1.OldUserClient, seen time.Time, within time.Duration) time.Duration {
	t.Helper()
	var cutAt time.Time
	framework.Eventually(t, within, func() string {
		if msg := fw.OnEveryPod(sc.rc, sc.oldUser, sc.oldPw, false); msg != "" {
			return msg
		}
		cutAt = time.Now()
		return ""
	})
	first := seen
	for _, c := range clients {
		if c.Since != nil && c.Since.Time.Before(first) {
			first = c.Since.Time
		}
	}
	return cutAt.Sub(first)
}

// TestUnlistedClientHoldsRetirement: after a rotation, a Deployment that is not a listed consumer
// and a client on the host, both still logged in with the old user, hold its retirement
// (rollout.unlistedClients Wait, the default): the old user stays on every node and its lease in
// the ledger; status, the condition and an event name the workload and the host's address. Once
// the host's client has gone and the workload is restarted by hand, the user leaves every node and
// its lease is revoked within a look or two.
func TestUnlistedClientHoldsRetirement(t *testing.T) {
	sc := startUnlisted(t, "unlisted")
	clients, after := sc.waitHeld(t)
	cur := fw.Get(t, sc.rc)
	if c := framework.Condition(cur, v1beta1.ConditionLeasesRevoked); c == nil || c.Reason != v1beta1.ReasonClientsStillLoggedIn || !strings.Contains(c.Message, "Deployment/report") {
		t.Errorf("LeasesRevoked %+v", c)
	}
	if len(cur.Status.Leases) != 2 {
		t.Errorf("%d leases in the ledger while the retirement is held, want the old one kept beside the new", len(cur.Status.Leases))
	}
	if msg := fw.OnEveryPod(sc.rc, sc.oldUser, sc.oldPw, true); msg != "" {
		t.Errorf("the old user while its retirement is held: %s", msg)
	}
	fw.WaitClusterEvents(t, sc.ns, sc.rc.Name, 10*time.Second, v1beta1.EventOldCredentialInUse)
	var conns int32
	for _, c := range clients {
		conns += c.Connections
	}
	if got := unlistedConnections(t, sc.ns, sc.rc.Name); got != float64(conns) || conns < 2 {
		t.Errorf("keyroll_unlisted_client_connections %v, want the %d connections status names", got, conns)
	}
	time.Sleep(15 * time.Second) // held, not a moment's delay
	if msg := fw.OnEveryPod(sc.rc, sc.oldUser, sc.oldPw, true); msg != "" {
		t.Errorf("15 s later: %s", msg)
	}

	sc.closeHost()
	fw.MustKubectl(t, nil, "-n", sc.ns, "rollout", "restart", "deployment/report")
	fw.MustKubectl(t, nil, "-n", sc.ns, "rollout", "status", "deployment/report", "--timeout=2m")
	restarted := time.Now()
	framework.Eventually(t, time.Minute, func() string {
		cur := fw.Get(t, sc.rc)
		if len(cur.Status.OldUserClients) > 0 || len(cur.Status.Leases) != 1 || len(cur.Status.RetiringUsers) > 0 {
			return fmt.Sprintf("clients %+v, %d leases, retiring %v", cur.Status.OldUserClients, len(cur.Status.Leases), cur.Status.RetiringUsers)
		}
		return fw.OnEveryPod(sc.rc, sc.oldUser, sc.oldPw, false)
	})
	if _, failed, failures := sc.app.Totals(); failed > 0 {
		t.Errorf("the listed consumer had %d failed commands: %v", failed, failures)
	}
	t.Logf("held for %v, named %s after the rotation; retired %s after the unlisted workload was restarted",
		clients, after.Round(100*time.Millisecond), time.Since(restarted).Round(100*time.Millisecond))
}

// unlistedConnections is keyroll_unlisted_client_connections of a cluster as the operator serves
// it (-1: no series).
func unlistedConnections(t *testing.T, ns, name string) float64 {
	t.Helper()
	fams, err := framework.ScrapeMetrics(fw.Operator().MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range fams["keyroll_unlisted_client_connections"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["namespace"] == ns && labels["name"] == name {
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestProceedAfterGraceCutsOffAndSaysWhom: with rollout.unlistedClients Proceed and a 30 s grace,
// the unlisted clients hold the retirement for 30 s from when keyroll first saw them; then the old
// user leaves every node, which cuts them off, and the event says whom.
func TestProceedAfterGraceCutsOffAndSaysWhom(t *testing.T) {
	sc := startUnlisted(t, "proceed", func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.UnlistedClients = v1beta1.UnlistedClientsSpec{Action: v1beta1.UnlistedClientsProceed, Grace: &metav1.Duration{Duration: 30 * time.Second}}
	})
	clients, _ := sc.waitHeld(t)
	seen := time.Now()
	if msg := fw.OnEveryPod(sc.rc, sc.oldUser, sc.oldPw, true); msg != "" {
		t.Errorf("the old user during the grace: %s", msg)
	}
	held := sc.waitRetired(t, clients, seen, 2*time.Minute)
	if held < 30*time.Second {
		t.Errorf("the old user was retired %s after the clients were first seen, before the 30 s grace", held.Round(time.Second))
	}
	events := fw.WaitClusterEvents(t, sc.ns, sc.rc.Name, 20*time.Second, v1beta1.EventUnlistedClientsCutOff)
	for _, e := range events {
		if e.Reason == v1beta1.EventUnlistedClientsCutOff && (!strings.Contains(e.Note, "Deployment/report") || !strings.Contains(e.Note, "(no pod's)")) {
			t.Errorf("the cut-off event does not name the workload and the host's address: %s", e.Note)
		}
	}
	t.Logf("cut off %s after the clients were first seen (grace 30 s)", held.Round(100*time.Millisecond))
}

// TestRestartActionRestartsTheLoggedInWorkload: with rollout.unlistedClients Restart, the unlisted
// Deployment still logged in with the old user is restarted by keyroll as a consumer (status.consumers,
// via LoggedIn) with no failed command, while the host's client, which is no pod's, holds the
// retirement untouched; once it has gone, the old user is retired.
func TestRestartActionRestartsTheLoggedInWorkload(t *testing.T) {
	sc := startUnlisted(t, "restart", func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.UnlistedClients = v1beta1.UnlistedClientsSpec{Action: v1beta1.UnlistedClientsRestart}
	})
	var cur *v1beta1.RedisCluster
	framework.Eventually(t, 3*time.Minute, func() string {
		cur = fw.Get(t, sc.rc)
		adopted := slices.ContainsFunc(cur.Status.Consumers, func(c v1beta1.ConsumerInUse) bool {
			return c.Kind == "Deployment" && c.Name == "report" && c.Via == v1beta1.ConsumerLoggedIn && c.Restarted
		})
		onlyHost := len(cur.Status.OldUserClients) == 1 && cur.Status.OldUserClients[0].Workload == ""
		if !adopted || cur.Status.Rollout != nil || !onlyHost || fw.ConsumerVersion(t, sc.ns, "report") != cur.Status.Credential.Version {
			return fmt.Sprintf("consumers %+v, rollout %+v, clients %+v", cur.Status.Consumers, cur.Status.Rollout, cur.Status.OldUserClients)
		}
		return ""
	})
	restartedIn := time.Since(sc.rotatedAt)
	if msg := fw.OnEveryPod(sc.rc, sc.oldUser, sc.oldPw, true); msg != "" {
		t.Errorf("the old user while the host's client holds it: %s", msg)
	}
	fw.WaitClusterEvents(t, sc.ns, sc.rc.Name, 10*time.Second, v1beta1.EventUnlistedClientRestarting)
	sc.closeHost()
	framework.Eventually(t, time.Minute, func() string {
		cur := fw.Get(t, sc.rc)
		if len(cur.Status.OldUserClients) > 0 || len(cur.Status.Leases) != 1 {
			return fmt.Sprintf("clients %+v, %d leases", cur.Status.OldUserClients, len(cur.Status.Leases))
		}
		return fw.OnEveryPod(sc.rc, sc.oldUser, sc.oldPw, false)
	})
	for name, c := range map[string]*framework.Consumers{"app": sc.app, "report": sc.report} {
		if _, failed, failures := c.Totals(); failed > 0 {
			t.Errorf("consumer %s had %d failed commands: %v", name, failed, failures)
		}
	}
	t.Logf("the unlisted Deployment was restarted onto the new credential %s after the rotation", restartedIn.Round(100*time.Millisecond))
}
