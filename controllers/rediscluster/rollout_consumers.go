package rediscluster

import (
	"context"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/controllers/stoppoint"
)

// consumerPoll is how soon a consumer that is still rolling is looked at again: consumer
// StatefulSets are not watched, and a missed event must not hold a rollout up for long.
const consumerPoll = 5 * time.Second

// ConsumerIndex indexes RedisClusters by the consumers they restart ("Kind/name").
const ConsumerIndex = "spec.rollout.consumers"

// rollConsumers restarts the consumer workloads one after the other, after the Redis pods: each
// gets the credential version hash as a pod-template annotation (never a timestamp, so that a
// repeated reconcile changes nothing), and the next waits until its rollout is complete. A missing
// consumer is reported and passed over (it runs nothing that uses the credential); a paused
// Deployment is reported and waited for.
func (r *Engine) rollConsumers(ctx context.Context, s *step, ro *v1beta1.RolloutStatus) (bool, time.Duration, error) {
	rc := s.rc
	ro.ConsumersUpdated = 0
	for _, ref := range consumerRefs(rc) {
		w, err := r.consumer(ctx, rc.Namespace, ref)
		if apierrors.IsNotFound(err) && !slices.Contains(rc.Spec.Rollout.Consumers, ref) {
			forgetConsumer(rc, ref) // found, not listed, and gone since
			continue
		}
		if apierrors.IsNotFound(err) {
			reportConsumer(s, v1beta1.ReasonConsumerMissing, v1beta1.ReasonConsumerMissing, fmt.Sprintf("consumer %s %s does not exist; passed over", ref.Kind, ref.Name))
			continue
		}
		if err != nil {
			return false, 0, err
		}
		if owner := metav1.GetControllerOf(w.object()); owner != nil && owner.Kind == "RedisCluster" {
			reportConsumer(s, v1beta1.ReasonConsumerRefused, v1beta1.ReasonConsumerRefused, fmt.Sprintf("consumer %s %s is a RedisCluster's own (keyroll restarts Redis pods itself); passed over", ref.Kind, ref.Name))
			continue
		}
		if w.paused() {
			reportConsumer(s, v1beta1.ReasonConsumerPaused, v1beta1.ReasonConsumerPaused, fmt.Sprintf("consumer %s %s is paused; the rollout waits for it", ref.Kind, ref.Name))
			return false, time.Minute, nil
		}
		if w.template().Annotations[v1beta1.AnnotationCredentialVersion] != ro.TargetVersion {
			ro.ConsumerRestartedAt = status.At(r.Clock.Now())
			return false, 0, r.restartConsumer(ctx, s, w, ref, ro.TargetVersion)
		}
		if !w.rolledOut() {
			if w.onDelete() {
				reportConsumer(s, v1beta1.ReasonRolloutStalled, v1beta1.EventRolloutStalled, fmt.Sprintf(
					"Consumer %s %s has updateStrategy OnDelete: its pods get credential %s only when they are deleted, which keyroll leaves to you (delete them one at a time, or use RollingUpdate); the rollout waits, and the superseded credential stays live",
					ref.Kind, ref.Name, ro.TargetVersion))
				return false, consumerPoll, nil
			}
			return false, r.consumerStalled(s, ro, ref), nil
		}
		if old, err := r.oldPods(ctx, rc.Namespace, w, ro.TargetVersion); err != nil || old != "" {
			log.FromContext(ctx).V(1).Info("Waiting for a consumer's old pods to end", "kind", ref.Kind, "name", ref.Name, "pod", old)
			return false, min(r.consumerStalled(s, ro, ref), 2*time.Second), err
		}
		if ro.ConsumerRestartedAt != nil {
			ro.ConsumerRestartedAt = nil
			if c := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionRolloutHealthy); c != nil && c.Reason == v1beta1.ReasonRolloutStalled {
				s.conds.Set(v1beta1.ConditionRolloutHealthy, metav1.ConditionTrue, v1beta1.ReasonRolloutInProgress, ref.Kind+" "+ref.Name+" has rolled out; the rollout goes on")
			}
		}
		ro.ConsumersUpdated++
	}
	return true, 0, nil
}

