package rediscluster

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/rotation"
)

// A keyroll upgrade restarts no Redis pod by itself. A pod's template hash leaves the probe
// sidecar's image out (keyroll changes it in place, probes.go), and each template carries the
// data-plane contract it was rendered under (render.DataPlaneVersion): a pod whose template
// differs under the same contract was made from an older spec, and is restarted at once, as the
// owner's change asks; one of an older contract waits for the maintenance window or the owner's
// ask (keyroll.dev/upgrade-data-plane); one of a newer contract belongs to a newer keyroll and is
// left alone unless the owner asks (after a rollback), so that two versions of the manager never
// roll pods back and forth. The StatefulSet itself is OnDelete: whichever keyroll writes it, no
// pod restarts for it.

// legacyDataPlane is the contract of pods without a data-plane annotation: keyroll v0.1.0's.
const legacyDataPlane = 1

// podFit is how a Redis pod stands against the template keyroll renders now.
type podFit int

const (
	// fitCurrent: it runs the current template (or a newer keyroll's).
	fitCurrent podFit = iota
	// fitSpec: it was made from an older spec under the same data plane; restarted now.
	fitSpec
	// fitDataPlane: it runs an older data plane; restarted in the window, or when asked.
	fitDataPlane
	// fitNewer: a newer keyroll made it; restarted onto this keyroll's only when asked.
	fitNewer
)

// dataPlaneOf is the data-plane contract p was made under, and whether p says so (keyroll v0.1.0's
// pods do not).
func dataPlaneOf(p *corev1.Pod) (int, bool) {
	v, ok := p.Annotations[v1beta1.AnnotationDataPlane]
	if !ok {
		return legacyDataPlane, false
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return legacyDataPlane, true // not keyroll's value: an older contract, restarted in the window
	}
	return n, true
}

// fit says how p stands against the template rendered now.
func (w podWant) fit(p *corev1.Pod) podFit {
	got := p.Annotations[v1beta1.AnnotationPodTemplate]
	if got == w.template {
		return fitCurrent
	}
	dp, said := dataPlaneOf(p)
	switch {
	case dp > render.DataPlaneVersion:
		return fitNewer
	case !said && got == w.legacyHash(render.ProbeImage(p.Spec)):
		return fitCurrent // made by keyroll v0.1.0 from what would be rendered now
	case dp < render.DataPlaneVersion:
		return fitDataPlane
	}
	return fitSpec
}

// legacyHash is the hash keyroll v0.1.0 wrote for the template rendered now with probeImage,
// computed once per image in a Roll (w.legacy): every check of every v0.1.0 pod asks for it.
func (w podWant) legacyHash(probeImage string) string {
	if h, ok := w.legacy[probeImage]; ok {
		return h
	}
	h := render.LegacyPodTemplateHash(w.tmpl, probeImage)
	if w.legacy != nil {
		w.legacy[probeImage] = h
	}
	return h
}

// dataPlaneGate says whether pods of an older data plane are restarted in this reconcile: when
// the owner asks (keyroll.dev/upgrade-data-plane), or inside the maintenance window, except with
// one replica and no storage, whose restart loses the data: that takes the owner's ask.
func dataPlaneGate(rc *v1beta1.RedisCluster, window *rotation.Window, now time.Time) bool {
	if rc.DataPlaneUpgradeAsked() {
		return true
	}
	if rc.Spec.Replicas == 1 && rc.Spec.Storage == nil {
		return false
	}
	return window != nil && window.Contains(now)
}

