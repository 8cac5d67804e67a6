// The primary keeper keeps one primary per RedisCluster: it records which Redis pod is the primary
// (status.primary) and labels the pods with their role, which the client Service selects by;
// before a rollout restarts the primary it hands the role to an in-sync replica with Redis's
// coordinated FAILOVER; when the primary is lost (not Ready for a while, and no longer answering
// as the primary) it promotes the replica that has the most of the primary's data; and a Redis
// that started again as a second primary is made a replica of the primary. In steady state it
// sends no Redis command: it asks the nodes only when a pod is not Ready, has started again, or
// is about to be restarted.

package rediscluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/redisnode"
)

const (
	// PrimaryLostAfter is how long the primary may be not Ready before a replica is promoted: longer
	// than a readiness probe that fails once, shorter than clients like to wait.
	PrimaryLostAfter = 10 * time.Second
	// maxLag is how far (bytes of the replication stream) a replica may be behind its primary
	// and still count as in sync.
	maxLag = 1 << 20
	// failoverTimeout bounds FAILOVER's wait for the replica to catch up; Redis aborts it then,
	// and the primary goes on as before.
	failoverTimeout = 10 * time.Second
)

// primaryKeeper keeps the primary of RedisClusters.
type primaryKeeper struct {
	// Client reads the Redis pods (from the cache) and writes their role labels.
	Client     client.Client
	Dial       redisnode.Dialer
	TLS        *nodeTLS
	Clock      clock.Clock
	lookAlikes seenPods
}

// primaryView is one reconcile's view: the cluster, its conditions, its Redis pods and the admin
// user's password.
type primaryView struct {
	RC    *v1beta1.RedisCluster
	Conds status.Setter
	Pods  []*corev1.Pod
	Admin string
}

// For lists rc's Redis pods (listMembers), and reports each pod that only looks like one
// (a Warning event about the cluster and the pod, once per pod while keyroll runs).
func (k *primaryKeeper) For(ctx context.Context, rc *v1beta1.RedisCluster, conds status.Setter, admin string) (*primaryView, error) {
	m, err := listMembers(ctx, k.Client, rc)
	if err != nil {
		return nil, err
	}
	for _, p := range k.lookAlikes.fresh(client.ObjectKeyFromObject(rc), m.LookAlikes) {
		conds.EventAbout(p, true, v1beta1.EventLookAlikePod, "ListNodes",
			"Pod %s carries the labels of this cluster's Redis pods but is not one of StatefulSet %s's pods (%s): keyroll sends it nothing and does not count it as a Redis node", p.Name, rc.Name, m.Why[p.Name])
	}
	return &primaryView{RC: rc, Conds: conds, Admin: admin, Pods: m.Pods}, nil
}

// Forget drops what the keeper keeps of a deleted cluster.
func (k *primaryKeeper) Forget(key types.NamespacedName) { k.lookAlikes.set(key, nil) }

// Keep makes status.primary name the cluster's primary and the role labels follow it: the first
// primary is pod 0 (the start script makes it one); a primary not Ready for PrimaryLostAfter that no
// longer answers as the primary is replaced by the best replica; a Redis that started again as
// a primary beside it is made its replica.
// wait is when to look again (0: nothing to wait for).
func (k *primaryKeeper) Keep(ctx context.Context, c *primaryView) (time.Duration, error) {
	rc := c.RC
	if rc.Status.Primary == "" {
		rc.Status.Primary = rc.Name + "-0"
	}
	var wait time.Duration
	var errs []error
	k.recordLabelled(ctx, c)
	if p := c.pod(rc.Status.Primary); len(c.Pods) > 1 && !podReady(p) {
		if left := PrimaryLostAfter - k.Clock.Since(notReadySince(p, k.Clock.Now())); left > 0 {
			wait = left
		} else if k.answersAsPrimary(ctx, c, p) {
			wait = PrimaryLostAfter
		} else if err := k.promote(ctx, c); err != nil {
			errs = append(errs, err)
			wait = time.Second
		}
	}
	if moved, err := k.beforeScaleDown(ctx, c); err != nil || !moved {
		errs = append(errs, err)
		wait = status.Soonest(wait, 5*time.Second)
	}
	errs = append(errs, k.demoteStarted(ctx, c), k.label(ctx, c))
	return wait, errors.Join(errs...)
}

// beforeScaleDown hands the primary role to a pod that spec.replicas keeps when a scale-down
// would remove the primary (the StatefulSet keeps it until then: render.StatefulSet). moved
// says there is nothing (left) to hand over.
func (k *primaryKeeper) beforeScaleDown(ctx context.Context, c *primaryView) (bool, error) {
	if ordinalOf(c.RC.Status.Primary) < int(c.RC.Spec.Replicas) {
		return true, nil
	}
	kept := func(p *corev1.Pod) bool { return ordinal(p) < int(c.RC.Spec.Replicas) }
	moved, why, err := k.HandOver(ctx, c, kept, kept)
	if err == nil && !moved {
		log.FromContext(ctx).Info("Waiting to hand the primary role over before the scale-down removes the primary", "primary", c.RC.Status.Primary, "why", why)
	}
	return moved, err
}

// recordLabelled takes the primary from the role label when status.primary names a pod that is
// not Ready and another, Ready, is labelled primary and says it is: a hand-over whose status
// write was lost (the labels were written first). Without it, the labels would follow the stale
// record, and the client Service would have no primary until a promotion.
func (k *primaryKeeper) recordLabelled(ctx context.Context, c *primaryView) {
	if podReady(c.pod(c.RC.Status.Primary)) {
		return
	}
	for _, p := range c.Pods {
		if p.Name == c.RC.Status.Primary || p.Labels[v1beta1.LabelRole] != v1beta1.RolePrimary || !podReady(p) {
			continue
		}
		if st, err := k.node(c, p).Replication(ctx); err == nil && st.Role == "master" {
			log.FromContext(ctx).Info("The primary role had moved already; recorded", "from", c.RC.Status.Primary, "to", p.Name)
			c.RC.Status.Primary = p.Name
			return
		}
	}
}

