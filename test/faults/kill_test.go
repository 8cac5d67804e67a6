package faults

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/stoppoint"
	"github.com/keyroll/keyroll/test/framework"
)

// settleTimeout bounds how long a cluster takes to become Ready or finish a rollout here.
const settleTimeout = 2 * time.Minute

// checkLeases fails unless Vault holds, under the credential path of role (a base name), exactly
// the leases of rc's ledger, and the ledger holds the current credential's lease only; and unless
// the consumers' Secret holds that credential's user.
func checkLeases(t *testing.T, rc *v1beta1.RedisCluster, role string) {
	t.Helper()
	cur := fw.Get(t, rc)
	live, held := fw.VaultLeases(t, fw.Path(role)), ledger(cur)
	if !slices.Equal(live, held) {
		t.Errorf("Vault holds %v under %s, the ledger %v", live, fw.Path(role), held)
	}
	if c := cur.Status.Credential; c == nil || !slices.Equal(held, []string{c.Lease.LeaseID}) {
		t.Errorf("the ledger %v is not the current credential's lease alone (%+v)", held, c)
	} else if u, pass := credentialsSecret(rc); u != c.Username {
		t.Errorf("the consumers' Secret holds user %q, the current credential is %q", u, c.Username)
	} else {
		sawSecret(pass, "the password of "+rc.Namespace+"/"+rc.Name+"'s credential "+c.Version)
	}
}

// TestKillAfterIssue kills the operator after Vault issued the first lease and before it reached
// the ledger: the restarted operator issues another, and the sweep (orphanLeases Revoke) finds the
// first one, which no ledger knows, and revokes it once it is older than the grace period.
func TestKillAfterIssue(t *testing.T) {
	r := newRow(t, 1, "SIGKILL after issue, before the ledger write",
		"the lease is found by the sweeper (Revoke mode: revoked); without the sweeper it expires at its TTL; one credential in use")
	base := "f-issue"
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	w := watchLeases(t, fw.Path(base))
	op := startOperator(t, ns+"-1", stoppoint.AfterIssue, ns)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path(base))
	op.waitStop(t, stoppoint.AfterIssue, settleTimeout)
	killed := time.Now()
	orphans := w.issued()
	if len(orphans) != 1 {
		t.Fatalf("Vault issued %v before the stop point, want one lease", orphans)
	}
	if cur := fw.Get(t, rc); len(cur.Status.Leases) != 0 {
		t.Fatalf("the ledger holds %v before its write", ledger(cur))
	}
	_, expires := fw.LeaseExists(orphans[0])
	ttl := time.Until(expires).Round(time.Second)

	second := startOperator(t, ns+"-2", "", ns)
	waitSettled(t, rc, "", settleTimeout)
	framework.Eventually(t, time.Minute, func() string {
		if live := fw.VaultLeases(t, fw.Path(base)); slices.Contains(live, orphans[0]) {
			return fmt.Sprintf("the orphan %s is still live (%v)", orphans[0], live)
		}
		return ""
	})
	swept := time.Since(killed).Round(time.Second)
	checkLeases(t, rc, base)
	issued := framework.AuditIssues(t, auditLog, fw.Path(base))
	if issued != 2 {
		t.Errorf("%d leases issued, want the orphan and one more", issued)
	}
	if st := fw.GetConnection(t, vc.Name).Status.OrphanLeases; st == nil || st.Revoked < 1 {
		t.Errorf("the VaultConnection's sweep status %+v counts no revocation", st)
	}
	notes := strings.Join(framework.Notes(fw.Events(t, "", "", vc.Name)), "\n")
	if n := framework.CountLines(notes, v1beta1.EventOrphanLeaseRevoked, orphans[0]); n != 1 {
		t.Errorf("%d %s events name the orphan, want 1", n, v1beta1.EventOrphanLeaseRevoked)
	}
	second.Kill() // the next operator must lead
	report := killAfterIssueReported(t)
	r.measured = fmt.Sprintf("Revoke: %d leases issued; the orphan revoked by the sweeper %s after the kill (grace 10 s, interval 10 s; it had %s of TTL left); at the end Vault holds 1 lease, the ledger's, and the Secret holds its user. %s",
		issued, swept, ttl, report)
}

