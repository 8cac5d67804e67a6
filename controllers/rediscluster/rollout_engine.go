package rediscluster

import (
	"context"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/metrics"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/controllers/stoppoint"
	"github.com/keyroll/keyroll/rotation"
)

// lagWait is how long a rollout step waits for a cache or the StatefulSet controller to catch up.
const lagWait = 100 * time.Millisecond

// defaultReadinessTimeout applies when spec.rollout.readinessTimeout is not set.
const defaultReadinessTimeout = 5 * time.Minute

// Engine moves a RedisCluster's consumers to a credential that every Redis node already accepts:
// one at a time, each only while the previous one is Ready on it (make before break); with
// rollout.redisPods Restart it restarts the Redis pods first, the same way. Its state is the cluster's
// status.rollout, so that a restarted operator resumes where it was; it records its conditions
// and events through the caller's condition setter.
type Engine struct {
	Client client.Client
	// APIReader reads past the cache, where a lagging cache could make a step be taken twice.
	APIReader client.Reader
	Clock     clock.Clock
	Metrics   *metrics.Metrics
	// Primary hands the primary role over before the primary restarts.
	Primary *primaryKeeper
	// ProbeImage is the image of the Redis pods' probe sidecar.
	ProbeImage string
}

// step is one call of Roll: the cluster, its conditions, its Redis pods, and what a pod runs
// when it is up to date.
type step struct {
	rc      *v1beta1.RedisCluster
	conds   status.Setter
	cluster *primaryView
	want    podWant
}

// podWant is what an up-to-date Redis pod runs: the current pod template and, with
// rollout.redisPods Restart, the credential version.
type podWant struct {
	template, version string
	restarts          bool
	// tmpl is the template rendered now, before its annotations, and legacy the v0.1.0 hashes of
	// it by probe image (rollout_dataplane.go).
	tmpl   corev1.PodTemplateSpec
	legacy map[string]string
	// dataPlaneNow says that pods of an older data plane are restarted now; newerNow, that those
	// of a newer one are (rollout_dataplane.go).
	dataPlaneNow, newerNow bool
}

// current says whether p runs what is wanted now: a pod of another data plane does until its
// restart is due.
func (w podWant) current(p *corev1.Pod) bool {
	return !w.templateDue(p) && (!w.restarts || p.Annotations[v1beta1.AnnotationCredentialVersion] == w.version)
}

// templateDue says whether p is to be restarted now for its template.
func (w podWant) templateDue(p *corev1.Pod) bool {
	switch w.fit(p) {
	case fitSpec:
		return true
	case fitDataPlane:
		return w.dataPlaneNow
	case fitNewer:
		return w.newerNow
	}
	return false
}

// Roll takes the next steps of moving c's pods and consumers to version, and the Redis pods to
// the current pod template (those of an older data plane only in window, or when asked). pending
// says that a superseded credential is still out there (its lease or user not retired yet), so
// that a rollout runs even when every pod already runs version (the consumers may not). done says
// every pod and consumer runs version; until then the superseded leases stay live. wait is when to
// look again.
func (r *Engine) Roll(ctx context.Context, c *primaryView, version string, pending bool, window *rotation.Window) (done bool, wait time.Duration, err error) {
	rc := c.RC
	sts := render.StatefulSet(rc, version, r.ProbeImage)
	tmpl := *sts.Spec.Template.DeepCopy()
	tmpl.Annotations = nil
	s := &step{rc: rc, conds: c.Conds, cluster: c, want: podWant{
		template: sts.Spec.Template.Annotations[v1beta1.AnnotationPodTemplate], tmpl: tmpl, legacy: map[string]string{},
		version: version, restarts: render.RestartsPods(rc), dataPlaneNow: dataPlaneGate(rc, window, r.Clock.Now()), newerNow: rc.DataPlaneUpgradeAsked()}}
	pods := kept(rc, c.Pods)
	windowWait := r.reportDataPlane(s, pods, window)
	done, wait, err = r.roll(ctx, s, pods, version, pending)
	return done, status.Soonest(wait, windowWait), err
}

