// Package primary keeps one primary per RedisCluster: it records which Redis pod is the primary
// (status.primary) and labels the pods with their role, which the client Service selects by;
// before a rollout restarts the primary it hands the role to an in-sync replica with Redis's
// coordinated FAILOVER; when the primary is lost (not Ready for a while) it promotes the replica
// that has the most of the primary's data; and a Redis that started again as a second primary
// is made a replica of the primary. In steady state it sends no Redis command: it asks the
// nodes only when a pod is not Ready, has started again, or is about to be restarted.
package primary

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers/conditions"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/statustime"
	"github.com/keyroll/keyroll/redisnode"
)

const (
	// RedisPort is the port keyroll reaches each Redis pod on, by the pod's IP.
	RedisPort = 6379
	// LostAfter is how long the primary may be not Ready before a replica is promoted: longer
	// than a readiness probe that fails once, shorter than clients like to wait.
	LostAfter = 10 * time.Second
	// MaxLag is how far (bytes of the replication stream) a replica may be behind its primary
	// and still count as in sync.
	MaxLag = 1 << 20
	// failoverTimeout bounds FAILOVER's wait for the replica to catch up; Redis aborts it then,
	// and the primary goes on as before.
	failoverTimeout = 10 * time.Second
)

// Keeper keeps the primary of RedisClusters.
type Keeper struct {
	// Client reads the Redis pods (from the cache) and writes their role labels.
	Client client.Client
	Dial   redisnode.Dialer
	Clock  clock.Clock
}

// Cluster is one reconcile's view: the cluster, its conditions, its Redis pods and the admin
// user's password.
type Cluster struct {
	RC    *v1alpha1.RedisCluster
	Conds conditions.Setter
	Pods  []*corev1.Pod
	Admin string
}

// For lists rc's Redis pods.
func (k *Keeper) For(ctx context.Context, rc *v1alpha1.RedisCluster, conds conditions.Setter, admin string) (*Cluster, error) {
	list := &corev1.PodList{}
	if err := k.Client.List(ctx, list, client.InNamespace(rc.Namespace), client.MatchingLabels(render.SelectorLabels(rc))); err != nil {
		return nil, fmt.Errorf("listing Redis pods: %w", err)
	}
	c := &Cluster{RC: rc, Conds: conds, Admin: admin}
	for i := range list.Items {
		c.Pods = append(c.Pods, &list.Items[i])
	}
	return c, nil
}

// Keep makes status.primary name the cluster's primary and the role labels follow it: the first
// primary is pod 0 (the start script makes it one); a primary not Ready for LostAfter is replaced
// by the best replica; a Redis that started again as a primary beside it is made its replica.
// wait is when to look again (0: nothing to wait for).
func (k *Keeper) Keep(ctx context.Context, c *Cluster) (time.Duration, error) {
	rc := c.RC
	if rc.Status.Primary == "" {
		rc.Status.Primary = rc.Name + "-0"
	}
	var wait time.Duration
	var errs []error
	if p := c.pod(rc.Status.Primary); len(c.Pods) > 1 && !ready(p) {
		if left := LostAfter - k.Clock.Since(notReadySince(p, k.Clock.Now())); left > 0 {
			wait = left
		} else if err := k.promote(ctx, c); err != nil {
			errs = append(errs, err)
			wait = time.Second
		}
	}
	errs = append(errs, k.demoteStarted(ctx, c), k.label(ctx, c))
	return wait, errors.Join(errs...)
}

// promote makes a replica the primary in place of one that is lost: the node that already says
// it is the primary (a FAILOVER whose record was lost), else the replica that has taken in most
// of the lost primary's stream. The other nodes replicate from it.
func (k *Keeper) promote(ctx context.Context, c *Cluster) error {
	rc := c.RC
	var best *corev1.Pod
	var bestRepl redisnode.Replication
	for _, p := range c.Pods {
		if p.Name == rc.Status.Primary || !running(p) {
			continue
		}
		st, err := k.node(p, c.Admin).Replication(ctx)
		if err != nil {
			continue // it cannot be the primary
		}
		if st.Role == "master" {
			best, bestRepl = p, st
			break
		}
		if !st.SyncInProgress && (best == nil || st.Offset > bestRepl.Offset) {
			best, bestRepl = p, st
		}
	}
	if best == nil {
		return fmt.Errorf("primary %s is lost and no replica answers to take its place", rc.Status.Primary)
	}
	if bestRepl.Role != "master" {
		if err := k.node(best, c.Admin).ReplicaOf(ctx, "", 0); err != nil {
			return err
		}
	}
	lost := rc.Status.Primary
	rc.Status.Primary = best.Name
	c.Conds.Announce(true, v1alpha1.EventPrimaryPromoted, "Promote",
		"Primary %s was not Ready for %s: %s, the replica with the most of its data (replication offset %d), is the primary now; the other nodes replicate from it",
		lost, LostAfter, best.Name, bestRepl.Offset)
	log.FromContext(ctx).Info("Primary lost; replica promoted", "lost", lost, "primary", best.Name, "offset", bestRepl.Offset)
	return k.follow(ctx, c, best, "")
}

