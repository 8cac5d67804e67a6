package rediscluster

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/redisnode"
)

// rotateHolding rotates the cluster while a client at addr is logged in as the current user on
// every node; it returns the cluster settled and the old user.
func (h *harness) rotateHolding(t *testing.T, addr string) (*v1beta1.RedisCluster, string) {
	t.Helper()
	rc := h.settle(t)
	old := rc.Status.Credential.Username
	for i := range rc.Spec.Replicas {
		h.redis.SetClients(nodeAddr(int(i)), redisnode.Conn{User: old, Addr: addr}, redisnode.Conn{User: old, Addr: addr})
	}
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.eventReasons()
	return h.settle(t), old
}

// A client that is no listed consumer's pod, still logged in with the superseded user, holds the
// retirement (rollout.unlistedClients Wait, the default): the user stays on every node, its lease
// live; status, the condition, an event and the metric name it by address; once it has gone, the
// retirement goes on.
func TestUnlistedClientHoldsTheRetirement(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc, old := h.rotateHolding(t, "192.0.2.7:40001")
	if rc.Status.Credential.Username == old {
		t.Fatal("no rotation")
	}
	for i := range 3 {
		if !slices.Contains(h.redis.Users(nodeAddr(i)), old) {
			t.Fatalf("the old user %s left node %d while a client was logged in with it", old, i)
		}
	}
	if len(rc.Status.OldUserClients) != 1 {
		t.Fatalf("status.oldUserClients %+v, want the one client", rc.Status.OldUserClients)
	}
	c := rc.Status.OldUserClients[0]
	if c.Address != "192.0.2.7" || c.Workload != "" || c.User != old || c.Connections != 6 {
		t.Errorf("client %+v, want 192.0.2.7 (no pod's), as %s, 6 connections over three nodes", c, old)
	}
	cond := condition(rc, v1beta1.ConditionLeasesRevoked)
	if cond == nil || cond.Reason != v1beta1.ReasonClientsStillLoggedIn || !strings.Contains(cond.Message, "address 192.0.2.7 (no pod's)") {
		t.Errorf("LeasesRevoked %+v", cond)
	}
	if credentialLeases := len(rc.Status.Leases); credentialLeases != 2 {
		t.Errorf("%d leases in the ledger, want the superseded one kept beside the new", credentialLeases)
	}
	if n := unlistedConnections(t, "shop", "orders"); n != 6 {
		t.Errorf("keyroll_unlisted_client_connections %v, want 6", n)
	}
	if n := countOf(h.eventReasons(), v1beta1.EventOldCredentialInUse); n != 1 {
		t.Errorf("%d %s events, want 1", n, v1beta1.EventOldCredentialInUse)
	}

	for i := range 3 {
		h.redis.SetClients(nodeAddr(i))
	}
	rc = h.settle(t)
	if slices.Contains(h.redis.Users(nodeAddr(0)), old) || len(rc.Status.OldUserClients) != 0 || len(rc.Status.Leases) != 1 {
		t.Errorf("after the client left: old user on node 0 %v, clients %+v, %d leases", slices.Contains(h.redis.Users(nodeAddr(0)), old), rc.Status.OldUserClients, len(rc.Status.Leases))
	}
	if cond := condition(rc, v1beta1.ConditionLeasesRevoked); cond == nil || cond.Status != metav1.ConditionTrue {
		t.Errorf("LeasesRevoked %+v after the retirement", cond)
	}
	if n := unlistedConnections(t, "shop", "orders"); n != 0 {
		t.Errorf("keyroll_unlisted_client_connections %v after the retirement, want none", n)
	}
}

// unlistedConnections reads keyroll_unlisted_client_connections of a cluster from the registry
// (0: no series).
func unlistedConnections(t *testing.T, ns, name string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "keyroll_unlisted_client_connections" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns && labels["name"] == name {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// A pod's client is named by its workload; with Proceed the retirement waits for the grace from
// when keyroll first saw it, then goes on and an event says whom it cut off.
func TestProceedAfterGraceCutsOffAndSaysWhom(t *testing.T) {
	d, rs, report := deploymentPod("report", "10.0.9.9")
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.UnlistedClients = v1beta1.UnlistedClientsSpec{Action: v1beta1.UnlistedClientsProceed, Grace: &metav1.Duration{Duration: 30 * time.Second}}
	}), d, rs)
	if err := h.k8s.Create(context.Background(), report); err != nil {
		t.Fatal(err)
	}
	rc, old := h.rotateHolding(t, "10.0.9.9:51000")
	if len(rc.Status.OldUserClients) != 1 || rc.Status.OldUserClients[0].Workload != "Deployment/report" {
		t.Fatalf("status.oldUserClients %+v, want Deployment/report", rc.Status.OldUserClients)
	}
	h.clock.Step(20 * time.Second)
	h.settle(t)
	if !slices.Contains(h.redis.Users(nodeAddr(0)), old) {
		t.Fatal("the old user was retired before the grace was over")
	}
	h.eventReasons()
	h.clock.Step(11 * time.Second)
	rc = h.settle(t)
	if slices.Contains(h.redis.Users(nodeAddr(0)), old) || len(rc.Status.OldUserClients) != 0 {
		t.Fatalf("after the grace: old user still on the node %v, clients %+v", slices.Contains(h.redis.Users(nodeAddr(0)), old), rc.Status.OldUserClients)
	}
	var cutOff string
	for {
		select {
		case e := <-h.events.Events:
			if strings.Contains(e, v1beta1.EventUnlistedClientsCutOff) {
				cutOff = e
			}
			continue
		default:
		}
		break
	}
	if !strings.Contains(cutOff, "Deployment/report (10.0.9.9) as "+old) {
		t.Errorf("cut-off event %q does not name Deployment/report", cutOff)
	}
}

