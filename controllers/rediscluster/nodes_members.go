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
}

// listMembers lists rc's Redis pods. A pod is one of its Redis nodes only if its controller is
// the cluster's own StatefulSet (the one rc controls, by UID) and its name is that StatefulSet's
// name and an ordinal below its replicas: labels anyone who may create pods can copy, and a
// pod named like a node is one only while the StatefulSet's pod of that name does not exist.
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
	var m members
	for i := range list.Items {
		p := &list.Items[i]
		if sts != nil && isNode(sts, p) {
			m.Pods = append(m.Pods, p)
		} else {
			m.LookAlikes = append(m.LookAlikes, p)
		}
	}
	slices.SortFunc(m.Pods, func(a, b *corev1.Pod) int { return ordinal(b) - ordinal(a) })
	slices.SortFunc(m.LookAlikes, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return m, nil
}

// isNode says whether p is one of sts's pods: sts is its controller, and its name is sts's
// name, a dash and an ordinal (in its canonical form) below sts's replicas.
func isNode(sts *appsv1.StatefulSet, p *corev1.Pod) bool {
	if !controlledBy(p, sts.UID) {
		return false
	}
	suffix, ok := strings.CutPrefix(p.Name, sts.Name+"-")
	n, err := strconv.Atoi(suffix)
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	return ok && err == nil && n >= 0 && strconv.Itoa(n) == suffix && n < int(replicas)
}

func controlledBy(o metav1.Object, uid types.UID) bool {
	ref := metav1.GetControllerOf(o)
	return ref != nil && uid != "" && ref.UID == uid
}