// killAfterIssueReported is TestKillAfterIssue with orphanLeases Report and a 30-second role: the
// orphan is reported (status, event), left alone, and gone at its TTL, Vault's bound on it.
func killAfterIssueReported(t *testing.T) string {
	t.Helper()
	base := "f-issue-report"
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesReport))
	w := watchLeases(t, fw.Path(base))
	op := startOperator(t, ns+"-1", stoppoint.AfterIssue, ns)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path(base))
	op.waitStop(t, stoppoint.AfterIssue, settleTimeout)
	killed := time.Now()
	orphans := w.issued()
	if len(orphans) != 1 {
		t.Fatalf("Report: Vault issued %v before the stop point, want one lease", orphans)
	}
	startOperator(t, ns+"-2", "", ns)
	waitSettled(t, rc, "", settleTimeout)
	framework.Eventually(t, time.Minute, func() string {
		if st := fw.GetConnection(t, vc.Name).Status.OrphanLeases; st == nil || !slices.Contains(st.Orphans, orphans[0]) {
			return fmt.Sprintf("the sweep has not reported the orphan %s: %+v", orphans[0], st)
		}
		return ""
	})
	reported := time.Since(killed)
	notes := strings.Join(framework.Notes(fw.Events(t, "", "", vc.Name)), "\n")
	if n := framework.CountLines(notes, v1beta1.EventOrphanLeasesFound, orphans[0]); n < 1 {
		t.Errorf("no %s event names the orphan", v1beta1.EventOrphanLeasesFound)
	}
	framework.Eventually(t, time.Minute, func() string {
		if slices.Contains(fw.VaultLeases(t, fw.Path(base)), orphans[0]) {
			return "the reported orphan is still live"
		}
		return ""
	})
	expired := time.Since(killed)
	if st := fw.GetConnection(t, vc.Name).Status.OrphanLeases; st.Revoked != 0 {
		t.Errorf("Report mode revoked %d leases", st.Revoked)
	}
	checkLeases(t, rc, base)
	return fmt.Sprintf("Report (30 s role): the orphan reported (status.orphanLeases, OrphanLeasesFound) %s after the kill, not revoked, and gone at its TTL, %s after the kill.",
		reported.Round(time.Second), expired.Round(time.Second))
}

// TestKillAfterLedgerWrite kills the operator once the first lease is in the ledger, before any
// node or consumer has its credential (Vault handed the password over once, to the killed
// process): the restarted operator issues a new one, rolls it out, and revokes the first as
// superseded.
func TestKillAfterLedgerWrite(t *testing.T) {
	r := newRow(t, 2, "SIGKILL after the ledger write, before the Secret",
		"one lease revoked as superseded after the next rollout, no extra lease live at the end")
	base := "f-ledger"
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	fw.StandInConsumer(t, ns, "app", 1)

	op := startOperator(t, ns+"-1", stoppoint.AfterLedgerWrite, ns)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path(base), framework.WithConsumers("app"))
	op.waitStop(t, stoppoint.AfterLedgerWrite, settleTimeout)
	first := ledger(fw.Get(t, rc))
	if len(first) != 1 || credentialsUser(rc) != "" {
		t.Fatalf("at the stop point: ledger %v, consumers' Secret user %q; want one lease and no Secret", first, credentialsUser(rc))
	}
	startOperator(t, ns+"-2", "", ns)
	waitSettled(t, rc, "", settleTimeout)
	checkLeases(t, rc, base)
	issued := framework.AuditIssues(t, auditLog, fw.Path(base))
	if issued != 2 {
		t.Errorf("%d leases issued, want 2 (the killed process's, whose password is lost, and its replacement)", issued)
	}
	revoked := operatorLog("Lease revoked", first[0])
	if revoked != 1 {
		t.Errorf("the first lease was revoked %d times, want 1", revoked)
	}
	r.measured = fmt.Sprintf("%d leases issued; the first revoked %d time(s) as superseded; Vault holds 1 lease at the end, the ledger's", issued, revoked)
}

// killDuringRotation brings a cluster with a consumer to Ready under an operator that stops at
// point (for the namespace of base, whose VaultConnection and Vault role have the same base name),
// rotates it, kills the operator there, and lets a new one finish. It checks that exactly one new
// lease was issued, that the old one was revoked once and that only the new one is live, and
// returns what it measured.
func killDuringRotation(t *testing.T, base string, point stoppoint.Point) string {
	t.Helper()
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	fw.StandInConsumer(t, ns, "app", 1)

	op := startOperator(t, ns+"-1", point, ns)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path(base), framework.WithConsumers("app"))
	first := waitSettled(t, rc, "", settleTimeout).Status.Credential
	op.notStopped(t, "before the rotation")
	start := time.Now()
	fw.RotateNow(t, rc)
	op.waitStop(t, point, settleTimeout)
	startOperator(t, ns+"-2", "", ns)
	final := waitSettled(t, rc, first.Version, settleTimeout)
	took := time.Since(start).Round(100 * time.Millisecond)
	checkLeases(t, rc, base)
	issued := framework.AuditIssues(t, auditLog, fw.Path(base))
	if issued != 2 {
		t.Errorf("%d leases issued, want the first and exactly one new", issued)
	}
	revoked := operatorLog("Lease revoked", first.Lease.LeaseID)
	if revoked != 1 {
		t.Errorf("the superseded lease %s was revoked %d times (log), want 1", first.Lease.LeaseID, revoked)
	}
	notes := strings.Join(framework.Notes(fw.Events(t, ns, "", rc.Name)), "\n")
	if n := framework.CountLines(notes, v1beta1.EventLeaseRevoked, first.Lease.LeaseID); n != 1 {
		t.Errorf("%d %s events name the superseded lease, want 1", n, v1beta1.EventLeaseRevoked)
	}
	if final.Status.Credential.Lease.LeaseID == first.Lease.LeaseID {
		t.Errorf("the rotation kept lease %s", first.Lease.LeaseID)
	}
	return fmt.Sprintf("%d leases issued (1 new); the superseded one revoked once (1 event); Vault holds the new one only; rotation done %s after it was asked for, the kill and restart included",
		issued, took)
}