// A user cut off at once (its lease revoked outside keyroll, onRevokedOutside CutOff) leaves the
// nodes at once as before; a Warning event names who was logged in as it and lost the connection.
func TestCutOffNamesWhoWasCutOff(t *testing.T) {
	h := newHarness(t, cluster())
	old := h.settle(t).Status.Credential
	h.redis.SetClients(nodeAddr(0), redisnode.Conn{User: old.Username, Addr: "192.0.2.9:50000"})
	h.vault.RevokeOutside(old.Lease.LeaseID)
	h.eventReasons()
	h.clock.Step(credential.DefaultLeaseCheckInterval)
	h.settle(t)
	if slices.Contains(h.redis.Users(nodeAddr(0)), old.Username) {
		t.Fatal("the revoked user is still on the node: a cut-off is not held for its clients")
	}
	var named string
	for {
		select {
		case e := <-h.events.Events:
			if strings.Contains(e, v1beta1.EventClientsCutOff) {
				named = e
			}
			continue
		default:
		}
		break
	}
	if !strings.Contains(named, "address 192.0.2.9 (no pod's) as "+old.Username) {
		t.Errorf("the cut-off event %q does not name the client", named)
	}
}

// A node whose CLIENT LIST keyroll cannot read (its reply is over the bound: clients named their
// connections with megabytes) has unknown clients: with Wait they hold the retirement, named, and
// the reconcile goes on without an error; with Proceed the grace runs from when keyroll first
// could not read them, and then the user is retired all the same.
func TestUnreadableClientListHoldsWithoutBlocking(t *testing.T) {
	for _, action := range []v1beta1.UnlistedClientsAction{v1beta1.UnlistedClientsWait, v1beta1.UnlistedClientsProceed} {
		t.Run(string(action), func(t *testing.T) {
			h := newHarness(t, cluster(threeNodes, func(rc *v1beta1.RedisCluster) {
				rc.Spec.Rollout.UnlistedClients = v1beta1.UnlistedClientsSpec{Action: action, Grace: &metav1.Duration{Duration: 30 * time.Second}}
			}))
			h.redis.ClientsErr = map[string]error{nodeAddr(1): redisnode.ErrReplyTooLarge}
			_, old := h.rotateHolding(t, "192.0.2.7:40001")
			for i := range 3 {
				h.redis.SetClients(nodeAddr(i)) // the known clients have gone
			}
			rc := h.settle(t)
			if !slices.Contains(h.redis.Users(nodeAddr(0)), old) {
				t.Fatal("the old user was retired while node 1's clients were unknown")
			}
			if len(rc.Status.OldUserClients) != 1 || !strings.Contains(rc.Status.OldUserClients[0].Workload, "over keyroll's bound") {
				t.Fatalf("status.oldUserClients %+v, want node 1's unknown clients", rc.Status.OldUserClients)
			}
			if cond := condition(rc, v1beta1.ConditionLeasesRevoked); cond == nil || !strings.Contains(cond.Message, "could not be read") {
				t.Errorf("LeasesRevoked %+v does not say the clients are unknown", cond)
			}
			h.clock.Step(31 * time.Second)
			h.settle(t)
			retired := !slices.Contains(h.redis.Users(nodeAddr(0)), old)
			if retired != (action == v1beta1.UnlistedClientsProceed) {
				t.Errorf("after the grace, with %s: old user retired %v", action, retired)
			}
		})
	}
}

// However many clients hold a retirement, the condition's message and the events name a bounded
// number of them (a message over 32 KiB would make every status write of the cluster fail).
func TestManyUnlistedClientsKeepTheStatusWritable(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc := h.settle(t)
	old := rc.Status.Credential.Username
	var conns []redisnode.Conn
	for i := range 2000 {
		conns = append(conns, redisnode.Conn{User: old, Addr: "192.0." + strconv.Itoa(2+i/250) + "." + strconv.Itoa(i%250) + ":40000"})
	}
	for i := range 3 {
		h.redis.SetClients(nodeAddr(i), conns...)
	}
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	cond := condition(rc, v1beta1.ConditionLeasesRevoked)
	if cond == nil || cond.Reason != v1beta1.ReasonClientsStillLoggedIn {
		t.Fatalf("LeasesRevoked %+v", cond)
	}
	if len(cond.Message) > 4096 || !strings.Contains(cond.Message, "and 1990 more") {
		t.Errorf("a message of %d bytes for 2,000 clients: %.300s", len(cond.Message), cond.Message)
	}
	if len(rc.Status.OldUserClients) != 16 {
		t.Errorf("status.oldUserClients holds %d, want 16", len(rc.Status.OldUserClients))
	}
	for len(h.events.Events) > 0 {
		if e := <-h.events.Events; len(e) > 4096 {
			t.Errorf("an event of %d bytes", len(e))
		}
	}
}