// consumerStalled waits for a restarted consumer to roll out: after readinessTimeout (timed from
// its restart, or from the rollout's start when that record was lost) the rollout is reported
// stalled, naming it; the superseded credential stays live meanwhile. It says when to look again.
// consumersOn says whether every consumer already runs version, rolled out, so that no rollout
// is needed for it (a reconcile after the rollout, while the retirement of what it replaced
// waits); a consumer that is missing is passed over, as the rollout passes it over.
func (r *Engine) consumersOn(ctx context.Context, s *step, version string) bool {
	for _, ref := range consumerRefs(s.rc) {
		w, err := r.consumer(ctx, s.rc.Namespace, ref)
		if apierrors.IsNotFound(err) {
			continue
		}
		if owner := metav1.GetControllerOf(w.object()); owner != nil && owner.Kind == "RedisCluster" {
			continue
		}
		if err != nil || w.paused() || w.template().Annotations[v1beta1.AnnotationCredentialVersion] != version || !w.rolledOut() {
			return false
		}
		if old, err := r.oldPods(ctx, s.rc.Namespace, w, version); err != nil || old != "" {
			return false
		}
	}
	return true
}

func (r *Engine) consumerStalled(s *step, ro *v1beta1.RolloutStatus, ref v1beta1.ConsumerReference) time.Duration {
	since := ro.ConsumerRestartedAt
	if since == nil {
		since = ro.StartedAt
	}
	// A time read back from status has whole seconds: the timeout counts from the end of that
	// second, never before the restart.
	left := status.Of(since).Truncate(time.Second).Add(time.Second + readinessTimeout(s.rc)).Sub(r.Clock.Now())
	if left > 0 {
		return min(left, consumerPoll) // a watch of the workload's metadata wakes the reconcile sooner
	}
	msg := fmt.Sprintf("Consumer %s %s has not rolled out on credential %s within %s (readinessTimeout); the superseded credential stays live until it has", ref.Kind, ref.Name, ro.TargetVersion, readinessTimeout(s.rc))
	if s.conds.Set(v1beta1.ConditionRolloutHealthy, metav1.ConditionFalse, v1beta1.ReasonRolloutStalled, msg) {
		s.conds.Announce(true, v1beta1.EventRolloutStalled, "Rollout", "%s", msg)
	}
	return consumerPoll
}

// restartConsumer patches the pod-template annotation, which makes the workload roll its pods.
func (r *Engine) restartConsumer(ctx context.Context, s *step, w workload, ref v1beta1.ConsumerReference, version string) error {
	patch := client.MergeFrom(w.object().DeepCopyObject().(client.Object))
	t := w.template()
	if t.Annotations == nil {
		t.Annotations = map[string]string{}
	}
	t.Annotations[v1beta1.AnnotationCredentialVersion] = version
	if err := r.Client.Patch(ctx, w.object(), patch); err != nil {
		return fmt.Errorf("restarting consumer %s %s: %w", ref.Kind, ref.Name, err)
	}
	s.conds.Event(false, v1beta1.EventConsumerRestarted, "Rollout", "Restarted %s %s for credential %s", ref.Kind, ref.Name, version)
	log.FromContext(ctx).Info("Consumer restarted", "kind", ref.Kind, "name", ref.Name, "version", version)
	stoppoint.Reached(stoppoint.MidRollout, s.rc.Namespace)
	return nil
}

// forgetConsumer drops a workload that is not listed from status.consumers.
func forgetConsumer(rc *v1beta1.RedisCluster, ref v1beta1.ConsumerReference) {
	rc.Status.Consumers = slices.DeleteFunc(rc.Status.Consumers, func(c v1beta1.ConsumerInUse) bool {
		return c.Kind == ref.Kind && c.Name == ref.Name && c.Via != v1beta1.ConsumerListed
	})
}

func reportConsumer(s *step, reason, event, msg string) {
	if s.conds.Set(v1beta1.ConditionRolloutHealthy, metav1.ConditionFalse, reason, msg) {
		s.conds.Announce(true, event, "Rollout", "%s", msg)
	}
}

