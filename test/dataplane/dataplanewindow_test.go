package dataplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// A data-plane change, as an upgrade to a keyroll with a newer data-plane contract finds the pods
// (here: the running pods marked as an older contract's, which restarts none of them), is reported
// at once and applied only when the cluster's maintenance window opens: not one pod restarts
// before, then all of them, replicas first, the primary last after a hand-over. No acknowledged
// write is lost; the consumers' failed commands and longest outage are measured.
func TestDataPlaneChangeWaitsForTheMaintenanceWindow(t *testing.T) {
	ns := fw.Namespace(t, "dpwindow")
	vc := fw.VaultConnection(t, "vault-dpwindow", framework.Allow(ns))
	// The window opens at a whole minute at least three minutes away (the cluster comes up
	// meanwhile), in UTC, for half an hour.
	opens := time.Now().UTC().Truncate(time.Minute).Add(4 * time.Minute)
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("app"),
		func(rc *v1beta1.RedisCluster) {
			rc.Spec.Rotation.MaintenanceWindow = &v1beta1.MaintenanceWindow{Start: opens.Format("15:04"), Duration: metav1.Duration{Duration: 30 * time.Minute}}
		})
	rc = fw.WaitReady(t, rc, 3*time.Minute)
	user, pass, _ := fw.Credentials(rc)
	pods := fw.RedisPods(t, rc)
	writeKeys(t, framework.PodAddr(&pods[0]), user, pass, keys)
	app := fw.StartConsumers(t, ns, "app", 2, "cache:6379", "cache-credentials")
	rw := watchRestarts(t, rc)
	_, failedBefore, _ := app.Totals()

	for _, p := range pods {
		patch := client.MergeFrom(p.DeepCopy())
		p.Annotations[v1beta1.AnnotationDataPlane] = "0"
		p.Annotations[v1beta1.AnnotationPodTemplate] = "an-older-keyrolls-template"
		if err := fw.Client.Patch(context.Background(), &p, patch); err != nil {
			t.Fatal(err)
		}
	}
	marked := time.Now()
	framework.Eventually(t, time.Minute, func() string {
		c := meta.FindStatusCondition(fw.Get(t, rc).Status.Conditions, v1beta1.ConditionDataPlaneCurrent)
		if c == nil || c.Reason != v1beta1.ReasonRestartPending {
			return fmt.Sprintf("condition DataPlaneCurrent %+v", c)
		}
		return ""
	})
	reported := time.Since(marked)
	fw.WaitClusterEvents(t, ns, rc.Name, 10*time.Second, v1beta1.EventDataPlaneChangePending)
	if !time.Now().Before(opens) {
		t.Fatalf("the window (%s) opened before the change could be seen waiting for it", opens.Format("15:04"))
	}
	for time.Now().Before(opens) {
		if r := rw.Terminations(); len(r) > 0 {
			t.Fatalf("pod %s restarted at %s, before the window opens at %s", r[0].Pod, r[0].At.Format(time.TimeOnly), opens.Format(time.TimeOnly))
		}
		time.Sleep(time.Second)
	}

	var final *v1beta1.RedisCluster
	framework.Eventually(t, 8*time.Minute, func() string {
		final = fw.Get(t, rc)
		c := meta.FindStatusCondition(final.Status.Conditions, v1beta1.ConditionDataPlaneCurrent)
		if final.Status.Rollout != nil || len(rw.Terminations()) < 3 || c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("rollout %+v, %d pods restarted, condition %+v", final.Status.Rollout, len(rw.Terminations()), c)
		}
		return ""
	})
	restarts := rw.Terminations()
	var order []string
	for _, r := range restarts {
		order = append(order, r.Pod)
		if r.At.Before(opens) {
			t.Errorf("%s restarted at %s, before the window", r.Pod, r.At.Format(time.TimeOnly))
		}
	}
	if want := []string{"cache-2", "cache-1", "cache-0"}; !slices.Equal(order, want) {
		t.Errorf("restart order %v, want %v", order, want)
	}
	for _, p := range fw.RedisPods(t, final) {
		if got := countKeys(t, framework.PodAddr(&p), user, pass, keys); got != keys {
			t.Errorf("%s has %d of %d keys after the data-plane change", p.Name, got, keys)
		}
	}
	app.Halt()
	ok, failed, lastErrors := app.Totals()
	var longest, lost int64
	for _, s := range app.Stats() {
		longest, lost = max(longest, s.LongestOutageMs), lost+s.LostWrites
	}
	t.Logf("change reported %s after the pods were marked; none restarted before the window (%s); then %v at %v; consumers: %d ok, %d failed, longest outage %d ms, %d lost writes; errors %v",
		reported.Round(100*time.Millisecond), opens.Format(time.TimeOnly), order, restartTimes(restarts, opens), ok, failed-failedBefore, longest, lost, lastErrors)
	if lost != 0 {
		t.Errorf("%d acknowledged writes were lost", lost)
	}
	if longest > 10000 {
		t.Errorf("the consumers' longest outage was %d ms: want one reconnect at the hand-over (bound 10 s)", longest)
	}
}

