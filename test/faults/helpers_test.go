package faults

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// sweep turns a VaultConnection's orphan-lease sweep on with action: it takes for orphans the
// leases older than 10 s that no ledger holds, every 10 s. Every connection of the matrix sweeps.
func sweep(action v1beta1.OrphanLeaseAction) framework.VaultConnectionOption {
	return func(vc *v1beta1.VaultConnection) {
		vc.Spec.OrphanLeases = &v1beta1.OrphanLeases{Action: action,
			GracePeriod: &metav1.Duration{Duration: 10 * time.Second}, Interval: &metav1.Duration{Duration: 10 * time.Second}}
	}
}

// waitSettled waits until the cluster is Ready with no rollout in progress and no superseded
// lease left, on a credential other than notVersion, and returns it.
func waitSettled(t *testing.T, rc *v1beta1.RedisCluster, notVersion string, timeout time.Duration) *v1beta1.RedisCluster {
	t.Helper()
	var cur *v1beta1.RedisCluster
	framework.Eventually(t, timeout, func() string {
		cur = fw.Get(t, rc)
		c := framework.Condition(cur, v1beta1.ConditionReady)
		switch {
		case c == nil || c.Status != metav1.ConditionTrue:
			return fmt.Sprintf("%s: Ready is %+v", rc.Name, c)
		case cur.Status.Credential == nil || cur.Status.Credential.Version == notVersion:
			return fmt.Sprintf("%s: still on credential %s", rc.Name, notVersion)
		case cur.Status.Rollout != nil:
			return fmt.Sprintf("%s: rollout in progress: %+v", rc.Name, cur.Status.Rollout)
		case len(cur.Status.Leases) != 1:
			return fmt.Sprintf("%s: ledger %+v, want the current lease only", rc.Name, cur.Status.Leases)
		}
		return ""
	})
	// The password in the consumers' Secret, and keyroll's own in its state and ACL Secrets, join
	// the leak scan now: the cluster and the Secrets it owns are deleted when the row ends.
	credentialsUser(rc)
	if _, err := rememberSecrets(rc.Namespace); err != nil {
		t.Fatal(err)
	}
	return cur
}

// ledger lists the lease IDs in a RedisCluster's ledger.
func ledger(rc *v1beta1.RedisCluster) []string {
	var ids []string
	for _, l := range rc.Status.Leases {
		ids = append(ids, l.LeaseID)
	}
	slices.Sort(ids)
	return ids
}

// credentialsUser is the username in the consumers' Secret ("" without one).
func credentialsUser(rc *v1beta1.RedisCluster) string {
	u, _ := credentialsSecret(rc)
	return u
}

// credentialsSecret is fw.Credentials that adds the password to the leak scan: the username and
// password in the consumers' Secret ("" without one).
func credentialsSecret(rc *v1beta1.RedisCluster) (string, string) {
	user, pass, ok := fw.Credentials(rc)
	if !ok {
		return "", ""
	}
	sawSecret(pass, "the password in "+rc.Namespace+"/"+rc.Name+"-credentials")
	return user, pass
}

// leaseWatch samples, as root, the leases under a credential path every 100 ms, so that a row can
// name the leases it saw (a lease revoked within 100 ms of its issue would be missed:
// framework.AuditIssues counts them all).
type leaseWatch struct {
	path string
	mu   sync.Mutex
	seen map[string]time.Time
	stop chan struct{}
	done chan struct{}
}

func watchLeases(t *testing.T, path string) *leaseWatch {
	w := &leaseWatch{path: path, seen: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	w.sample()
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
				w.sample()
			}
		}
	}()
	t.Cleanup(w.end)
	return w
}

func (w *leaseWatch) sample() {
	ids, err := fw.ListLeases(w.path)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		if _, ok := w.seen[id]; !ok {
			w.seen[id] = time.Now()
		}
	}
}

func (w *leaseWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// issued lists every lease seen under the path since the watch began, in the order seen.
func (w *leaseWatch) issued() []string {
	w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.seen))
	for id := range w.seen {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int { return w.seen[a].Compare(w.seen[b]) })
	return ids
}

// operatorLog is how many lines the operators logged so far contain all of parts.
func operatorLog(parts ...string) int {
	return framework.CountLines(logs.text(), parts...)
}
