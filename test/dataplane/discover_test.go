package dataplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// consumerPodWatch follows the consumer pods of a namespace and records, at each moment a pod
// began to terminate, the live pods (not terminating) that were not Ready then, and the lowest
// count of Ready live pods of each workload.
type consumerPodWatch struct {
	mu       sync.Mutex
	pods     map[string]*corev1.Pod
	breaks   []string // "pod X terminated while Y was not Ready"
	deleted  []deletion
	minReady map[string]int
	w        watch.Interface
}

type deletion struct {
	pod string
	at  time.Time
}

func watchConsumerPods(t *testing.T, ns string, apps ...string) *consumerPodWatch {
	t.Helper()
	w, err := fw.Clientset.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: "app in (" + strings.Join(apps, ",") + ")"})
	if err != nil {
		t.Fatal(err)
	}
	cw := &consumerPodWatch{pods: map[string]*corev1.Pod{}, minReady: map[string]int{}, w: w}
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Error {
				cw.saw(p, ev.Type == watch.Deleted)
			}
		}
	}()
	t.Cleanup(w.Stop)
	return cw
}

func (cw *consumerPodWatch) saw(p *corev1.Pod, gone bool) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	was := cw.pods[p.Name]
	if gone {
		delete(cw.pods, p.Name)
	} else {
		cw.pods[p.Name] = p.DeepCopy()
	}
	if !p.DeletionTimestamp.IsZero() && (was == nil || was.DeletionTimestamp.IsZero()) && !gone {
		cw.deleted = append(cw.deleted, deletion{pod: p.Name, at: time.Now()})
		for _, o := range cw.pods {
			if o.Name != p.Name && o.DeletionTimestamp.IsZero() && !framework.PodReady(o) {
				cw.breaks = append(cw.breaks, fmt.Sprintf("pod %s began to terminate while %s was not Ready", p.Name, o.Name))
			}
		}
	}
	ready := map[string]int{}
	for _, o := range cw.pods {
		if o.DeletionTimestamp.IsZero() && framework.PodReady(o) {
			ready[o.Labels["app"]]++
		}
	}
	for app := range cw.minReady {
		cw.minReady[app] = min(cw.minReady[app], ready[app])
	}
}

// start records the Ready counts from now on (after the consumers came up).
func (cw *consumerPodWatch) start(apps ...string) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	for _, app := range apps {
		n := 0
		for _, o := range cw.pods {
			if o.Labels["app"] == app && o.DeletionTimestamp.IsZero() && framework.PodReady(o) {
				n++
			}
		}
		cw.minReady[app] = n
	}
}

// TestDiscoveredConsumersAreRolled: with rollout.discoverConsumers, a Deployment that takes the
// credential from env variables and a StatefulSet that mounts it, neither listed, are restarted
// at a rotation, one pod at a time, each pod only while every other consumer pod is Ready, the
// StatefulSet after the Deployment, with no failed client command; a CronJob that references the
// Secret is listed in status.consumers and never touched.
func TestDiscoveredConsumersAreRolled(t *testing.T) {
	ns := fw.Namespace(t, "discover")
	vc := fw.VaultConnection(t, "vault-discover", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), func(rc *v1alpha1.RedisCluster) { rc.Spec.Rollout.DiscoverConsumers = true })
	rc = fw.WaitReady(t, rc, 3*time.Minute)
	oldUser, oldPass, _ := fw.Credentials(rc)
	oldLease := rc.Status.Credential.LeaseID

	cw := watchConsumerPods(t, ns, "api", "worker")
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
	cw.start("api", "worker")

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
		if c.Via != v1alpha1.ConsumerDiscovered || !slices.Contains(c.References, ref) || c.Restarted != (c.Kind != "CronJob") {
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
			if v := p.Annotations[v1alpha1.AnnotationCredentialVersion]; p.DeletionTimestamp.IsZero() && v != cur.Status.Credential.Version {
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
	events := fw.WaitClusterEvents(t, ns, rc.Name, 10*time.Second, v1alpha1.EventConsumersDiscovered)
	if i := slices.IndexFunc(events, func(e eventsv1.Event) bool { return e.Reason == v1alpha1.EventConsumersDiscovered }); i < 0 || !strings.Contains(events[i].Note, "CronJob/nightly") {
		t.Errorf("no ConsumersDiscovered event naming CronJob/nightly")
	}

	cw.mu.Lock()
	breaks, deleted, minReady := slices.Clone(cw.breaks), slices.Clone(cw.deleted), cw.minReady
	cw.mu.Unlock()
	for _, b := range breaks {
		t.Error(b)
	}
	var order []string
	lastAPI, firstWorker := time.Time{}, time.Time{}
	for _, d := range deleted {
		order = append(order, d.pod)
		if strings.HasPrefix(d.pod, "api-") {
			lastAPI = d.at
		} else if firstWorker.IsZero() {
			firstWorker = d.at
		}
	}
	if len(deleted) != 4 || lastAPI.IsZero() || firstWorker.IsZero() || firstWorker.Before(lastAPI) {
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
