// The users sync brings every Redis node of a RedisCluster to the cluster's users, live: one node
// after the other, each changed with targeted ACL commands (redisnode) as keyroll's admin user and
// confirmed before the next: the current credential's user logs in, and the users deleted are no
// longer among the node's users. What each node was last confirmed on is kept in status.nodes, so
// that a steady cluster costs one ACL LIST per node and check interval (compared with the digest
// recorded there: keyroll owns the user set, and puts back what was changed outside it) and a
// restarted Redis is confirmed again. Only the StatefulSet's own pods are nodes (nodes_members.go).

package rediscluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/redisnode"
)

// notRunningWait is how often a cluster with a Redis node that is not running yet looks again (a
// pod event usually wakes it earlier).
const notRunningWait = 5 * time.Second

// usersSyncer changes the users of Redis nodes.
type usersSyncer struct {
	// Client reads the Redis pods and the StatefulSet (from the cache).
	Client client.Reader
	// APIReader reads past the cache: a node is set only from the latest version of the cluster
	// (nil: the cache is trusted).
	APIReader client.Reader
	Dial      redisnode.Dialer
	// TLS says how the nodes of a TLS cluster are checked.
	TLS   *nodeTLS
	Clock clock.Clock
	// CheckInterval is how often every node's ACL is compared with what keyroll confirmed there
	// (zero or negative: never).
	CheckInterval time.Duration
	// Removed counts the users removed from a node that were not the cluster's (nil: none).
	Removed prometheus.Counter
	// LeaseCheckNow, when set, has the cluster's lease looked up before its next sync: an
	// application user went from a node, as when Vault's plugin deletes it at a revocation, which
	// putting the user back would undo until the next lease check.
	LeaseCheckNow func(types.NamespacedName)
	checks        checks
}

// DefaultUsersCheckInterval is how often every node's ACL is compared with what was confirmed there.
const DefaultUsersCheckInterval = time.Minute

// newUsersSyncer returns a usersSyncer that compares every node's ACL every checkInterval (zero:
// DefaultUsersCheckInterval; negative: never), counts the unknown users it removes in removed and asks
// leaseCheckNow for a lease lookup when an application user is gone from a node.
func newUsersSyncer(c, apiReader client.Reader, dial redisnode.Dialer, clk clock.Clock, checkInterval time.Duration, removed prometheus.Counter, leaseCheckNow func(types.NamespacedName)) *usersSyncer {
	if checkInterval == 0 {
		checkInterval = DefaultUsersCheckInterval
	}
	return &usersSyncer{Client: c, APIReader: apiReader, Dial: dial, Clock: clk, CheckInterval: checkInterval, Removed: removed, LeaseCheckNow: leaseCheckNow}
}

// usersWant is what every node of a cluster must have.
type usersWant struct {
	Users render.Users
	// Confirm is the credential every node must accept (nil: none to confirm).
	Confirm *render.Credential
	// AdminPassword is the password of render.AdminUser.
	AdminPassword string
	// tls checks the nodes' certificates (a TLS cluster's); Sync sets it.
	tls *tls.Config
}

