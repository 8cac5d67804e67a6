package faults

import (
	"context"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// managerMemoryLimit is the memory limit of the deployed manager (deploy/manager/manager.yaml).
const managerMemoryLimit = 256 << 20

// TestHugeClientNamesDoNotHurtTheManager: anyone holding a cluster's application credential
// names six connections with 48 MiB each (CLIENT SETNAME; Redis keeps the names whole), then the
// credential is rotated, so that the manager, its own process here, reads the node's clients to
// retire the superseded user. Its peak resident set stays within the deployed manager's memory
// limit, the node's clients are reported unknown rather than read (the reply is over keyroll's
// bound, or, as Redis takes about 5 s to build its 288 MiB, not there within the exchange's
// deadline), and another cluster's 30-second leases go on being renewed on time throughout.
func TestHugeClientNamesDoNotHurtTheManager(t *testing.T) {
	ctx := context.Background()
	base := "f-hugenames"
	ns := fw.Namespace(t, base)
	vc := fw.VaultConnection(t, base, framework.Allow(ns))
	op := startOperator(t, ns+"-1", "", ns)
	big := fw.RedisCluster(t, ns, "big", vc.Name, fw.Path(base))
	other := fw.RedisCluster(t, ns, "other", vc.Name, fw.Path(base+"-other"))
	big = waitSettled(t, big, "", settleTimeout)
	waitSettled(t, other, "", settleTimeout)
	before, err := op.Usage()
	if err != nil {
		t.Fatal(err)
	}

	user, pw, ok := fw.Credentials(big)
	if !ok {
		t.Fatal("no application credential for the big cluster")
	}
	name := strings.Repeat("n", 48<<20)
	addr := framework.PodAddr(&fw.RedisPods(t, big)[0])
	for i := range 6 {
		c := framework.RedisClient(addr, user, pw) // a pool of its own: each name stays on its connection
		defer func() { _ = c.Close() }()
		conn := c.Conn()
		defer func() { _ = conn.Close() }()
		if err := conn.ClientSetName(ctx, name[:len(name)-i]).Err(); err != nil {
			t.Fatalf("naming connection %d: %v", i, err)
		}
	}
	name = ""

	// The other cluster's lease, watched from now on: it must never lapse, and be renewed.
	stop := make(chan struct{})
	lapses, renewals := make(chan string, 1), make(chan int, 1)
	go func() {
		last, n, lapsed := time.Time{}, 0, ""
		defer func() { lapses <- lapsed; renewals <- n }()
		for {
			cur := &v1beta1.RedisCluster{}
			if err := fw.Client.Get(ctx, client.ObjectKeyFromObject(other), cur); err != nil {
				lapsed = "reading the other cluster: " + err.Error()
				return
			}
			if c := cur.Status.Credential; c != nil && c.Lease.ExpiresAt != nil {
				exp := c.Lease.ExpiresAt.Time
				if !last.IsZero() && exp.After(last) {
					n++
				}
				if time.Now().After(exp) && lapsed == "" {
					lapsed = "the other cluster's lease expired at " + exp.Format(time.RFC3339) + " without a renewal"
				}
				last = exp
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()

	fw.RotateNow(t, big)
	unknown := ""
	framework.Eventually(t, settleTimeout, func() string {
		for _, cl := range fw.Get(t, big).Status.OldUserClients {
			if strings.HasPrefix(cl.Workload, "unknown: ") {
				unknown = cl.Workload
				return ""
			}
		}
		return "the big cluster reports no node whose clients could not be read"
	})
	// A minute more of reconciles of the held user, each reading the node's clients again.
	time.Sleep(time.Minute)
	close(stop)
	lapsed, renewed := <-lapses, <-renewals

	select {
	case <-op.Done():
		t.Fatalf("the manager exited:\n%s", logs.tail(op.name, 40))
	default:
	}
	after, err := op.Usage()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the manager's peak RSS: %.1f MiB before the names, %.1f MiB after (limit %d MiB); %s; the other cluster's lease renewed %d times meanwhile",
		float64(before.PeakRSSBytes)/(1<<20), float64(after.PeakRSSBytes)/(1<<20), managerMemoryLimit>>20, unknown, renewed)
	if after.PeakRSSBytes > managerMemoryLimit {
		t.Errorf("the manager's peak RSS %.1f MiB is over the deployed limit of %d MiB", float64(after.PeakRSSBytes)/(1<<20), managerMemoryLimit>>20)
	}
	if lapsed != "" {
		t.Error(lapsed)
	}
	if renewed < 2 {
		t.Errorf("the other cluster's 30-second lease was renewed %d times in the %s after the names, want 2 at least", renewed, time.Minute)
	}
}
