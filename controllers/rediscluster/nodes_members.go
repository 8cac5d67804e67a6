package rediscluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
)

// members are the Redis nodes of a cluster, and the pods that only look like them.
type members struct {
	// Pods are the cluster's Redis nodes, replicas first (highest ordinal first), pod 0 last.
	Pods []*corev1.Pod
	// LookAlikes carry the cluster's Redis pod labels but are not its StatefulSet's pods:
	// keyroll sends them no password, hash or command, and neither counts nor promotes them.
	LookAlikes []*corev1.Pod
	// Why says, by pod name, why a look-alike is not one of the StatefulSet's pods.
	Why map[string]string
}

// listMembers lists rc's Redis pods. A pod is one of its Redis nodes only if the cluster's own
// StatefulSet (the one rc controls, by UID) made it (notNode): labels anyone who may create pods
// can copy, and a pod named like a node is one only while the StatefulSet's pod of that name
// does not exist.
func listMembers(ctx context.Context, c client.Reader, rc *v1beta1.RedisCluster) (members, error) {
	list := &corev1.PodList{}
	if err := c.List(ctx, list, client.InNamespace(rc.Namespace), client.MatchingLabels(render.SelectorLabels(rc))); err != nil {
		return members{}, fmt.Errorf("listing Redis pods: %w", err)
	}
	sts := &appsv1.StatefulSet{}
	err := c.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name}, sts)
	if client.IgnoreNotFound(err) != nil {
		return members{}, fmt.Errorf("reading StatefulSet %s: %w", rc.Name, err)
	}
	if apierrors.IsNotFound(err) || !controlledBy(sts, rc.UID) {
		sts = nil // no StatefulSet of the cluster's (yet): no pod is a node
	}
	m := members{Why: map[string]string{}}
	for i := range list.Items {
		p := &list.Items[i]
		why := "the cluster has no StatefulSet"
		if sts != nil {
			if why, err = notNode(ctx, c, sts, p); err != nil {
				return members{}, err
			}
		}
		if why == "" {
			m.Pods = append(m.Pods, p)
		} else {
			m.LookAlikes = append(m.LookAlikes, p)
			m.Why[p.Name] = why
		}
	}
	slices.SortFunc(m.Pods, func(a, b *corev1.Pod) int { return ordinal(b) - ordinal(a) })
	slices.SortFunc(m.LookAlikes, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return m, nil
}

// notNode says why p is not one of sts's pods ("": it is one). sts must be its controller, and
// its name sts's name, a dash and an ordinal (in its canonical form) below sts's replicas.
//
// That is not enough: whoever may create pods in the namespace can write an owner reference
// with sts's UID, and a pod named like the next ordinal (orders-3 before a scale-up to 4) would
// become a node when the StatefulSet grows, since the StatefulSet controller takes a pod of that
// name for its own rather than create one. So p must also carry what the StatefulSet controller
// writes on the pods it makes: a controller-revision-hash label that names one of sts's revisions, and a
// creation no earlier than sts's (a pod made before sts can only have become its pod by
// adoption). Whoever may read sts can still copy the label from its status, but a pod of the
// right name, labels and owner is no longer enough. A pod the StatefulSet adopted after
// an earlier StatefulSet of the same name was deleted with --cascade=orphan fails it too, and
// stays out until it is deleted and made again: keyroll cannot tell it from a forged one.
func notNode(ctx context.Context, c client.Reader, sts *appsv1.StatefulSet, p *corev1.Pod) (string, error) {
	if !controlledBy(p, sts.UID) {
		return "its controller is not the StatefulSet", nil
	}
	suffix, ok := strings.CutPrefix(p.Name, sts.Name+"-")
	n, err := strconv.Atoi(suffix)
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	if !ok || err != nil || n < 0 || strconv.Itoa(n) != suffix || n >= int(replicas) {
		return fmt.Sprintf("its name is not that of one of the StatefulSet's %d pods", replicas), nil
	}
	if p.CreationTimestamp.Before(&sts.CreationTimestamp) {
		return "it was created before the StatefulSet", nil
	}
	known, err := isRevisionOf(ctx, c, sts, p.Labels[appsv1.ControllerRevisionHashLabelKey])
	if err != nil || known {
		return "", err
	}
	return "its controller-revision-hash label names no revision of the StatefulSet", nil
}

// isRevisionOf says whether name is one of sts's ControllerRevisions. Its status names the
// current and the update revision; with the OnDelete strategy a pod can still run one between
// them (the template changed twice before keyroll restarted it), which only the
// ControllerRevision itself, controlled by sts, vouches for.
func isRevisionOf(ctx context.Context, c client.Reader, sts *appsv1.StatefulSet, name string) (bool, error) {
	if name == "" {
		return false, nil
	}
	if name == sts.Status.CurrentRevision || name == sts.Status.UpdateRevision {
		return true, nil
	}
	cr := &appsv1.ControllerRevision{}
	err := c.Get(ctx, client.ObjectKey{Namespace: sts.Namespace, Name: name}, cr)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading ControllerRevision %s: %w", name, err)
	}
	return controlledBy(cr, sts.UID), nil
}

func controlledBy(o metav1.Object, uid types.UID) bool {
	ref := metav1.GetControllerOf(o)
	return ref != nil && uid != "" && ref.UID == uid
}