// follow points every running node but the primary p at p. skip is a node that already
// follows it (FAILOVER made the old primary p's replica), or "".
func (k *Keeper) follow(ctx context.Context, c *Cluster, p *corev1.Pod, skip string) error {
	var errs []error
	for _, o := range c.Pods {
		if o == p || o.Name == skip || !running(o) {
			continue
		}
		if err := k.node(o, c.Admin).ReplicaOf(ctx, p.Status.PodIP, RedisPort); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// demoteStarted asks each Redis that started since keyroll last confirmed its node (status.nodes)
// for its role: one that came back as a primary beside the cluster's primary (an aclfile-only
// start with data on disk, while a replica had been promoted) becomes the primary's replica.
func (k *Keeper) demoteStarted(ctx context.Context, c *Cluster) error {
	rc := c.RC
	primary := c.pod(rc.Status.Primary)
	if !ready(primary) {
		return nil
	}
	seen := map[string]v1alpha1.NodeStatus{}
	for _, n := range rc.Status.Nodes {
		seen[n.Pod] = n
	}
	var errs []error
	for _, p := range c.Pods {
		rec, ok := seen[p.Name]
		started := startedAt(p)
		if p == primary || !running(p) || (ok && rec.PodUID == p.UID && statustime.Of(rec.StartedAt).Equal(started)) || !ok && len(rc.Status.Nodes) == 0 {
			continue
		}
		st, err := k.node(p, c.Admin).Replication(ctx)
		if err != nil || st.Role != "master" {
			continue
		}
		log.FromContext(ctx).Info("A Redis node started as a second primary; making it a replica", "pod", p.Name, "primary", primary.Name)
		errs = append(errs, k.node(p, c.Admin).ReplicaOf(ctx, primary.Status.PodIP, RedisPort))
	}
	return errors.Join(errs...)
}

// label sets each pod's role label from status.primary.
func (k *Keeper) label(ctx context.Context, c *Cluster) error {
	var errs []error
	for _, p := range c.Pods {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		want := v1alpha1.RoleReplica
		if p.Name == c.RC.Status.Primary {
			want = v1alpha1.RolePrimary
		}
		if p.Labels[v1alpha1.LabelRole] == want {
			continue
		}
		patch := client.MergeFrom(p.DeepCopy())
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[v1alpha1.LabelRole] = want
		if err := k.Client.Patch(ctx, p, patch); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("labelling pod %s %s: %w", p.Name, want, err))
		}
	}
	return errors.Join(errs...)
}

// HandOver gives the primary role of pod primary to an in-sync replica, preferring those prefer
// accepts, before primary restarts: FAILOVER, which pauses writes until the replica has every one
// of them; then status.primary, the labels (so the client Service) and every other replica follow
// it. done says the role has moved; when no replica is in sync it is false, with why.
func (k *Keeper) HandOver(ctx context.Context, c *Cluster, prefer func(*corev1.Pod) bool) (done bool, why string, err error) {
	rc := c.RC
	old := c.pod(rc.Status.Primary)
	if old == nil || !running(old) {
		return false, "the primary " + rc.Status.Primary + " is not running", nil
	}
	st, err := k.node(old, c.Admin).Replication(ctx)
	if err != nil {
		return false, "", err
	}
	if st.Role != "master" {
		// A hand-over whose record was lost (its status write conflicted): the role has moved
		// already, to the node this one replicates from.
		return k.adopt(ctx, c, old, st)
	}
	target, rep := c.inSync(st, old, prefer)
	if target == nil {
		return false, fmt.Sprintf("no replica of %s is Ready and in sync (within %d bytes) to take its primary role", old.Name, MaxLag), nil
	}
	if err := k.node(old, c.Admin).Failover(ctx, rep.IP, rep.Port, failoverTimeout); err != nil {
		return false, "", err
	}
	if err := k.awaitPrimary(ctx, target, c.Admin); err != nil {
		return false, "", err
	}
	rc.Status.Primary = target.Name
	c.Conds.Announce(false, v1alpha1.EventPrimaryHandedOver, "Failover",
		"Primary role handed over from %s to %s (FAILOVER, no write lost) before %s restarts", old.Name, target.Name, old.Name)
	log.FromContext(ctx).Info("Primary handed over", "from", old.Name, "to", target.Name)
	// The client Service follows the label at once; then the other replicas follow the primary.
	return true, "", errors.Join(k.label(ctx, c), k.follow(ctx, c, target, old.Name))
}

