package rediscluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/redisnode"
)

// The planned hand-over of the primary role (FAILOVER), and the replicas' sync it waits for.

// HandOver gives the primary role to an in-sync replica that eligible accepts, preferring those
// prefer accepts, before the primary restarts or leaves: FAILOVER, which pauses writes until the
// replica has every one of them; then status.primary, the labels (so the client Service) and
// every other replica follow it. done says the role has moved; when no replica is in sync it is
// false, with why.
func (k *primaryKeeper) HandOver(ctx context.Context, c *primaryView, eligible, prefer func(*corev1.Pod) bool) (done bool, why string, err error) {
	rc := c.RC
	old := c.pod(rc.Status.Primary)
	if old == nil || !redisRunning(old) {
		return false, "the primary " + rc.Status.Primary + " is not running", nil
	}
	st, err := k.node(c, old).Replication(ctx)
	if err != nil {
		return false, "", err
	}
	if st.Role != "master" {
		// A hand-over whose record was lost (its status write conflicted): the role has moved
		// already, to the node this one replicates from.
		return k.adopt(ctx, c, old, st)
	}
	target, rep := c.inSync(st, old, eligible, prefer)
	if target == nil {
		return false, fmt.Sprintf("no replica of %s is Ready and in sync (within %d bytes) to take its primary role", old.Name, maxLag), nil
	}
	if err := k.node(c, old).Failover(ctx, rep.IP, rep.Port, failoverTimeout); err != nil {
		return false, "", err
	}
	if err := k.awaitPrimary(ctx, c, target); err != nil {
		return false, "", err
	}
	rc.Status.Primary = target.Name
	c.Conds.Announce(false, v1beta1.EventPrimaryHandedOver, "Failover",
		"Primary role handed over from %s to %s (FAILOVER, no write lost) before %s restarts", old.Name, target.Name, old.Name)
	log.FromContext(ctx).Info("Primary handed over", "from", old.Name, "to", target.Name)
	// The client Service follows the label at once; then the other replicas follow the primary.
	return true, "", errors.Join(k.label(ctx, c), k.follow(ctx, c, target, old.Name))
}

// adopt records as the primary the node that the recorded primary old, now a replica, follows,
// if that node says it is the primary.
func (k *primaryKeeper) adopt(ctx context.Context, c *primaryView, old *corev1.Pod, st redisnode.Replication) (bool, string, error) {
	p := c.podAt(st.MasterHost)
	if p == nil {
		return false, "", fmt.Errorf("pod %s, the cluster's primary, is a replica of %s, which is no pod of the cluster", old.Name, st.MasterHost)
	}
	if pst, err := k.node(c, p).Replication(ctx); err != nil || pst.Role != "master" {
		return false, "", errors.Join(err, fmt.Errorf("pod %s, the cluster's primary, is a replica of %s, which is no primary", old.Name, p.Name))
	}
	c.RC.Status.Primary = p.Name
	log.FromContext(ctx).Info("The primary role had moved already; recorded", "from", old.Name, "to", p.Name)
	return true, "", errors.Join(k.label(ctx, c), k.follow(ctx, c, p, old.Name))
}

// inSync is a Ready replica of the primary old that eligible accepts, online and caught up
// within maxLag, one that prefer accepts first.
func (c *primaryView) inSync(st redisnode.Replication, old *corev1.Pod, eligible, prefer func(*corev1.Pod) bool) (*corev1.Pod, redisnode.Replica) {
	var pick *corev1.Pod
	var pickRep redisnode.Replica
	for _, rep := range st.Replicas {
		p := c.podAt(rep.IP)
		if p == nil || p == old || !eligible(p) || !podReady(p) || rep.State != "online" || st.Offset-rep.Offset > maxLag {
			continue
		}
		if pick == nil || (prefer(p) && !prefer(pick)) {
			pick, pickRep = p, rep
		}
	}
	return pick, pickRep
}

// InSync says whether pod name is a replica of the primary, online and caught up within maxLag
// (a primary is in sync with itself).
func (k *primaryKeeper) InSync(ctx context.Context, c *primaryView, name string) (bool, error) {
	primary := c.pod(c.RC.Status.Primary)
	p := c.pod(name)
	if p == nil || primary == nil {
		return false, nil
	}
	if p == primary {
		return true, nil
	}
	st, err := k.node(c, primary).Replication(ctx)
	if err != nil {
		return false, err
	}
	for _, rep := range st.Replicas {
		if rep.IP == p.Status.PodIP && rep.State == "online" && st.Offset-rep.Offset <= maxLag {
			return true, nil
		}
	}
	return false, nil
}

// awaitPrimary waits until the node of p says it is the primary: FAILOVER returns before the
// switch, which takes the replica's catching up (milliseconds, up to failoverTimeout). The wait
// is on Redis, in real time, bounded by the context's deadline.
func (k *primaryKeeper) awaitPrimary(ctx context.Context, c *primaryView, p *corev1.Pod) error {
	n := k.node(c, p)
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, failoverTimeout+2*time.Second, true, func(ctx context.Context) (bool, error) {
		st, err := n.Replication(ctx)
		return err == nil && st.Role == "master", nil
	})
	if err != nil {
		return fmt.Errorf("FAILOVER to %s did not complete within %s (Redis aborts it then; the old primary goes on): %w", p.Name, failoverTimeout, err)
	}
	return nil
}