func (r *Engine) roll(ctx context.Context, s *step, pods []*corev1.Pod, version string, pending bool) (done bool, wait time.Duration, err error) {
	rc := s.rc
	ro := rc.Status.Rollout
	if ro != nil && ro.PodInFlight != "" && ordinalOf(ro.PodInFlight) >= int(rc.Spec.Replicas) {
		// The pod in flight is gone with a scale-down: nothing is left to wait for.
		ro.PodInFlight, ro.PodRestartedAt = "", nil
	}
	// A retirement held for unlisted clients (oldclients.go) follows a finished rollout: while every
	// pod and consumer runs version, it is not started again at each look.
	held := len(rc.Status.OldUserClients) > 0 && s.countCurrent(pods, false) == len(pods) && r.consumersOn(ctx, s, version)
	if ro == nil && s.settled(pods) && (!pending || held) {
		r.Metrics.SetStalePods(client.ObjectKeyFromObject(rc), 0)
		return true, r.swapProbes(ctx, s, pods), nil
	}
	r.Metrics.SetStalePods(client.ObjectKeyFromObject(rc), len(pods)-s.countCurrent(pods, false))
	if stale, err := apply.Stale(ctx, r.APIReader, rc); stale || err != nil {
		// A step of this rollout was already taken from a newer version of the object (restart a
		// pod, revoke a lease): look again from that version rather than take it twice.
		return false, lagWait, err
	}
	if ro == nil {
		if pending {
			if err := r.discoverConsumers(ctx, s); err != nil {
				return false, 0, err
			}
		}
		ro = r.startRollout(ctx, s, version, pending)
	}
	if ro.TargetVersion != version {
		// A newer credential arrived during the rollout: roll to that one instead.
		ro.TargetVersion, ro.PodInFlight, ro.PodRestartedAt, ro.ConsumersUpdated, ro.ConsumerRestartedAt = version, "", nil, 0, nil
		ro.Cause = v1beta1.RolloutForCredential
	}
	if podsDone, wait, err := r.rollPods(ctx, s, pods, ro); !podsDone || err != nil {
		return false, wait, err
	}
	if consumersDone, wait, err := r.rollConsumers(ctx, s, ro); !consumersDone || err != nil {
		return false, wait, err
	}
	r.finishRollout(ctx, s)
	return true, 0, nil
}

func (r *Engine) startRollout(ctx context.Context, s *step, version string, pending bool) *v1beta1.RolloutStatus {
	now := status.At(r.Clock.Now())
	ro := &v1beta1.RolloutStatus{TargetVersion: version, StartedAt: now, Cause: v1beta1.RolloutForCredential}
	if !pending {
		ro.Cause = v1beta1.RolloutForPodTemplate
	}
	s.rc.Status.Rollout = ro
	if ro.Cause == v1beta1.RolloutForPodTemplate {
		s.conds.Set(v1beta1.ConditionRolloutProgressing, metav1.ConditionTrue, v1beta1.ReasonRolloutInProgress,
			"Restarting the Redis pods onto their new template, one at a time, replicas first, each once the one before is Ready and in sync; the primary role is handed over before the primary restarts")
		s.conds.Announce(false, v1beta1.EventPodsRolloutStarted, "Rollout", "Restarting the Redis pods onto their new template (%s)", s.want.template)
		log.FromContext(ctx).Info("Redis pods rollout started", "template", s.want.template)
		return ro
	}
	what := "Restarting the consumers, one at a time, on credential " + version + ", which every Redis node accepts"
	if render.RestartsPods(s.rc) {
		what = "Restarting the Redis pods, then the consumers, one at a time, on credential " + version + ", which every Redis node accepts"
	}
	// The consumers' Secret was written with the new credential just before, in this reconcile.
	stoppoint.Reached(stoppoint.AfterSecretWrite, s.rc.Namespace)
	s.conds.Set(v1beta1.ConditionRolloutProgressing, metav1.ConditionTrue, v1beta1.ReasonRolloutInProgress, what)
	s.conds.Announce(false, v1beta1.EventRotationStarted, "Rollout", "Rolling out credential %s", version)
	log.FromContext(ctx).Info("Rollout started", "version", version)
	return ro
}

func (r *Engine) finishRollout(ctx context.Context, s *step) {
	ro := s.rc.Status.Rollout
	took := r.Clock.Since(ro.StartedAt.Time).Round(time.Second)
	r.Metrics.RolloutDuration.Observe(r.Clock.Since(ro.StartedAt.Time).Seconds())
	s.rc.Status.Rollout = nil
	if ro.Cause == v1beta1.RolloutForPodTemplate {
		s.conds.Set(v1beta1.ConditionRolloutProgressing, metav1.ConditionFalse, v1beta1.ReasonRolloutComplete,
			"Every Redis pod runs the current template")
		s.conds.Announce(false, v1beta1.EventPodsRolloutFinished, "Rollout", "Every Redis pod restarted onto its new template in %s", took)
	} else {
		s.conds.Set(v1beta1.ConditionRolloutProgressing, metav1.ConditionFalse, v1beta1.ReasonRolloutComplete,
			"Every consumer runs credential "+ro.TargetVersion)
		s.conds.Announce(false, v1beta1.EventRotationFinished, "Rollout", "Credential %s rolled out in %s", ro.TargetVersion, took)
	}
	if meta.FindStatusCondition(s.rc.Status.Conditions, v1beta1.ConditionRolloutHealthy) != nil {
		s.conds.Set(v1beta1.ConditionRolloutHealthy, metav1.ConditionTrue, v1beta1.ReasonRolloutComplete, "The rollout is complete")
	}
	log.FromContext(ctx).Info("Rollout finished", "version", ro.TargetVersion, "cause", ro.Cause, "duration", took)
}

