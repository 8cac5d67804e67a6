package rediscluster

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
)

// probeSwapWait is how long a probe sidecar changed in place is given before keyroll looks again.
const probeSwapWait = 2 * time.Second

// swapProbes gives the Redis pods' probe sidecars this keyroll's image in place, one pod at a
// time, replicas first and the primary last, each only while every pod is Ready and no other swap
// is in flight: the kubelet restarts a running sidecar whose definition changed, and that sidecar
// alone; the Redis container, its connections and its data stay (test/node measures it). Pods of
// keyroll v0.1.0 keep their sidecar's image, which their template hash counts, until they restart
// for another reason. It returns when to look again (zero: every sidecar runs the image).
func (r *Engine) swapProbes(ctx context.Context, s *step, pods []*corev1.Pod) time.Duration {
	if r.ProbeImage == "" {
		return 0
	}
	var stale []*corev1.Pod
	for _, p := range pods {
		if _, said := dataPlaneOf(p); said && s.want.current(p) && render.ProbeImage(p.Spec) != "" && render.ProbeImage(p.Spec) != r.ProbeImage {
			stale = append(stale, p)
		}
	}
	if len(stale) == 0 {
		return 0
	}
	for _, p := range pods {
		if probeSwapInFlight(p) || !podReady(p) {
			return probeSwapWait // the pod in flight, or one not Ready, is waited for first
		}
	}
	slices.SortFunc(stale, func(a, b *corev1.Pod) int { return restartOrder(s.rc, b) - restartOrder(s.rc, a) })
	p := stale[0]
	patch := client.StrategicMergeFrom(p.DeepCopy())
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == render.ProbeContainerName {
			p.Spec.InitContainers[i].Image = r.ProbeImage
		}
	}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1beta1.AnnotationProbeSwappedFrom] = probeContainerID(p)
	if err := r.Client.Patch(ctx, p, patch); err != nil {
		log.FromContext(ctx).Info("Could not give a probe sidecar its new image; trying again", "pod", p.Name, "error", err.Error())
		return probeSwapWait
	}
	s.conds.EventAbout(p, false, v1beta1.EventProbeSidecarUpdated, "Upgrade", "Pod %s's probe sidecar runs %s now, changed in place: Redis was not restarted", p.Name, r.ProbeImage)
	log.FromContext(ctx).Info("Probe sidecar image changed in place", "pod", p.Name, "image", r.ProbeImage)
	return probeSwapWait
}

// probeSwapInFlight says whether p's probe sidecar was changed in place and its new container is
// not running and started yet.
func probeSwapInFlight(p *corev1.Pod) bool {
	from, ok := p.Annotations[v1beta1.AnnotationProbeSwappedFrom]
	if !ok {
		return false
	}
	for _, c := range p.Status.InitContainerStatuses {
		if c.Name == render.ProbeContainerName {
			return c.ContainerID == from || c.State.Running == nil || c.Started == nil || !*c.Started
		}
	}
	return false
}

// probeContainerID is the container ID of p's running probe sidecar ("" when none is reported).
func probeContainerID(p *corev1.Pod) string {
	for _, c := range p.Status.InitContainerStatuses {
		if c.Name == render.ProbeContainerName {
			return c.ContainerID
		}
	}
	return ""
}
