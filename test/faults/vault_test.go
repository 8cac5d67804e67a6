package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// vaultProxy starts a proxy to the ground's Vault, which a row cuts or blackholes.
func vaultProxy(t *testing.T) *testground.Proxy {
	t.Helper()
	p, err := testground.StartProxy(strings.TrimPrefix(fw.Ground.Vault.Addr, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// lastRenewal is when the cluster's current lease was last renewed, and that lease.
func lastRenewal(t *testing.T, rc *v1beta1.RedisCluster) (string, time.Time) {
	t.Helper()
	c := fw.Get(t, rc).Status.Credential
	if c == nil {
		return "", time.Time{}
	}
	if c.Lease.LastRenewal == nil {
		return c.Lease.LeaseID, time.Time{}
	}
	return c.Lease.LeaseID, c.Lease.LastRenewal.Time
}

// TestVaultStoppedForTwoRenewals cuts Vault off for twice the renewal interval of a cluster's
// lease (2-minute leases renewed at 20 %, every 24 s or so): the operator's attempts during the
// outage follow its backoff (doubling from 0.5 s to at most 30 s per cluster), the lease is renewed
// within one backoff cap of Vault's return, and it never lapses.
func TestVaultStoppedForTwoRenewals(t *testing.T) {
	r := newRow(t, 8, "Vault stopped for 2× the renewal interval",
		"Vault request rate stays under the backoff bound during the outage; renewal within one backoff after return; no lease lapses that was renewable in time")
	base := "f-outage"
	ns := fw.Namespace(t, base)
	p := vaultProxy(t)
	vc := fw.VaultConnection(t, base, framework.Address(p.URL()), framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	startOperator(t, ns+"-1", "", ns)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path(base), func(rc *v1beta1.RedisCluster) { rc.Spec.Credentials.VaultLease.RenewalPercent = 20 })
	cur := waitSettled(t, rc, "", settleTimeout)
	lease := cur.Status.Credential.Lease.LeaseID
	duration := cur.Status.Credential.Lease.Duration.Duration
	interval := duration / 5
	// Start the outage right after a renewal, as the worst case for the lease's remaining life
	// is the end of an interval.
	_, before := lastRenewal(t, rc)
	framework.Eventually(t, 2*interval, func() string {
		if _, at := lastRenewal(t, rc); !at.After(before) {
			return "no renewal yet"
		}
		return ""
	})
	outage := 2 * interval
	p.Cut()
	cut, attempts0 := time.Now(), p.Accepted()
	time.Sleep(outage)
	attempts := p.Accepted() - attempts0
	p.Restore()
	restored := time.Now()
	var renewedAfter time.Duration
	framework.Eventually(t, 45*time.Second, func() string {
		id, at := lastRenewal(t, rc)
		if id != lease {
			return fmt.Sprintf("the lease changed from %s to %s: it was not kept", lease, id)
		}
		if !at.After(restored) {
			return "not renewed since Vault returned"
		}
		renewedAfter = at.Sub(restored)
		return ""
	})
	if ok, _ := fw.LeaseExists(lease); !ok {
		t.Errorf("lease %s lapsed during the outage", lease)
	}
	// The backoff bound: per cluster, the doublings from 0.5 s to the 30 s cap and then one attempt
	// per cap; the VaultConnection's check tries at most every 30 s; each attempt may open a
	// connection for a renewal and one for a lookup.
	doublings := 7 // 0.5, 1, 2, 4, 8, 16, 30 s
	bound := 2 * (doublings + int(outage/(30*time.Second)) + 1 + int(outage/(30*time.Second)) + 1)
	if attempts > bound {
		t.Errorf("%d connection attempts to Vault in a %s outage, over the backoff bound %d", attempts, outage.Round(time.Second), bound)
	}
	if renewedAfter > 35*time.Second {
		t.Errorf("renewed %s after Vault returned, more than one backoff cap (30 s)", renewedAfter)
	}
	checkLeases(t, rc, base)
	r.measured = fmt.Sprintf("outage %s (2× the %s renewal interval of a %s lease): %d connection attempts to Vault (%.2f/s; bound %d); renewed %s after Vault returned; the lease never lapsed (same lease ID, live in Vault)",
		outage.Round(time.Second), interval.Round(time.Second), duration, attempts, float64(attempts)/time.Since(cut).Seconds(), bound, renewedAfter.Round(100*time.Millisecond))
}

// TestVaultBlackholed makes one VaultConnection's Vault accept connections and never answer,
// while another VaultConnection's cluster rotates: a call to the blackholed Vault ends by its
// deadline (the VaultConnection's timeout, 10 s by default), the connection's calls after it fail
// at once but for one every vault.RetryUnanswered, and the healthy cluster's rotation is as fast
// as without the fault.
func TestVaultBlackholed(t *testing.T) {
	r := newRow(t, 9, "Vault blackholed", "a call ends by its deadline, the connection's next ones at once but for one every 2 s; other VaultConnections' clusters are not slowed (measured)")
	// Each namespace, its VaultConnection and its Vault role have the same base name.
	sick, healthy := "f-blackhole", "f-healthy"
	sickNS, healthyNS := fw.Namespace(t, sick), fw.Namespace(t, healthy)
	p := vaultProxy(t)
	sickVC := fw.VaultConnection(t, sick, framework.Address(p.URL()), framework.Allow(sickNS), sweep(v1beta1.OrphanLeasesRevoke))
	healthyVC := fw.VaultConnection(t, healthy, framework.Allow(healthyNS), sweep(v1beta1.OrphanLeasesRevoke))
	startOperator(t, "blackhole-1", "", sickNS)
	fw.StandInConsumer(t, healthyNS, "app", 1)
	a := fw.RedisCluster(t, sickNS, "orders", sickVC.Name, fw.Path(sick))
	b := fw.RedisCluster(t, healthyNS, "orders", healthyVC.Name, fw.Path(healthy), framework.WithConsumers("app"))
	waitSettled(t, a, "", settleTimeout)
	bv := waitSettled(t, b, "", settleTimeout).Status.Credential.Version
	rotate := func() time.Duration {
		start := time.Now()
		fw.RotateNow(t, b)
		bv = waitSettled(t, b, bv, settleTimeout).Status.Credential.Version
		return time.Since(start)
	}
	baseline := rotate()

	p.Blackhole()
	start := time.Now()
	fw.RotateNow(t, a) // its issue hangs in the blackhole until the deadline
	time.Sleep(time.Second)
	during := rotate()
	cur := fw.WaitCondition(t, a, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonVaultUnavailable, 30*time.Second)
	ended := time.Since(start)
	if ended > 25*time.Second {
		t.Errorf("the blackholed issue was reported %s after it began, past its 10 s deadline and a retry", ended)
	}
	if during > 2*baseline+5*time.Second {
		t.Errorf("the healthy cluster's rotation took %s with the other Vault blackholed, %s without", during, baseline)
	}
	p.Restore()
	waitSettled(t, a, cur.Status.Credential.Version, settleTimeout)
	checkLeases(t, a, sick)
	checkLeases(t, b, healthy)
	r.measured = fmt.Sprintf("the blackholed cluster's rotation failed as VaultUnavailable %s after it began (deadline 10 s), and rotated once Vault answered again; the other connection's cluster rotated in %s during the fault, %s without it",
		ended.Round(100*time.Millisecond), during.Round(100*time.Millisecond), baseline.Round(100*time.Millisecond))
}

// TestVaultSealedDuringIssue creates a cluster while Vault is sealed: the cluster says so, and
// gets its one lease once Vault is unsealed.
func TestVaultSealedDuringIssue(t *testing.T) {
	r := newRow(t, 10, "Vault sealed during issue", "condition says sealed; issue succeeds after unseal; one lease")
	base := "f-sealed"
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	startOperator(t, ns+"-1", "", ns)
	fw.WaitConnectionReady(t, vc.Name, time.Minute)
	ctx := context.Background()
	if err := fw.Ground.Vault.Seal(ctx); err != nil {
		t.Fatal(err)
	}
	sealed := true
	t.Cleanup(func() {
		if sealed {
			_ = fw.Ground.Vault.Unseal(ctx)
		}
	})
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path(base))
	cur := fw.WaitCondition(t, rc, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonVaultSealed, time.Minute)
	msg := framework.Condition(cur, v1beta1.ConditionCredentialsReady).Message
	if err := fw.Ground.Vault.Unseal(ctx); err != nil {
		t.Fatal(err)
	}
	sealed = false
	unsealed := time.Now()
	waitSettled(t, rc, "", settleTimeout)
	after := time.Since(unsealed)
	checkLeases(t, rc, base)
	if issued := framework.AuditIssues(t, auditLog, fw.Path(base)); issued != 1 {
		t.Errorf("%d leases issued, want one", issued)
	}
	r.measured = fmt.Sprintf("CredentialsReady=False/VaultSealed (%q); Ready %s after the unseal, with 1 lease issued", msg, after.Round(100*time.Millisecond))
}