// rollPods restarts the Redis pods that do not run what is wanted, one at a time: replicas first
// (highest ordinal first), the primary last, after it has handed its role to an in-sync replica;
// the next only once the one in flight is Ready and in sync with the primary, and every other pod
// is Ready.
func (r *Engine) rollPods(ctx context.Context, s *step, pods []*corev1.Pod, ro *v1beta1.RolloutStatus) (bool, time.Duration, error) {
	if p := s.unreadyCurrent(pods); ro.PodInFlight == "" && p != nil {
		// A restart whose record was lost (its status write conflicted): take it up again, timed
		// from the new pod's creation, so that a pod that never becomes Ready still stalls the rollout.
		ro.PodInFlight, ro.PodRestartedAt = p.Name, status.At(p.CreationTimestamp.Time)
	}
	if ro.PodInFlight != "" {
		if settled, wait, err := r.podSettled(ctx, s, pods, ro); !settled || err != nil {
			return false, wait, err
		}
	}
	ro.PodsUpdated = int32(s.countCurrent(pods, true))
	next := s.nextPod(pods)
	if next == nil {
		return ro.PodsUpdated >= s.rc.Spec.Replicas, time.Second, nil
	}
	// Make before break, whatever status.rollout says (it may be read from a cache that lags):
	// restart a pod only while every pod exists and every other pod is Ready.
	if len(pods) < int(s.rc.Spec.Replicas) {
		return false, 0, nil // a pod watch wakes the reconcile when the pod is back
	}
	for _, p := range pods {
		if p != next && !podReady(p) {
			return false, 0, nil
		}
	}
	// The StatefulSet controller recreates the pod from the template it has seen last: wait until
	// it has seen the current one, or the pod comes back on the old one.
	if seen, err := r.templateObserved(ctx, s.rc); !seen || err != nil {
		return false, lagWait, err
	}
	if next.Name == s.rc.Status.Primary && len(pods) > 1 {
		kept := func(p *corev1.Pod) bool { return ordinal(p) < int(s.rc.Spec.Replicas) }
		moved, why, err := r.Primary.HandOver(ctx, s.cluster, kept, s.want.current)
		if err != nil {
			return false, 0, fmt.Errorf("handing the primary role of %s over: %w", next.Name, err)
		}
		if !moved {
			msg := "Waiting to restart the primary " + next.Name + ": " + why
			if s.conds.Set(v1beta1.ConditionRolloutHealthy, metav1.ConditionFalse, v1beta1.ReasonRolloutStalled, msg) {
				s.conds.Announce(true, v1beta1.EventRolloutStalled, "Rollout", "%s", msg)
			}
			return false, 5 * time.Second, nil
		}
	}
	if err := r.Client.Delete(ctx, next, client.Preconditions{UID: &next.UID}); client.IgnoreNotFound(err) != nil {
		return false, 0, fmt.Errorf("restarting pod %s: %w", next.Name, err)
	}
	ro.PodInFlight, ro.PodRestartedAt = next.Name, status.At(r.Clock.Now())
	s.conds.Event(false, v1beta1.EventPodRestarted, "Rollout", "Restarted pod %s (%s)", next.Name, s.why(ro))
	log.FromContext(ctx).Info("Pod restarted", "pod", next.Name, "version", ro.TargetVersion, "cause", ro.Cause)
	stoppoint.Reached(stoppoint.MidRollout, s.rc.Namespace)
	return false, readinessTimeout(s.rc), nil
}

// why says what a pod is restarted for.
func (s *step) why(ro *v1beta1.RolloutStatus) string {
	if ro.Cause == v1beta1.RolloutForPodTemplate {
		return "new pod template " + s.want.template
	}
	return "credential " + ro.TargetVersion
}

// templateObserved says whether the StatefulSet controller has observed the StatefulSet's current
// spec (read past the cache).
func (r *Engine) templateObserved(ctx context.Context, rc *v1beta1.RedisCluster) (bool, error) {
	sts := &appsv1.StatefulSet{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name}, sts); err != nil {
		return false, fmt.Errorf("reading StatefulSet %s: %w", rc.Name, err)
	}
	return sts.Status.ObservedGeneration >= sts.Generation, nil
}