// Sync brings the cluster's nodes to want, one after the other, and records each in
// status.nodes. done says every one of spec.replicas pods is confirmed on want; then the
// retiring users are gone from every node and leave status.retiringUsers, and wait is when the
// nodes' ACLs are next compared with what was confirmed. A node whose ACL changed outside
// keyroll is reported (UsersApplied False, UsersChanged) and put back by the next reconcile, at
// once. The UsersApplied condition says how far it got, and why it stopped.
func (s *usersSyncer) Sync(ctx context.Context, rc *v1beta1.RedisCluster, conds status.Setter, want usersWant) (done bool, wait time.Duration, err error) {
	want.tls = s.TLS.For(rc)
	m, err := listMembers(ctx, s.Client, rc)
	if err != nil {
		return false, 0, err
	}
	version := want.Users.Version()
	records := map[string]v1beta1.NodeStatus{}
	for _, n := range rc.Status.Nodes {
		records[n.Pod] = n
	}
	check := s.checks.due(client.ObjectKeyFromObject(rc), s.Clock.Now(), s.CheckInterval)
	confirmed := 0
	var stopped *problem
	var changed []string
	var founds []found
	latest := false // rc was found to be the API server's latest version
	defer func() { s.report(conds, founds) }()
	for _, p := range m.Pods {
		run, ok := running(p)
		if !ok {
			stopped = s.notRunning(rc, p)
			break
		}
		rec, seen := records[p.Name]
		fresh := !seen || rec.PodUID != p.UID || !status.Of(rec.StartedAt).Equal(run.startedAt)
		steady := !fresh && rec.UsersVersion == version && rec.ACLDigest != ""
		if steady && check {
			what, appGone, err := s.compare(ctx, run.addr, want, rec.ACLDigest)
			if err != nil {
				stopped = s.failed(rc, p, run.addr, err)
				break
			}
			if appGone && s.LeaseCheckNow != nil {
				s.LeaseCheckNow(client.ObjectKeyFromObject(rc))
			}
			if what != "" {
				rec.ACLDigest = "" // the next sync puts it back
				records[p.Name] = rec
				changed = append(changed, fmt.Sprintf("pod %s (%s)", p.Name, what))
				continue
			}
		}
		if !steady {
			if !latest {
				// A reconcile that follows the one that confirmed the nodes can find the cache
				// without that status and take every node for unconfirmed: setting them again
				// would put back a user deleted meanwhile (Vault's plugin deletes the current
				// user on the primary at a revocation) until the next lease check.
				if stale, err := apply.Stale(ctx, s.APIReader, rc); stale || err != nil {
					return false, lagWait, err
				}
				latest = true
			}
			repair := !fresh && rec.UsersVersion == version
			digest, f, err := s.syncNode(ctx, node{pod: p.Name, addr: run.addr, fresh: fresh, repair: repair}, want)
			founds = append(founds, f)
			if err != nil {
				stopped = s.failed(rc, p, run.addr, err)
				break
			}
			log.FromContext(ctx).V(1).Info("Redis node confirmed", "pod", p.Name, "usersVersion", version)
			rec = v1beta1.NodeStatus{Pod: p.Name, PodUID: p.UID, StartedAt: status.At(run.startedAt),
				UsersVersion: version, ACLDigest: digest, ConfirmedAt: status.At(s.Clock.Now())}
		}
		records[p.Name] = rec
		confirmed++
	}
	rc.Status.Nodes = recordsOf(m.Pods, records)
	if stopped == nil && len(changed) > 0 {
		stopped = &problem{reason: v1beta1.ReasonUsersChanged, event: v1beta1.ReasonUsersChanged, wait: time.Millisecond,
			msg: "the ACL of " + strings.Join(changed, ", ") + " changed outside keyroll; keyroll puts the cluster's users back"}
	}
	if stopped == nil && len(m.Pods) < int(rc.Spec.Replicas) {
		stopped = &problem{reason: v1beta1.ReasonApplying, wait: notRunningWait,
			msg: fmt.Sprintf("%d of %d Redis pods exist", len(m.Pods), rc.Spec.Replicas)}
	}
	if stopped != nil {
		return false, stopped.report(conds, confirmed, int(rc.Spec.Replicas)), nil
	}
	if check {
		s.checks.done(client.ObjectKeyFromObject(rc), s.Clock.Now())
	}
	s.applied(rc, conds, want)
	return true, s.checks.next(client.ObjectKeyFromObject(rc), s.Clock.Now(), s.CheckInterval), nil
}

// Forget drops what the syncer keeps of a deleted cluster.
func (s *usersSyncer) Forget(key types.NamespacedName) { s.checks.forget(key) }