// oldPods names a pod of the workload that runs, or is still shutting down, on a credential other
// than version ("" when there is none): the workload's status may count a rollout done while such
// a pod terminates (a Deployment's status.terminatingReplicas is there only with its feature
// gate), and a terminating pod may still use the credential. Read past the cache (keyroll caches
// no consumer pod).
func (r *Engine) oldPods(ctx context.Context, ns string, w workload, version string) (string, error) {
	sel, err := metav1.LabelSelectorAsSelector(w.selector())
	if err != nil || sel.Empty() {
		return "", err
	}
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return "", fmt.Errorf("listing the pods of a consumer: %w", err)
	}
	for _, p := range pods.Items {
		ended := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if !ended && p.Annotations[v1beta1.AnnotationCredentialVersion] != version {
			return p.Name, nil
		}
	}
	return "", nil
}

// workload is a consumer: a Deployment, StatefulSet or DaemonSet.
type workload interface {
	object() client.Object
	template() *metav1.ObjectMeta
	selector() *metav1.LabelSelector
	paused() bool
	rolledOut() bool
	// onDelete says the workload rolls its pods only when they are deleted.
	onDelete() bool
}

func (r *Engine) consumer(ctx context.Context, ns string, ref v1beta1.ConsumerReference) (workload, error) {
	key := client.ObjectKey{Namespace: ns, Name: ref.Name}
	var w workload
	var obj client.Object
	switch ref.Kind {
	case "Deployment":
		d := &appsv1.Deployment{}
		w, obj = deployment{d}, d
	case "StatefulSet":
		st := &appsv1.StatefulSet{}
		w, obj = statefulSet{st}, st
	case "DaemonSet":
		ds := &appsv1.DaemonSet{}
		w, obj = daemonSet{ds}, ds
	default:
		return nil, fmt.Errorf("consumer kind %q is not supported", ref.Kind)
	}
	// Past the cache: keyroll caches no consumer (other teams' workloads) beyond its metadata.
	return w, r.APIReader.Get(ctx, key, obj)
}

type deployment struct{ *appsv1.Deployment }

func (d deployment) object() client.Object           { return d.Deployment }
func (d deployment) template() *metav1.ObjectMeta    { return &d.Spec.Template.ObjectMeta }
func (d deployment) paused() bool                    { return d.Spec.Paused }
func (d deployment) selector() *metav1.LabelSelector { return d.Spec.Selector }
func (d deployment) onDelete() bool                  { return false }
func (d deployment) rolledOut() bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	st := d.Status
	// A pod being terminated may still use the old credential while it shuts down: the rollout is
	// done only once it is gone (status.terminatingReplicas, where the API server reports it).
	terminating := st.TerminatingReplicas != nil && *st.TerminatingReplicas > 0
	return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == want && st.Replicas == want && st.AvailableReplicas == want && !terminating
}

type statefulSet struct{ *appsv1.StatefulSet }

func (s statefulSet) object() client.Object           { return s.StatefulSet }
func (s statefulSet) template() *metav1.ObjectMeta    { return &s.Spec.Template.ObjectMeta }
func (s statefulSet) paused() bool                    { return false }
func (s statefulSet) selector() *metav1.LabelSelector { return s.Spec.Selector }
func (s statefulSet) onDelete() bool {
	return s.Spec.UpdateStrategy.Type == appsv1.OnDeleteStatefulSetStrategyType
}
func (s statefulSet) rolledOut() bool {
	want := int32(1)
	if s.Spec.Replicas != nil {
		want = *s.Spec.Replicas
	}
	st := s.Status
	return st.ObservedGeneration >= s.Generation && st.UpdatedReplicas == want && st.ReadyReplicas == want &&
		st.CurrentRevision == st.UpdateRevision
}

type daemonSet struct{ *appsv1.DaemonSet }

func (d daemonSet) object() client.Object           { return d.DaemonSet }
func (d daemonSet) template() *metav1.ObjectMeta    { return &d.Spec.Template.ObjectMeta }
func (d daemonSet) paused() bool                    { return false }
func (d daemonSet) selector() *metav1.LabelSelector { return d.Spec.Selector }
func (d daemonSet) onDelete() bool {
	return d.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType
}
func (d daemonSet) rolledOut() bool {
	st := d.Status
	return st.ObservedGeneration >= d.Generation && st.UpdatedNumberScheduled == st.DesiredNumberScheduled &&
		st.NumberAvailable == st.DesiredNumberScheduled
}
