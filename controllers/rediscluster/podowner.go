package rediscluster

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// podOwners finds the workload a client's pod belongs to. A pod's owner references are written by
// whoever creates the pod: a tenant's bare pod can name any Deployment, StatefulSet or DaemonSet
// of its namespace as its controller, and keyroll, taking it at its word, would restart that
// workload (rollout.unlistedClients Restart) or count the pod as a listed consumer's and not hold
// the retirement for it. So an owner counts only if it exists with the UID the reference gives
// and its selector selects the pod: a pod its controller would not claim is not its pod.
// One podOwners serves one look at the clients; it reads each owner once, past the cache (which
// holds no consumer).
type podOwners struct {
	Reader client.Reader
	read   map[string]client.Object // by kind and name; nil: not found
}

// workloadOf is the workload p belongs to: its controller (a ReplicaSet's Deployment), or, when
// it has none or the one it names does not vouch for it, the pod itself ("Pod", which keyroll
// never restarts). A controller of another kind is named as the reference gives it: keyroll
// only reports such a workload, and cannot read it to check.
func (o *podOwners) workloadOf(ctx context.Context, p *corev1.Pod) (kind, name string, err error) {
	ref := metav1.GetControllerOf(p)
	if ref == nil {
		return "Pod", p.Name, nil
	}
	var owner client.Object
	switch ref.Kind {
	case "ReplicaSet":
		owner = &appsv1.ReplicaSet{}
	case "StatefulSet":
		owner = &appsv1.StatefulSet{}
	case "DaemonSet":
		owner = &appsv1.DaemonSet{}
	default:
		return ref.Kind, ref.Name, nil
	}
	owner, err = o.selects(ctx, p, ref, owner)
	if err != nil || owner == nil {
		return "Pod", p.Name, err
	}
	rs, isRS := owner.(*appsv1.ReplicaSet)
	if !isRS {
		return ref.Kind, ref.Name, nil
	}
	// A ReplicaSet's pods are restarted through its Deployment, which must be its controller as
	// much as the ReplicaSet is the pod's (a ReplicaSet can name any Deployment too).
	dref := metav1.GetControllerOf(rs)
	if dref == nil || dref.Kind != "Deployment" {
		return "Pod", p.Name, nil
	}
	if d, err := o.selects(ctx, p, dref, &appsv1.Deployment{}); err != nil || d == nil {
		return "Pod", p.Name, err
	}
	return "Deployment", dref.Name, nil
}

// selects reads the owner ref names, of p's namespace, into obj (once per look) and returns it
// if it is the object the reference means (the same UID: a workload deleted and made again under
// its name is another) and its selector matches p's labels; nil if not.
func (o *podOwners) selects(ctx context.Context, p *corev1.Pod, ref *metav1.OwnerReference, obj client.Object) (client.Object, error) {
	key := ref.Kind + "/" + ref.Name
	got, seen := o.read[key]
	if !seen {
		err := o.Reader.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: ref.Name}, obj)
		if client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("reading %s %s, the controller of pod %s: %w", ref.Kind, ref.Name, p.Name, err)
		}
		if !apierrors.IsNotFound(err) {
			got = obj
		}
		if o.read == nil {
			o.read = map[string]client.Object{}
		}
		o.read[key] = got
	}
	if got == nil || ref.UID == "" || got.GetUID() != ref.UID {
		return nil, nil
	}
	var sel *metav1.LabelSelector
	switch w := got.(type) {
	case *appsv1.ReplicaSet:
		sel = w.Spec.Selector
	case *appsv1.Deployment:
		sel = w.Spec.Selector
	case *appsv1.StatefulSet:
		sel = w.Spec.Selector
	case *appsv1.DaemonSet:
		sel = w.Spec.Selector
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || sel == nil || s.Empty() || !s.Matches(labels.Set(p.Labels)) {
		return nil, nil // a selector that selects nothing, or everything, vouches for no pod
	}
	return got, nil
}