// applied records that every node has want: the retiring users are gone everywhere, and the
// nodes have the set without them.
func (s *usersSyncer) applied(rc *v1beta1.RedisCluster, conds status.Setter, want usersWant) {
	msg := fmt.Sprintf("All %d Redis nodes have the cluster's users", len(rc.Status.Nodes))
	if c := want.Confirm; c != nil {
		msg += fmt.Sprintf("; each accepts credential %s (user %s)", c.Version, c.Username)
	}
	old := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionUsersApplied)
	news := old == nil || old.Message != msg // another credential, or another count of nodes
	if conds.Set(v1beta1.ConditionUsersApplied, metav1.ConditionTrue, v1beta1.ReasonApplied, msg) || news {
		conds.Announce(false, v1beta1.EventUsersApplied, "ApplyUsers", "%s", msg)
	}
	if len(want.Users.Retiring) > 0 {
		conds.Announce(false, v1beta1.EventUsersRetired, "ApplyUsers", "Users %s removed from all %d Redis nodes",
			strings.Join(want.Users.Retiring, ", "), len(rc.Status.Nodes))
		rc.Status.RetiringUsers = nil
		without := want.Users.WithoutRetiring().Version()
		for i := range rc.Status.Nodes {
			rc.Status.Nodes[i].UsersVersion = without
		}
	}
}

// problem is why a sync stopped, and when to look again.
type problem struct {
	reason, msg string
	// event is the reason of the Warning event that reports the problem; none when empty (a wait
	// that passes by itself).
	event string
	wait  time.Duration
}

func (p *problem) report(conds status.Setter, confirmed, replicas int) time.Duration {
	msg := fmt.Sprintf("%d of %d Redis nodes confirmed; %s", confirmed, replicas, p.msg)
	if p.reason == v1beta1.ReasonInvalidACLRules {
		msg = p.msg + "; nothing was applied (the pods run on, with the users they had)"
	}
	if conds.Set(v1beta1.ConditionUsersApplied, metav1.ConditionFalse, p.reason, msg) && p.event != "" {
		conds.Announce(true, p.event, "ApplyUsers", "%s", msg)
	}
	return p.wait
}

// notRunning is a pod whose Redis does not run (yet): a wait, unless it has not run for longer
// than the readiness timeout.
func (s *usersSyncer) notRunning(rc *v1beta1.RedisCluster, p *corev1.Pod) *problem {
	since := stoppedSince(p)
	timeout := readinessTimeout(rc)
	if s.Clock.Since(since) > timeout {
		return &problem{reason: v1beta1.ReasonNodeNotReady, event: v1beta1.ReasonNodeNotReady, wait: time.Minute,
			msg: fmt.Sprintf("pod %s has not run Redis for %s (rollout.readinessTimeout %s); no credential change goes on until it does", p.Name, s.Clock.Since(since).Round(time.Second), timeout)}
	}
	return &problem{reason: v1beta1.ReasonApplying, wait: notRunningWait, msg: "waiting for pod " + p.Name + " to run Redis"}
}

// stoppedSince is when a pod that keyroll cannot use stopped being usable: when it last became
// not Ready; for a pod still reported Ready, when its deletion began (its kubelet reports the
// end of its containers only later, so that a pod that ran for days is not taken for one that
// has not run Redis since it was created); else when it was created.
func stoppedSince(p *corev1.Pod) time.Time {
	since, ready := p.CreationTimestamp.Time, false
	for _, c := range p.Status.Conditions {
		if c.Type != corev1.PodReady {
			continue
		}
		if ready = c.Status == corev1.ConditionTrue; !ready {
			since = c.LastTransitionTime.Time
		}
	}
	if d := p.DeletionTimestamp; ready && d != nil {
		// The API server sets deletionTimestamp to the end of the grace period.
		since = d.Time
		if g := p.DeletionGracePeriodSeconds; g != nil {
			since = since.Add(-time.Duration(*g) * time.Second)
		}
	}
	return since
}

// failed is why keyroll could not change or confirm a node. A Redis that does not take connections
// yet while its pod is not Ready is still starting: it is waited for as one that does not run.
func (s *usersSyncer) failed(rc *v1beta1.RedisCluster, p *corev1.Pod, addr string, err error) *problem {
	if redisnode.Unreachable(err) && !podIsReady(p) {
		return s.notRunning(rc, p)
	}
	return unreachable(p, addr, err)
}