// podSettled says whether the pod in flight is back, Ready and in sync with the primary, on what
// is wanted. When it takes longer than the readiness timeout, the rollout stalls (Degraded) and
// touches no further pod; it resumes by itself when the pod becomes Ready.
func (r *Engine) podSettled(ctx context.Context, s *step, pods []*corev1.Pod, ro *v1beta1.RolloutStatus) (bool, time.Duration, error) {
	for _, p := range pods {
		if p.Name != ro.PodInFlight || !s.want.current(p) || !podReady(p) {
			continue
		}
		inSync, err := r.Primary.InSync(ctx, s.cluster, p.Name)
		if err != nil {
			return false, time.Second, err
		}
		if !inSync {
			break
		}
		ro.PodInFlight, ro.PodRestartedAt = "", nil
		if c := meta.FindStatusCondition(s.rc.Status.Conditions, v1beta1.ConditionRolloutHealthy); c != nil && c.Reason == v1beta1.ReasonRolloutStalled {
			s.conds.Set(v1beta1.ConditionRolloutHealthy, metav1.ConditionTrue, v1beta1.ReasonRolloutInProgress, "Pod "+p.Name+" is Ready again; the rollout goes on")
		}
		return true, 0, nil
	}
	deadline := status.Of(ro.PodRestartedAt).Add(readinessTimeout(s.rc))
	if left := deadline.Sub(r.Clock.Now()); left > 0 {
		return false, min(left, time.Second), nil // the replica's sync is not watched: look again soon
	}
	msg := fmt.Sprintf("Pod %s is not Ready and in sync with the primary (%s) after %s; no further pod is restarted until it is", ro.PodInFlight, s.why(ro), readinessTimeout(s.rc))
	if s.conds.Set(v1beta1.ConditionRolloutHealthy, metav1.ConditionFalse, v1beta1.ReasonRolloutStalled, msg) {
		s.conds.Announce(true, v1beta1.EventRolloutStalled, "Rollout", "%s", msg)
	}
	return false, time.Minute, nil
}

// readinessTimeout is spec.rollout.readinessTimeout, or its default.
func readinessTimeout(rc *v1beta1.RedisCluster) time.Duration {
	if t := rc.Spec.Rollout.ReadinessTimeout; t != nil {
		return t.Duration
	}
	return defaultReadinessTimeout
}

// kept are the cluster's pods that spec.replicas keeps: those of a higher ordinal are on their
// way out with a scale-down, and are neither restarted nor waited for.
func kept(rc *v1beta1.RedisCluster, all []*corev1.Pod) []*corev1.Pod {
	var pods []*corev1.Pod
	for _, p := range all {
		if ordinal(p) < int(rc.Spec.Replicas) {
			pods = append(pods, p)
		}
	}
	return pods
}

// unreadyCurrent is a pod that runs what is wanted and is not Ready (yet).
func (s *step) unreadyCurrent(pods []*corev1.Pod) *corev1.Pod {
	for _, p := range pods {
		if s.want.current(p) && !podReady(p) {
			return p
		}
	}
	return nil
}

// nextPod is the next pod to restart: one that does not run what is wanted (and is not being
// deleted), replicas from the highest ordinal down, the primary last.
func (s *step) nextPod(pods []*corev1.Pod) *corev1.Pod {
	var stale []*corev1.Pod
	for _, p := range pods {
		if !s.want.current(p) && p.DeletionTimestamp.IsZero() {
			stale = append(stale, p)
		}
	}
	slices.SortFunc(stale, func(a, b *corev1.Pod) int { return restartOrder(s.rc, b) - restartOrder(s.rc, a) })
	if len(stale) == 0 {
		return nil
	}
	return stale[0]
}

// restartOrder ranks a pod for a restart: the highest first, the primary last.
func restartOrder(rc *v1beta1.RedisCluster, p *corev1.Pod) int {
	if p.Name == rc.Status.Primary {
		return -1
	}
	return ordinal(p)
}

// podReady says whether the pod is there, Ready and not terminating.
func podReady(p *corev1.Pod) bool { return p != nil && p.DeletionTimestamp.IsZero() && podIsReady(p) }

// countCurrent counts the pods that run what is wanted (and are Ready, with ready).
func (s *step) countCurrent(pods []*corev1.Pod, ready bool) int {
	n := 0
	for _, p := range pods {
		if s.want.current(p) && (!ready || podReady(p)) {
			n++
		}
	}
	return n
}

// settled says whether no pod needs a restart when nothing a credential replaced is left: each
// runs the current template and, with rollout.redisPods Restart, the credential version or none
// (it started before any credential existed: the Redis objects come before the credential, or
// rollout.redisPods was Live). Such a pod got the credential's user live, as every pod does in
// Live mode; the next rotation restarts it.
func (s *step) settled(pods []*corev1.Pod) bool {
	for _, p := range pods {
		if s.want.templateDue(p) {
			return false
		}
		if v := p.Annotations[v1beta1.AnnotationCredentialVersion]; s.want.restarts && v != "" && v != s.want.version {
			return false
		}
	}
	return true
}