// answersAsPrimary says whether the primary p, not Ready for PrimaryLostAfter, still runs as the
// primary: it is not being deleted and tells keyroll it is the primary. Its probe fails for
// another reason than a lost Redis (a node too busy to run it in time, a dataset still loading),
// which a promotion would not mend: the replica would be no more Ready than p, writes p had not
// yet sent it would be lost, and on a busy node the roles would swap back and forth. A Redis that
// does not answer (stopped, hung, unreachable) or answers as a replica is lost.
func (k *primaryKeeper) answersAsPrimary(ctx context.Context, c *primaryView, p *corev1.Pod) bool {
	if p == nil || !redisRunning(p) {
		return false
	}
	st, err := k.node(c, p).Replication(ctx)
	if err != nil || st.Role != "master" {
		return false
	}
	log.FromContext(ctx).Info("The primary is not Ready but answers as the primary; not promoting a replica", "primary", p.Name)
	return true
}

// promote makes a replica the primary in place of one that is lost: the node that already says
// it is the primary (a FAILOVER whose record was lost), else the replica that has taken in most
// of the lost primary's stream. The other nodes replicate from it.
func (k *primaryKeeper) promote(ctx context.Context, c *primaryView) error {
	rc := c.RC
	var best *corev1.Pod
	var bestRepl redisnode.Replication
	for _, p := range c.Pods {
		if p.Name == rc.Status.Primary || !redisRunning(p) {
			continue
		}
		st, err := k.node(c, p).Replication(ctx)
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
		if err := k.node(c, best).ReplicaOf(ctx, "", 0); err != nil {
			return err
		}
	}
	lost := rc.Status.Primary
	rc.Status.Primary = best.Name
	c.Conds.Announce(true, v1beta1.EventPrimaryPromoted, "Promote",
		"Primary %s was not Ready for %s: %s, the replica with the most of its data (replication offset %d), is the primary now; the other nodes replicate from it",
		lost, PrimaryLostAfter, best.Name, bestRepl.Offset)
	log.FromContext(ctx).Info("Primary lost; replica promoted", "lost", lost, "primary", best.Name, "offset", bestRepl.Offset)
	return k.follow(ctx, c, best, "")
}

// follow points every running node but the primary p at p. skip is a node that already
// follows it (FAILOVER made the old primary p's replica), or "".
func (k *primaryKeeper) follow(ctx context.Context, c *primaryView, p *corev1.Pod, skip string) error {
	var errs []error
	for _, o := range c.Pods {
		if o == p || o.Name == skip || !redisRunning(o) {
			continue
		}
		if err := k.node(c, o).ReplicaOf(ctx, p.Status.PodIP, render.RedisPort); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// demoteStarted asks each Redis that started since keyroll last confirmed its node (status.nodes)
// for its role: one that came back as a primary beside the cluster's primary (an aclfile-only
// start with data on disk, while a replica had been promoted) becomes the primary's replica.
func (k *primaryKeeper) demoteStarted(ctx context.Context, c *primaryView) error {
	rc := c.RC
	primary := c.pod(rc.Status.Primary)
	if !podReady(primary) {
		return nil
	}
	seen := map[string]v1beta1.NodeStatus{}
	for _, n := range rc.Status.Nodes {
		seen[n.Pod] = n
	}
	var errs []error
	for _, p := range c.Pods {
		rec, ok := seen[p.Name]
		run, up := running(p)
		if p == primary || !up || (ok && rec.PodUID == p.UID && status.Of(rec.StartedAt).Equal(run.startedAt)) || !ok && len(rc.Status.Nodes) == 0 {
			continue
		}
		st, err := k.node(c, p).Replication(ctx)
		if err != nil || st.Role != "master" {
			continue
		}
		log.FromContext(ctx).Info("A Redis node started as a second primary; making it a replica", "pod", p.Name, "primary", primary.Name)
		errs = append(errs, k.node(c, p).ReplicaOf(ctx, primary.Status.PodIP, render.RedisPort))
	}
	return errors.Join(errs...)
}

// label sets each pod's role label from status.primary.
func (k *primaryKeeper) label(ctx context.Context, c *primaryView) error {
	var errs []error
	for _, p := range c.Pods {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		want := v1beta1.RoleReplica
		if p.Name == c.RC.Status.Primary {
			want = v1beta1.RolePrimary
		}
		if p.Labels[v1beta1.LabelRole] == want {
			continue
		}
		patch := client.MergeFrom(p.DeepCopy())
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[v1beta1.LabelRole] = want
		if err := k.Client.Patch(ctx, p, patch); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("labelling pod %s %s: %w", p.Name, want, err))
		}
	}
	return errors.Join(errs...)
}

func (k *primaryKeeper) node(c *primaryView, p *corev1.Pod) redisnode.Node {
	return k.Dial(net.JoinHostPort(p.Status.PodIP, strconv.Itoa(render.RedisPort)), render.AdminUser, c.Admin, k.TLS.For(c.RC))
}

func (c *primaryView) pod(name string) *corev1.Pod {
	for _, p := range c.Pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func (c *primaryView) podAt(ip string) *corev1.Pod {
	for _, p := range c.Pods {
		if p.Status.PodIP == ip && p.DeletionTimestamp.IsZero() {
			return p
		}
	}
	return nil
}

// redisRunning says whether the pod's Redis container runs, at an address.
func redisRunning(p *corev1.Pod) bool {
	_, ok := running(p)
	return ok
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