// adopt records as the primary the node that the recorded primary old, now a replica, follows,
// if that node says it is the primary.
func (k *Keeper) adopt(ctx context.Context, c *Cluster, old *corev1.Pod, st redisnode.Replication) (bool, string, error) {
	p := c.podAt(st.MasterHost)
	if p == nil {
		return false, "", fmt.Errorf("pod %s, the cluster's primary, is a replica of %s, which is no pod of the cluster", old.Name, st.MasterHost)
	}
	if pst, err := k.node(p, c.Admin).Replication(ctx); err != nil || pst.Role != "master" {
		return false, "", errors.Join(err, fmt.Errorf("pod %s, the cluster's primary, is a replica of %s, which is no primary", old.Name, p.Name))
	}
	c.RC.Status.Primary = p.Name
	log.FromContext(ctx).Info("The primary role had moved already; recorded", "from", old.Name, "to", p.Name)
	return true, "", errors.Join(k.label(ctx, c), k.follow(ctx, c, p, old.Name))
}

// inSync is a Ready replica of the primary old that is online and caught up within MaxLag,
// one that prefer accepts first.
func (c *Cluster) inSync(st redisnode.Replication, old *corev1.Pod, prefer func(*corev1.Pod) bool) (*corev1.Pod, redisnode.Replica) {
	var pick *corev1.Pod
	var pickRep redisnode.Replica
	for _, rep := range st.Replicas {
		p := c.podAt(rep.IP)
		if p == nil || p == old || !ready(p) || rep.State != "online" || st.Offset-rep.Offset > MaxLag {
			continue
		}
		if pick == nil || (prefer(p) && !prefer(pick)) {
			pick, pickRep = p, rep
		}
	}
	return pick, pickRep
}

// InSync says whether pod name is a replica of the primary, online and caught up within MaxLag
// (a primary is in sync with itself).
func (k *Keeper) InSync(ctx context.Context, c *Cluster, name string) (bool, error) {
	primary := c.pod(c.RC.Status.Primary)
	p := c.pod(name)
	if p == nil || primary == nil {
		return false, nil
	}
	if p == primary {
		return true, nil
	}
	st, err := k.node(primary, c.Admin).Replication(ctx)
	if err != nil {
		return false, err
	}
	for _, rep := range st.Replicas {
		if rep.IP == p.Status.PodIP && rep.State == "online" && st.Offset-rep.Offset <= MaxLag {
			return true, nil
		}
	}
	return false, nil
}

// awaitPrimary waits until the node of p says it is the primary: FAILOVER returns before the
// switch, which takes the replica's catching up (milliseconds, up to failoverTimeout).
func (k *Keeper) awaitPrimary(ctx context.Context, p *corev1.Pod, admin string) error {
	n := k.node(p, admin)
	deadline := time.Now().Add(failoverTimeout + 2*time.Second)
	for {
		st, err := n.Replication(ctx)
		if err == nil && st.Role == "master" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("FAILOVER to %s did not complete within %s (Redis aborts it then; the old primary goes on)", p.Name, failoverTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (k *Keeper) node(p *corev1.Pod, admin string) redisnode.Node {
	return k.Dial(net.JoinHostPort(p.Status.PodIP, strconv.Itoa(RedisPort)), render.AdminUser, admin)
}

func (c *Cluster) pod(name string) *corev1.Pod {
	for _, p := range c.Pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func (c *Cluster) podAt(ip string) *corev1.Pod {
	for _, p := range c.Pods {
		if p.Status.PodIP == ip && p.DeletionTimestamp.IsZero() {
			return p
		}
	}
	return nil
}

func ready(p *corev1.Pod) bool {
	if p == nil || !p.DeletionTimestamp.IsZero() {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// running says whether the pod's Redis container runs, at an address.
func running(p *corev1.Pod) bool {
	return p.DeletionTimestamp.IsZero() && p.Status.PodIP != "" && !startedAt(p).IsZero()
}

func startedAt(p *corev1.Pod) time.Time {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == "redis" && c.State.Running != nil {
			return c.State.Running.StartedAt.Time
		}
	}
	return time.Time{}
}

// notReadySince is when the pod stopped being Ready: when its Ready condition last turned false,
// when its deletion began, or (never Ready) when it was created; now for no pod at all (the
// StatefulSet makes it again in a moment, and then its creation counts).
func notReadySince(p *corev1.Pod, now time.Time) time.Time {
	if p == nil {
		return now
	}
	if !p.DeletionTimestamp.IsZero() {
		since := p.DeletionTimestamp.Time
		if g := p.DeletionGracePeriodSeconds; g != nil {
			since = since.Add(-time.Duration(*g) * time.Second)
		}
		return since
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time
		}
	}
	return p.CreationTimestamp.Time
}