// reportDataPlane says which Redis pods run an older data plane than this keyroll's, and when they
// are restarted: a condition (only while something is pending, and its withdrawal: a cluster with
// nothing pending gets no new condition from an upgrade), an event when it is first pending, and
// the metric. An ask is acknowledged once no pod is left on an older data plane. wait is when the
// window opens, for a change that waits for it.
func (r *Engine) reportDataPlane(s *step, pods []*corev1.Pod, window *rotation.Window) (wait time.Duration) {
	rc := s.rc
	oldest, n, newest, newer := render.DataPlaneVersion, 0, 0, 0
	for _, p := range pods {
		switch dp, _ := dataPlaneOf(p); s.want.fit(p) {
		case fitDataPlane:
			n, oldest = n+1, min(oldest, dp)
		case fitNewer:
			newer, newest = newer+1, max(newest, dp)
		}
	}
	r.Metrics.SetDataPlanePods(client.ObjectKeyFromObject(rc), n)
	if newer > 0 && !rc.DataPlaneUpgradeAsked() {
		s.conds.Set(v1beta1.ConditionDataPlaneCurrent, metav1.ConditionFalse, v1beta1.ReasonNewerDataPlane, fmt.Sprintf(
			"%d Redis pods run data plane %d, which a newer keyroll made; this one renders %d and leaves them as they are (to restart them onto it, after a rollback: kubectl annotate redisclusters %s %s=<a new value>)",
			newer, newest, render.DataPlaneVersion, rc.Name, v1beta1.AnnotationUpgradeDataPlane))
		return 0
	}
	if n+newer == 0 {
		if rc.DataPlaneUpgradeAsked() {
			rc.Status.DataPlaneUpgradeAcknowledged = rc.DataPlaneUpgradeRequest()
		}
		if c := meta.FindStatusCondition(rc.Status.Conditions, v1beta1.ConditionDataPlaneCurrent); c != nil {
			s.conds.Set(v1beta1.ConditionDataPlaneCurrent, metav1.ConditionTrue, v1beta1.ReasonRolloutComplete,
				fmt.Sprintf("Every Redis pod runs data plane %d", render.DataPlaneVersion))
		}
		return 0
	}
	change := fmt.Sprintf("%d Redis pods run data plane %d; this keyroll renders data plane %d (%s)", n, oldest, render.DataPlaneVersion, dataPlaneChanges(oldest))
	if newer > 0 {
		change = fmt.Sprintf("%d Redis pods run a newer keyroll's data plane %d; this keyroll renders data plane %d", n+newer, newest, render.DataPlaneVersion)
	}
	if s.want.dataPlaneNow {
		s.conds.Set(v1beta1.ConditionDataPlaneCurrent, metav1.ConditionFalse, v1beta1.ReasonRolloutInProgress,
			change+": restarting them now, replicas first, the primary last")
		return 0
	}
	var when string
	switch now := r.Clock.Now(); {
	case rc.Spec.Replicas == 1 && rc.Spec.Storage == nil:
		when = "only when the owner asks, as the one replica has no storage and its data is lost when it restarts"
	case window == nil:
		when = "when the owner asks, or in a maintenance window once spec.rotation.maintenanceWindow sets one"
	default:
		opens := window.NextOpen(now)
		when = "in the maintenance window (" + window.String() + "), next at " + opens.UTC().Format(time.RFC3339)
		wait = opens.Sub(now) + time.Second
	}
	msg := change + ": they are restarted " + when + "; to restart them now: kubectl annotate redisclusters " + rc.Name +
		" " + v1beta1.AnnotationUpgradeDataPlane + "=<a new value>"
	if s.conds.Set(v1beta1.ConditionDataPlaneCurrent, metav1.ConditionFalse, v1beta1.ReasonRestartPending, msg) {
		s.conds.Announce(false, v1beta1.EventDataPlaneChangePending, "Upgrade", "%s", msg)
	}
	return wait
}

// dataPlaneChanges says what the data planes after from changed.
func dataPlaneChanges(from int) string {
	var says []string
	for v := from + 1; v <= render.DataPlaneVersion; v++ {
		if c := render.DataPlaneChanges[v]; c != "" {
			says = append(says, fmt.Sprintf("%d: %s", v, c))
		}
	}
	if len(says) == 0 {
		return "its start script, probes and sidecar flags"
	}
	return strings.Join(says, "; ")
}