// TestSingleReplicaWithoutStorageIsNotRestarted: a data-plane change on a cluster of one replica
// without storage, whose restart would lose its data, is reported and not applied, even inside an
// open maintenance window; the owner's ask (the upgrade-data-plane annotation) applies it.
func TestSingleReplicaWithoutStorageIsNotRestarted(t *testing.T) {
	ns := fw.Namespace(t, "dpsingle")
	vc := fw.VaultConnection(t, "vault-dpsingle", framework.Allow(ns))
	opened := time.Now().UTC().Truncate(time.Minute)
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rotation.MaintenanceWindow = &v1beta1.MaintenanceWindow{Start: opened.Format("15:04"), Duration: metav1.Duration{Duration: time.Hour}}
	})
	rc = fw.WaitReady(t, rc, 3*time.Minute)
	if rc.Spec.Replicas != 1 || rc.Spec.Storage != nil {
		t.Fatalf("replicas %d, storage %+v: want one replica without storage", rc.Spec.Replicas, rc.Spec.Storage)
	}
	rw := watchRestarts(t, rc)
	p := fw.RedisPods(t, rc)[0]
	patch := client.MergeFrom(p.DeepCopy())
	p.Annotations[v1beta1.AnnotationDataPlane] = "0"
	p.Annotations[v1beta1.AnnotationPodTemplate] = "an-older-keyrolls-template"
	if err := fw.Client.Patch(context.Background(), &p, patch); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, func() string {
		c := meta.FindStatusCondition(fw.Get(t, rc).Status.Conditions, v1beta1.ConditionDataPlaneCurrent)
		if c == nil || c.Reason != v1beta1.ReasonRestartPending || !strings.Contains(c.Message, "only when the owner asks") {
			return fmt.Sprintf("condition DataPlaneCurrent %+v", c)
		}
		return ""
	})
	fw.WaitClusterEvents(t, ns, rc.Name, 10*time.Second, v1beta1.EventDataPlaneChangePending)
	// The window is open: a cluster with a hand-over would be restarting now. Touch the cluster
	// meanwhile, so that it is reconciled again and again.
	for i := range 6 {
		fw.Annotate(t, rc, "test.keyroll.dev/touch", fmt.Sprint(i))
		time.Sleep(5 * time.Second)
	}
	if r := rw.Terminations(); len(r) > 0 {
		t.Fatalf("pod %s restarted without the owner's ask: %+v", r[0].Pod, r)
	}
	if got := fw.RedisPods(t, rc)[0]; got.UID != p.UID {
		t.Fatalf("the pod was replaced (%s, was %s)", got.UID, p.UID)
	}

	fw.Annotate(t, rc, v1beta1.AnnotationUpgradeDataPlane, "now")
	asked := time.Now()
	framework.Eventually(t, 3*time.Minute, func() string {
		cur := fw.Get(t, rc)
		c := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionDataPlaneCurrent)
		if len(rw.Terminations()) != 1 || c == nil || c.Status != metav1.ConditionTrue || cur.Status.DataPlaneUpgradeAcknowledged != "now" {
			return fmt.Sprintf("%d restarts, condition %+v, acknowledged %q", len(rw.Terminations()), c, cur.Status.DataPlaneUpgradeAcknowledged)
		}
		return ""
	})
	t.Logf("pending and not applied for 30 s inside an open window; restarted once %s after the owner asked", time.Since(asked).Round(100*time.Millisecond))
}
