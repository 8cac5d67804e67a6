package rediscluster

// The NetworkPolicy of a RedisCluster's Redis pods (spec.networkPolicy): applied while enabled,
// from keyroll's manager, the cluster's own pods, its consumers' pods and the peers the owner
// lists; removed once disabled.

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/render"
)

// netpolKeeper writes the NetworkPolicies.
type netpolKeeper struct {
	Client client.Client
	// APIReader reads the consumers' workloads (the cache holds their metadata only).
	APIReader client.Reader
	// OperatorNamespace is where keyroll's manager pods run.
	OperatorNamespace string
}

// Keep applies rc's NetworkPolicy while spec.networkPolicy is enabled, and deletes the one keyroll
// kept once it is not.
func (k *netpolKeeper) Keep(ctx context.Context, rc *v1beta1.RedisCluster) error {
	if np := rc.Spec.NetworkPolicy; np == nil || !np.Enabled {
		return k.remove(ctx, rc)
	}
	var consumers []*metav1.LabelSelector
	for _, ref := range consumerRefs(rc) {
		sel, err := k.selectorOf(ctx, rc.Namespace, ref)
		if err != nil {
			return err
		}
		if sel != nil {
			consumers = append(consumers, sel)
		}
	}
	return apply.Owned(ctx, k.Client, k.APIReader, rc, render.NetworkPolicy(rc, k.OperatorNamespace, consumers))
}

// selectorOf is the pod selector of a consumer workload (nil when it does not exist: the rollout
// reports a missing consumer).
func (k *netpolKeeper) selectorOf(ctx context.Context, ns string, ref v1beta1.ConsumerReference) (*metav1.LabelSelector, error) {
	var obj client.Object
	var sel func() *metav1.LabelSelector
	switch ref.Kind {
	case "Deployment":
		d := &appsv1.Deployment{}
		obj, sel = d, func() *metav1.LabelSelector { return d.Spec.Selector }
	case "StatefulSet":
		s := &appsv1.StatefulSet{}
		obj, sel = s, func() *metav1.LabelSelector { return s.Spec.Selector }
	case "DaemonSet":
		d := &appsv1.DaemonSet{}
		obj, sel = d, func() *metav1.LabelSelector { return d.Spec.Selector }
	default:
		return nil, nil
	}
	if err := k.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading consumer %s %s for the NetworkPolicy: %w", ref.Kind, ref.Name, err)
	}
	return sel(), nil
}

// remove deletes the NetworkPolicy keyroll kept for rc, if any.
func (k *netpolKeeper) remove(ctx context.Context, rc *v1beta1.RedisCluster) error {
	np := &networkingv1.NetworkPolicy{}
	err := k.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: render.NetworkPolicyName(rc)}, np)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading NetworkPolicy %s: %w", render.NetworkPolicyName(rc), err)
	}
	if !apply.OwnedBy(np, rc) {
		return nil
	}
	if err := k.Client.Delete(ctx, np, client.Preconditions{UID: &np.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting NetworkPolicy %s: %w", np.Name, err)
	}
	return nil
}
