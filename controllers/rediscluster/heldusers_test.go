package rediscluster

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/redisnode"
)

// onEveryNode says whether user is on each of the three nodes.
func (h *harness) onEveryNode(user string) []bool {
	var on []bool
	for i := range 3 {
		on = append(on, slices.Contains(h.redis.Users(nodeAddr(i)), user))
	}
	return on
}

// A lease revoked in Vault (onRevokedOutside RollOver) keeps its user on the nodes only until the
// new credential has rolled out: then the user leaves every node although a client that is no
// listed consumer is still logged in with it, which Wait would otherwise wait for.
func TestGoneLeaseRetiresWhateverItsClients(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.OnRevokedOutside = v1beta1.RevokedOutsideRollOver
	}))
	rc := h.settle(t)
	old, lease := rc.Status.Credential.Username, rc.Status.Credential.Lease.LeaseID
	for i := range 3 {
		h.redis.SetClients(nodeAddr(i), redisnode.Conn{User: old, Addr: "192.0.2.66:40001"})
	}
	h.vault.RevokeOutside(lease)
	for range 3 {
		h.clock.Step(2 * time.Minute)
		rc = h.settle(t)
	}
	if rc.Status.Credential.Username == old {
		t.Fatal("no new credential after the lease was revoked outside keyroll")
	}
	if on := h.onEveryNode(old); slices.Contains(on, true) {
		t.Errorf("the revoked lease's user is still on the nodes %v: it waited for the client", on)
	}
	if len(rc.Status.OldUserClients) != 0 {
		t.Errorf("status.oldUserClients %+v: a gone lease's clients are not waited for", rc.Status.OldUserClients)
	}
}

// With Wait, a superseded user held by a client that is no listed consumer is kept, and its lease
// renewed, for rollout.unlistedClients.maxHold from when keyroll first saw the client; then it is
// retired, its lease revoked, and an event says whom it cut off.
func TestHeldUserRetiresAtMaxHold(t *testing.T) {
	h := newHarness(t, cluster(threeNodes, func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.UnlistedClients = v1beta1.UnlistedClientsSpec{MaxHold: &metav1.Duration{Duration: 5 * time.Minute}}
	}))
	rc, old := h.rotateHolding(t, "192.0.2.7:40001")
	oldLease := ""
	for _, l := range rc.Status.Leases {
		if l.Username == old {
			oldLease = l.LeaseID
		}
	}
	if cond := condition(rc, v1beta1.ConditionLeasesRevoked); cond == nil || !strings.Contains(cond.Message, "rollout.unlistedClients.maxHold") {
		t.Errorf("LeasesRevoked %+v does not say until when the user is held", cond)
	}
	h.clock.Step(4 * time.Minute)
	h.settle(t)
	if on := h.onEveryNode(old); slices.Contains(on, false) {
		t.Fatalf("the held user left a node before maxHold: %v", on)
	}
	h.eventReasons()
	h.clock.Step(61 * time.Second)
	h.settle(t)
	if on := h.onEveryNode(old); slices.Contains(on, true) {
		t.Fatalf("the held user is still on the nodes %v after maxHold", on)
	}
	if slices.Contains(h.vault.Leases(), oldLease) {
		t.Errorf("its lease %s is still live in Vault", oldLease)
	}
	if !slices.Contains(h.eventReasons(), v1beta1.EventUnlistedClientsCutOff) {
		t.Errorf("no %s event", v1beta1.EventUnlistedClientsCutOff)
	}
}

// Each superseded user is held on its own: a client holding the oldest one does not keep a later
// one, which nobody uses any more, on the nodes.
func TestEachSupersededUserRetiresOnItsOwn(t *testing.T) {
	h := newHarness(t, cluster(threeNodes))
	rc, first := h.rotateHolding(t, "192.0.2.7:40001")
	second := rc.Status.Credential.Username
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "again"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	rc = h.settle(t)
	if rc.Status.Credential.Username == second {
		t.Fatal("no second rotation")
	}
	if on := h.onEveryNode(first); slices.Contains(on, false) {
		t.Errorf("the held user left a node while its client was logged in: %v", on)
	}
	if on := h.onEveryNode(second); slices.Contains(on, true) {
		t.Errorf("the second superseded user, which no client uses, waits with the first: %v", on)
	}
	if len(rc.Status.OldUserClients) != 1 || rc.Status.OldUserClients[0].User != first {
		t.Errorf("status.oldUserClients %+v, want the first user's client only", rc.Status.OldUserClients)
	}
}
