package dataplane

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// probeRun is what a Redis pod runs: the pod, its Redis container and its probe sidecar.
type probeRun struct {
	uid, redis, probe string
	redisRestarts     int32
}

func probeRunOf(p *corev1.Pod) probeRun {
	r := probeRun{uid: string(p.UID)}
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == "redis" {
			r.redis, r.redisRestarts = c.ContainerID, c.RestartCount
		}
	}
	for _, c := range p.Status.InitContainerStatuses {
		if c.Name == render.ProbeContainerName && c.State.Running != nil {
			r.probe = c.ContainerID
		}
	}
	return r
}

// A new probe image, as a keyroll upgrade that keeps the data plane brings (another tag of the
// same content here), goes onto the running Redis pods in place: the kubelet restarts each pod's
// probe sidecar and nothing else, one pod at a time, replicas first and the primary last. Every
// Redis container keeps its container ID and restart count, no pod is replaced, and the consumers,
// connected through the client Service all along, see no failed command.
func TestNewProbeImageGoesOnThePodsInPlace(t *testing.T) {
	ns := fw.Namespace(t, "probeswap")
	vc := fw.VaultConnection(t, "vault-probeswap", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(3), framework.WithConsumers("app"))
	rc = fw.WaitReady(t, rc, 3*time.Minute)
	app := fw.StartConsumers(t, ns, "app", 2, "cache:6379", "cache-credentials")
	before := map[string]probeRun{}
	for _, p := range fw.RedisPods(t, rc) {
		before[p.Name] = probeRunOf(&p)
		if before[p.Name].probe == "" || render.ProbeImage(p.Spec) != testground.ProbeImage {
			t.Fatalf("pod %s: probe sidecar %q from %s before the change", p.Name, before[p.Name].probe, render.ProbeImage(p.Spec))
		}
	}
	swapped := "localhost/keyroll/keyroll-probe:swapped"
	if err := fw.Ground.Node.TagImage(testground.ProbeImage, swapped); err != nil {
		t.Fatal(err)
	}
	ready := fw.WatchPods(t, ns, v1beta1.LabelCluster+"="+rc.Name)
	_, failedBefore, _ := app.Totals()

	start := time.Now()
	fw.StopOperator()
	opts := *fw.Config.Operator
	opts.ProbeImage = swapped
	if err := fw.StartOperator(opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.StopOperator(); fw.RestartOperator(t) })
	framework.Eventually(t, 3*time.Minute, func() string {
		for _, p := range fw.RedisPods(t, rc) {
			now := probeRunOf(&p)
			if render.ProbeImage(p.Spec) != swapped || now.probe == "" || now.probe == before[p.Name].probe || !framework.PodReady(&p) {
				return fmt.Sprintf("pod %s: probe image %s, sidecar %q (was %q), Ready %v", p.Name, render.ProbeImage(p.Spec), now.probe, before[p.Name].probe, framework.PodReady(&p))
			}
		}
		return ""
	})
	took := time.Since(start)
	time.Sleep(5 * time.Second) // the consumers' counters catch up

	for _, p := range fw.RedisPods(t, rc) {
		was, now := before[p.Name], probeRunOf(&p)
		if now.uid != was.uid || now.redis != was.redis || now.redisRestarts != was.redisRestarts {
			t.Errorf("pod %s: uid %s, Redis container %s restarted %d times; before: %s, %s, %d", p.Name, now.uid, now.redis, now.redisRestarts, was.uid, was.redis, was.redisRestarts)
		}
	}
	if ok, failed, failures := app.Totals(); failed != failedBefore {
		t.Errorf("consumers: %d commands failed while the probes changed (%d ok):\n%v", failed-failedBefore, ok, failures)
	}
	var order []string
	for _, e := range fw.ClusterEvents(t, ns, rc.Name) {
		if e.Reason == v1beta1.EventProbeSidecarUpdated && e.Related != nil {
			order = append(order, e.Related.Name)
		}
	}
	if want := []string{"cache-2", "cache-1", "cache-0"}; !slices.Equal(order, want) {
		t.Errorf("probe sidecars changed in the order %v, want %v", order, want)
	}
	t.Logf("every probe sidecar changed in place %s after the manager restarted with the new image; Redis containers and pods kept; not-Ready moments seen: %v",
		took.Round(100*time.Millisecond), ready.NotReadySeen())
}
