package dataplane

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// TestHeldSupersededLeaseEndsAtItsBound: with the default action (Wait) and
// rollout.unlistedClients.maxHold 1m, a superseded user held by an unlisted Deployment and a
// client of the host, which never let go, is kept on every node for the minute, then retired: it is
// refused on every node, its lease is revoked in Vault, and UnlistedClientsCutOff names whom.
func TestHeldSupersededLeaseEndsAtItsBound(t *testing.T) {
	sc := startUnlisted(t, "maxhold", func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.UnlistedClients = v1beta1.UnlistedClientsSpec{MaxHold: &metav1.Duration{Duration: time.Minute}}
	})
	clients, _ := sc.waitHeld(t)
	oldLease := ""
	for _, l := range fw.Get(t, sc.rc).Status.Leases {
		if l.Username == sc.oldUser {
			oldLease = l.LeaseID
		}
	}
	if oldLease == "" {
		t.Fatal("the held user's lease is not in the ledger")
	}
	if msg := fw.OnEveryPod(sc.rc, sc.oldUser, sc.oldPw, true); msg != "" {
		t.Errorf("the old user while held: %s", msg)
	}
	held := sc.waitRetired(t, clients, time.Now(), 3*time.Minute)
	if held < time.Minute {
		t.Errorf("the old user was retired %s after its clients were first seen, before maxHold (1m)", held.Round(time.Second))
	}
	framework.Eventually(t, time.Minute, func() string {
		if live, _ := fw.LeaseExists(oldLease); live {
			return "the held user's lease still live in Vault"
		}
		return ""
	})
	events := fw.WaitClusterEvents(t, sc.ns, sc.rc.Name, 20*time.Second, v1beta1.EventUnlistedClientsCutOff)
	for _, e := range events {
		if e.Reason == v1beta1.EventUnlistedClientsCutOff && !strings.Contains(e.Note, "Deployment/report") {
			t.Errorf("the cut-off event does not name the unlisted workload: %s", e.Note)
		}
	}
	t.Logf("held %s from when its clients were first seen (maxHold 1m), then retired and its lease revoked", held.Round(100*time.Millisecond))
}

// TestRevokedLeaseNeverWaitsForClients: with onRevokedOutside RollOver, a credential whose lease is
// revoked in Vault (a leak: `vault lease revoke`) stays on the nodes only until its replacement has
// rolled out to the listed consumer; then it leaves every node although an unlisted Deployment
// and a client of the host (the attacker's, say) are still logged in with it, which the default
// action (Wait) would otherwise wait for.
func TestRevokedLeaseNeverWaitsForClients(t *testing.T) {
	ns := fw.Namespace(t, "revokedheld")
	vc := fw.VaultConnection(t, "vault-revokedheld", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("app"),
		func(rc *v1beta1.RedisCluster) { rc.Spec.Credentials.OnRevokedOutside = v1beta1.RevokedOutsideRollOver })
	rc = fw.WaitReady(t, rc, 3*time.Minute)
	oldUser, oldPw, _ := fw.Credentials(rc)
	app := fw.StartConsumers(t, ns, "app", 1, "cache:6379", "cache-credentials")
	fw.StartConsumers(t, ns, "report", 1, "cache:6379", "cache-credentials", readsCredentialOnce)
	host := framework.RedisClient(framework.PodAddr(&fw.RedisPods(t, rc)[0]), oldUser, oldPw)
	defer func() { _ = host.Close() }()
	if err := host.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	lease := rc.Status.Credential.Lease.LeaseID
	if err := fw.Ground.Vault.Root.Sys().Revoke(lease); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	framework.Eventually(t, 3*time.Minute, func() string {
		cur := fw.Get(t, rc)
		if cur.Status.Credential == nil || cur.Status.Credential.Username == oldUser || cur.Status.Rollout != nil {
			return fmt.Sprintf("credential %+v, rollout %+v", cur.Status.Credential, cur.Status.Rollout)
		}
		if len(cur.Status.OldUserClients) > 0 {
			return fmt.Sprintf("status.oldUserClients %+v: the revoked user waits for clients", cur.Status.OldUserClients)
		}
		return fw.OnEveryPod(rc, oldUser, oldPw, false)
	})
	if err := host.Ping(context.Background()).Err(); err == nil {
		t.Error("the host's connection as the revoked user still answers")
	}
	if _, failed, failures := app.Totals(); failed > 0 {
		t.Errorf("the listed consumer had %d failed commands: %v", failed, failures)
	}
	t.Logf("the revoked user left every node %s after the revocation, its clients notwithstanding", time.Since(revoked).Round(100*time.Millisecond))
}
