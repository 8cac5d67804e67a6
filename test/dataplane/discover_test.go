package dataplane

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// TestDiscoveredConsumersAreRolled: with rollout.discoverConsumers, a Deployment that takes the
// credential from env variables and a StatefulSet that mounts it, neither listed, are restarted
// at a rotation, one pod at a time, each pod only while every other consumer pod is Ready, the
// StatefulSet after the Deployment, with no failed client command; a CronJob that references the
// Secret is listed in status.consumers and never touched.
func TestDiscoveredConsumersAreRolled(t *testing.T) {
	ns := fw.Namespace(t, "discover")
	vc := fw.VaultConnection(t, "vault-discover", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), func(rc *v1beta1.RedisCluster) { rc.Spec.Rollout.DiscoverConsumers = true })
	rc = fw.WaitReady(t, rc, 3*time.Minute)
	oldUser, oldPass, _ := fw.Credentials(rc)
	oldLease := rc.Status.Credential.Lease.LeaseID

	cw := fw.WatchPods(t, ns, "app in (api,worker)")
	api := fw.StartConsumers(t, ns, "api", 2, "cache:6379", "cache-credentials", framework.CredentialFromEnv("cache-credentials"))
	worker := fw.StartConsumerSet(t, ns, "worker", 2, "cache:6379", "cache-credentials")
	nightly := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nightly"}, Spec: batchv1.CronJobSpec{
		Schedule: "0 3 1 1 *", Suspend: ptr.To(true),
		JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "report", Image: testground.ConsumerImage, EnvFrom: []corev1.EnvFromSource{
				{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cache-credentials"}}}}}},
		}}}},
	}}
	fw.Create(t, nightly)
	cw.CountReady("app")

	fw.RotateNow(t, rc)
	rotated := time.Now()
	cur := fw.WaitRolledOut(t, rc, oldLease, 5*time.Minute)
	took := time.Since(rotated)
	fw.CheckRetired(t, rc, "api", oldUser, oldPass, oldLease)

	want := map[string]string{"Deployment/api": "env REDIS_USERNAME of container consumer", "StatefulSet/worker": "volume credentials", "CronJob/nightly": "envFrom of container report"}
	for _, c := range cur.Status.Consumers {
		key := c.Kind + "/" + c.Name
		ref, ok := want[key]
		if !ok {
			t.Errorf("status.consumers lists %s, which does not reference the Secret", key)
			continue
		}
		delete(want, key)
		if c.Via != v1beta1.ConsumerDiscovered || !slices.Contains(c.References, ref) || c.Restarted != (c.Kind != "CronJob") {
			t.Errorf("status.consumers: %+v; want via Discovered, references with %q, restarted unless a CronJob", c, ref)
		}
	}
	if len(want) > 0 {
		t.Errorf("status.consumers %+v lacks %v", cur.Status.Consumers, want)
	}
	for _, app := range []string{"api", "worker"} {
		pods := &corev1.PodList{}
		if err := fw.Client.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{"app": app}); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if v := p.Annotations[v1beta1.AnnotationCredentialVersion]; p.DeletionTimestamp.IsZero() && v != cur.Status.Credential.Version {
				t.Errorf("pod %s runs credential %q, want %s", p.Name, v, cur.Status.Credential.Version)
			}
		}
	}
	if err := fw.Client.Get(context.Background(), client.ObjectKeyFromObject(nightly), nightly); err != nil {
		t.Fatal(err)
	}
	if a := nightly.Spec.JobTemplate.Spec.Template.Annotations; len(a) > 0 {
		t.Errorf("the CronJob was touched: %v", a)
	}
	events := fw.WaitClusterEvents(t, ns, rc.Name, 10*time.Second, v1beta1.EventConsumersDiscovered)
	if i := slices.IndexFunc(events, func(e eventsv1.Event) bool { return e.Reason == v1beta1.EventConsumersDiscovered }); i < 0 || !strings.Contains(events[i].Note, "CronJob/nightly") {
		t.Errorf("no ConsumersDiscovered event naming CronJob/nightly")
	}

	terms, minReady := cw.Terminations(), cw.FewestReady()
	var order []string
	lastAPI, firstWorker := time.Time{}, time.Time{}
	for _, d := range terms {
		order = append(order, d.Pod)
		if others := d.LiveNotReady(); len(others) > 0 {
			t.Errorf("pod %s began to terminate while %v were not Ready", d.Pod, others)
		}
		if strings.HasPrefix(d.Pod, "api-") {
			lastAPI = d.At
		} else if firstWorker.IsZero() {
			firstWorker = d.At
		}
	}
	if len(terms) != 4 || lastAPI.IsZero() || firstWorker.IsZero() || firstWorker.Before(lastAPI) {
		t.Errorf("pods ended in order %v; want the two of api, then the two of worker", order)
	}
	if minReady["api"] < 2 || minReady["worker"] < 1 {
		t.Errorf("fewest Ready pods during the rollout: %v; want api never below 2 (it surges), worker never below 1", minReady)
	}
	for name, c := range map[string]*framework.Consumers{"api": api, "worker": worker} {
		ok, failed, failures := c.Totals()
		if failed > 0 || ok == 0 {
			t.Errorf("consumer %s: %d commands, %d failed: %v", name, ok, failed, failures)
		}
	}
	t.Logf("rotation rolled out in %s over the discovered consumers; pods ended in order %v; fewest Ready %v", took.Round(100*time.Millisecond), order, minReady)
}