// podIsReady says whether the pod's Ready condition is True.
func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// unreachable is a node keyroll could not change or confirm.
func unreachable(p *corev1.Pod, addr string, err error) *problem {
	var re *redisnode.RuleError
	if errors.As(err, &re) {
		return &problem{reason: v1beta1.ReasonInvalidACLRules, event: v1beta1.ReasonInvalidACLRules, wait: time.Minute,
			msg: fmt.Sprintf("pod %s refused spec.credentials.aclRules: %v", p.Name, re)}
	}
	var lo *lockedOut
	if errors.As(err, &lo) {
		return &problem{reason: v1beta1.ReasonAdminLockedOut, event: v1beta1.ReasonAdminLockedOut, wait: time.Minute,
			msg: fmt.Sprintf("pod %s: %v; restart the pod (kubectl delete pod %s) so that its Redis loads the cluster's aclfile again", p.Name, err, p.Name)}
	}
	hint := ""
	if redisnode.Unreachable(err) {
		hint = fmt.Sprintf(" (keyroll connects to every Redis pod on TCP port %d: a NetworkPolicy must let it in)", render.RedisPort)
	}
	return &problem{reason: v1beta1.ReasonNodeUnreachable, event: v1beta1.ReasonNodeUnreachable, wait: 10 * time.Second,
		msg: fmt.Sprintf("pod %s at %s: %v%s", p.Name, addr, err, hint)}
}

// run is one run of a pod's Redis: where it listens and when it started.
type run struct {
	addr      string
	startedAt time.Time
}

// running says whether the pod's Redis container runs, and where.
func running(p *corev1.Pod) (run, bool) {
	if !p.DeletionTimestamp.IsZero() || p.Status.PodIP == "" {
		return run{}, false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == "redis" && c.State.Running != nil {
			return run{addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(render.RedisPort)), startedAt: c.State.Running.StartedAt.Time}, true
		}
	}
	return run{}, false
}

// ordinal is a StatefulSet pod's ordinal.
func ordinal(p *corev1.Pod) int { return ordinalOf(p.Name) }

// ordinalOf is the ordinal in a StatefulSet pod's name.
func ordinalOf(pod string) int {
	n, _ := strconv.Atoi(pod[strings.LastIndexByte(pod, '-')+1:])
	return n
}

// recordsOf keeps the records of the pods that exist, in the pods' order.
func recordsOf(pods []*corev1.Pod, records map[string]v1beta1.NodeStatus) []v1beta1.NodeStatus {
	out := make([]v1beta1.NodeStatus, 0, len(pods))
	for _, p := range pods {
		if r, ok := records[p.Name]; ok {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b v1beta1.NodeStatus) int { return strings.Compare(a.Pod, b.Pod) })
	return out
}

// CheckRules asks a node of rc that runs Redis (the primary first, then the others until one
// answers) whether it accepts rules; a pod not Ready yet whose Redis takes no connection yet is
// passed over, as one that does not run.
// Unless one accepted them, the UsersApplied condition says why not (refused, with Redis's
// words; no node running yet; unreachable) and wait says when to look again.
func (s *usersSyncer) CheckRules(ctx context.Context, rc *v1beta1.RedisCluster, conds status.Setter, rules []string, adminPassword string) (accepted bool, wait time.Duration, err error) {
	m, err := listMembers(ctx, s.Client, rc)
	if err != nil {
		return false, 0, err
	}
	var failed *problem
	for _, p := range slices.Backward(m.Pods) {
		run, ok := running(p)
		if !ok {
			continue
		}
		n := s.Dial(run.addr, render.AdminUser, adminPassword, s.TLS.For(rc))
		err := n.CheckRules(ctx, rules)
		_ = n.Close()
		if err != nil && redisnode.Unreachable(err) && !podIsReady(p) {
			continue // still starting
		}
		var refused *redisnode.RuleError
		switch {
		case err == nil:
			return true, 0, nil
		case errors.As(err, &refused) || failed == nil:
			failed = unreachable(p, run.addr, err)
		}
		if refused != nil {
			break
		}
	}
	if failed != nil {
		return false, failed.report(conds, 0, int(rc.Spec.Replicas)), nil
	}
	p := &problem{reason: v1beta1.ReasonApplying, wait: notRunningWait, msg: "waiting for a Redis pod to run, to check spec.credentials.aclRules on it"}
	return false, p.report(conds, 0, int(rc.Spec.Replicas)), nil
}