// TestKillAfterSecretWrite kills the operator once the consumers' Secret holds the new
// credential, before any consumer restarted.
func TestKillAfterSecretWrite(t *testing.T) {
	r := newRow(t, 3, "SIGKILL after the Secret write, before the consumers restart",
		"the rollout resumes, exactly one new lease, the old revoked once")
	r.measured = killDuringRotation(t, "f-secret", stoppoint.AfterSecretWrite)
}

// TestKillMidRollout kills the operator right after it restarted the consumer.
func TestKillMidRollout(t *testing.T) {
	r := newRow(t, 4, "SIGKILL mid-rollout (after a consumer restart)", "the rollout resumes, exactly one new lease, the old revoked once")
	r.measured = killDuringRotation(t, "f-rollout", stoppoint.MidRollout)
}

// TestKillBeforeRevoke kills the operator as it is about to revoke the superseded lease.
func TestKillBeforeRevoke(t *testing.T) {
	r := newRow(t, 5, "SIGKILL before revoke", "the superseded lease revoked exactly once")
	r.measured = killDuringRotation(t, "f-revoke", stoppoint.BeforeRevoke)
}

// TestKillAfterRevoke kills the operator once Vault revoked the superseded lease, before the
// ledger dropped it: the restarted operator revokes it again (Vault knows it no more, which is no
// error) and drops it.
func TestKillAfterRevoke(t *testing.T) {
	r := newRow(t, 6, "SIGKILL after revoke (before the ledger drops it)", "the superseded lease revoked exactly once")
	r.measured = killDuringRotation(t, "f-revoked", stoppoint.AfterRevoke)
}

// TestLeaderKilledMidRollout runs two operators; the leader is killed with SIGKILL, holding its
// leader-election Lease, right after it restarted the consumer. The follower takes over once the
// Lease expires (4 s here) and finishes the rotation: one new lease, not two.
func TestLeaderKilledMidRollout(t *testing.T) {
	r := newRow(t, 7, "leader SIGKILLed holding the Lease, mid-rollout", "the follower takes over after the lease duration and finishes; one rotation, not two")
	base := "f-leader"
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns), sweep(v1beta1.OrphanLeasesRevoke))
	fw.StandInConsumer(t, ns, "app", 1)

	leader := startOperator(t, ns+"-a", stoppoint.MidRollout, ns)
	framework.Eventually(t, time.Minute, func() string {
		if !leader.Leading() {
			return "the first operator has not acquired the leader-election Lease"
		}
		return ""
	})
	follower := startOperator(t, ns+"-b", "", ns)
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path(base), framework.WithConsumers("app"))
	first := waitSettled(t, rc, "", settleTimeout).Status.Credential
	if follower.Leading() {
		t.Fatal("the follower leads while the leader lives")
	}
	fw.RotateNow(t, rc)
	leader.waitStop(t, stoppoint.MidRollout, settleTimeout)
	killed := time.Now()
	framework.Eventually(t, time.Minute, func() string {
		if !follower.Leading() {
			return "the follower has not taken over"
		}
		return ""
	})
	takeover := time.Since(killed).Round(100 * time.Millisecond)
	waitSettled(t, rc, first.Version, settleTimeout)
	done := time.Since(killed).Round(100 * time.Millisecond)
	checkLeases(t, rc, base)
	issued := framework.AuditIssues(t, auditLog, fw.Path(base))
	if issued != 2 {
		t.Errorf("%d leases issued, want the first and one rotation's", issued)
	}
	if n := operatorLog("Lease revoked", first.Lease.LeaseID); n != 1 {
		t.Errorf("the superseded lease was revoked %d times, want 1", n)
	}
	r.measured = fmt.Sprintf("the follower led %s after the kill (lease duration 4 s) and finished the rotation %s after it; %d leases issued in all (1 rotation); the superseded one revoked once",
		takeover, done, issued)
}
