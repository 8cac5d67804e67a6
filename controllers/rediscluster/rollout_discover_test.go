package rediscluster

import (
	"context"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/redisnode"
)

// podUsing is a pod spec whose container app takes the password of Secret name from env, or
// mounts it (volume creds), or takes all its keys (envFrom), or mounts it projected.
func podUsing(name, how string) corev1.PodSpec {
	c := corev1.Container{Name: "app"}
	spec := corev1.PodSpec{}
	switch how {
	case "env":
		c.Env = []corev1.EnvVar{{Name: "REDIS_PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: "password"}}}}
	case "envFrom":
		c.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}
	case "volume":
		spec.Volumes = []corev1.Volume{{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name}}}}
	case "projected":
		spec.Volumes = []corev1.Volume{{Name: "all", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}}}}}
	}
	spec.Containers = []corev1.Container{c}
	return spec
}

func TestSecretReferencesNameEachWay(t *testing.T) {
	for how, want := range map[string]string{
		"env": "env REDIS_PASSWORD of container app", "envFrom": "envFrom of container app",
		"volume": "volume creds", "projected": "projected volume all",
	} {
		spec := podUsing("orders-credentials", how)
		if got := secretReferences(&spec, "orders-credentials"); !slices.Equal(got, []string{want}) {
			t.Errorf("%s: %v, want %q", how, got, want)
		}
		if got := secretReferences(&spec, "other"); len(got) != 0 {
			t.Errorf("%s: another Secret's name finds %v", how, got)
		}
	}
	// An env variable's name has no bound; status.consumers[].references items hold 512 bytes.
	spec := podUsing("orders-credentials", "env")
	spec.Containers[0].Env[0].Name = strings.Repeat("X", 1000)
	if got := secretReferences(&spec, "orders-credentials"); len(got) != 1 || len(got[0]) != maxReference {
		t.Errorf("a long env name gives references of %d bytes", len(got[0]))
	}
}

// With rollout.discoverConsumers, a rotation restarts the Deployment and the StatefulSet whose
// pod templates reference the credentials Secret (one by env, one by volume), not listed, one at a
// time, the second only once the first has rolled out; a CronJob that references it is listed in
// status.consumers and never touched; a workload referencing another Secret, and one a
// RedisCluster controls, are left out.
func TestDiscoveredConsumersAreRolledOneAtATime(t *testing.T) {
	sel := func(app string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
	}
	api := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"},
		Spec: appsv1.DeploymentSpec{Selector: sel("api"), Template: corev1.PodTemplateSpec{Spec: podUsing("orders-credentials", "env")}}}
	worker := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "worker"},
		Spec: appsv1.StatefulSetSpec{Selector: sel("worker"), Template: corev1.PodTemplateSpec{Spec: podUsing("orders-credentials", "volume")}}}
	report := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "report"}, Spec: batchv1.CronJobSpec{Schedule: "@daily",
		JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: podUsing("orders-credentials", "envFrom")}}}}}
	other := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "other"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: podUsing("another-secret", "env")}}}
	owned := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "redis-like", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "keyroll.dev/v1beta1", Kind: "RedisCluster", Name: "orders", UID: "x", Controller: ptr.To(true)}}},
		Spec: appsv1.StatefulSetSpec{Template: corev1.PodTemplateSpec{Spec: podUsing("orders-credentials", "volume")}}}
	elsewhere := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "api2"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: podUsing("orders-credentials", "env")}}}
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) { rc.Spec.Rollout.DiscoverConsumers = true }),
		api, worker, report, other, owned, elsewhere)
	h.settle(t)
	rolledOut := func(w client.Object) {
		t.Helper()
		if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(w), w); err != nil {
			t.Fatal(err)
		}
		switch o := w.(type) {
		case *appsv1.Deployment:
			o.Status = appsv1.DeploymentStatus{ObservedGeneration: o.Generation, Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1}
		case *appsv1.StatefulSet:
			o.Status = appsv1.StatefulSetStatus{ObservedGeneration: o.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, CurrentRevision: "r", UpdateRevision: "r"}
		}
		if err := h.k8s.Status().Update(context.Background(), w); err != nil {
			t.Fatal(err)
		}
	}
	version := func(w client.Object) string {
		t.Helper()
		if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(w), w); err != nil {
			t.Fatal(err)
		}
		switch o := w.(type) {
		case *appsv1.Deployment:
			return o.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]
		case *appsv1.StatefulSet:
			return o.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]
		}
		return ""
	}
	rc := h.get(t)
	rc.Annotations = map[string]string{v1beta1.AnnotationRotateNow: "now"}
	if err := h.k8s.Update(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	h.eventReasons()
	rc = h.settle(t)
	cur := rc.Status.Credential.Version
	want := []v1beta1.ConsumerInUse{
		{Kind: "Deployment", Name: "api", Via: v1beta1.ConsumerDiscovered, References: []string{"env REDIS_PASSWORD of container app"}, Restarted: true},
		{Kind: "StatefulSet", Name: "worker", Via: v1beta1.ConsumerDiscovered, References: []string{"volume creds"}, Restarted: true},
		{Kind: "CronJob", Name: "report", Via: v1beta1.ConsumerDiscovered, References: []string{"envFrom of container app"}, Restarted: false},
	}
	if !slices.EqualFunc(rc.Status.Consumers, want, func(a, b v1beta1.ConsumerInUse) bool {
		return a.Kind == b.Kind && a.Name == b.Name && a.Via == b.Via && a.Restarted == b.Restarted && slices.Equal(a.References, b.References)
	}) {
		t.Fatalf("status.consumers %+v, want %+v", rc.Status.Consumers, want)
	}
	if !slices.Contains(h.eventReasons(), v1beta1.EventConsumersDiscovered) {
		t.Error("no ConsumersDiscovered event")
	}
	if version(api) != cur || version(worker) != "" {
		t.Fatalf("first step: api on %q, worker on %q; want api restarted onto %s, worker not yet", version(api), version(worker), cur)
	}
	rolledOut(api)
	h.settle(t)
	if version(worker) != cur {
		t.Fatalf("worker on %q once api rolled out, want %s", version(worker), cur)
	}
	rolledOut(worker)
	rc = h.settle(t)
	if rc.Status.Rollout != nil {
		t.Errorf("rollout %+v once both rolled out", rc.Status.Rollout)
	}
	if version(other) != "" || version(owned) != "" || version(elsewhere) != "" {
		t.Errorf("touched: other %q, a RedisCluster's own %q, another namespace's %q", version(other), version(owned), version(elsewhere))
	}
	cj := &batchv1.CronJob{}
	if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(report), cj); err != nil || len(cj.Spec.JobTemplate.Spec.Template.Annotations) != 0 {
		t.Errorf("the CronJob was touched: %+v, %v", cj.Spec.JobTemplate.Spec.Template.Annotations, err)
	}
}

// With rollout.unlistedClients Restart, a Deployment of the cluster's namespace still logged in
// with the superseded user becomes a consumer (status.consumers, via LoggedIn) and is restarted;
// a client outside the pod network is waited for and never touched; once both are gone, the
// retirement goes on.
func TestRestartActionRestartsTheLoggedInWorkload(t *testing.T) {
	report, rs, pod := deploymentPod("report", "10.0.9.9")
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.UnlistedClients = v1beta1.UnlistedClientsSpec{Action: v1beta1.UnlistedClientsRestart}
	}), report, rs)
	if err := h.k8s.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	_, old := h.rotateHolding(t, "10.0.9.9:51000")
	h.redis.SetClients(nodeAddr(0), redisnode.Conn{User: old, Addr: "10.0.9.9:51000"}, redisnode.Conn{User: old, Addr: "192.0.2.7:4000"})
	rc := h.settle(t)
	if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(report), report); err != nil {
		t.Fatal(err)
	}
	if got := report.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]; got != rc.Status.Credential.Version {
		t.Fatalf("Deployment report on credential %q, want restarted onto %s (consumers %+v, events %v)", got, rc.Status.Credential.Version, rc.Status.Consumers, h.eventReasons())
	}
	if !slices.ContainsFunc(rc.Status.Consumers, func(c v1beta1.ConsumerInUse) bool {
		return c.Kind == "Deployment" && c.Name == "report" && c.Via == v1beta1.ConsumerLoggedIn && c.Restarted
	}) {
		t.Errorf("status.consumers %+v, want Deployment/report via LoggedIn", rc.Status.Consumers)
	}
	if !slices.Contains(h.redis.Users(nodeAddr(0)), old) {
		t.Fatal("the old user left while its clients were being restarted")
	}
	// The workload has rolled out, its new pod on the new credential; the host's client left too.
	report.Status = appsv1.DeploymentStatus{ObservedGeneration: report.Generation, Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1}
	if err := h.k8s.Status().Update(context.Background(), report); err != nil {
		t.Fatal(err)
	}
	if err := h.k8s.Delete(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		h.redis.SetClients(nodeAddr(i))
	}
	h.clock.Step(oldClientsRecheck)
	rc = h.settle(t)
	if slices.Contains(h.redis.Users(nodeAddr(0)), old) || len(rc.Status.OldUserClients) != 0 || len(rc.Status.Leases) != 1 {
		t.Errorf("after the restart: old user on node 0 %v, clients %+v, %d leases", slices.Contains(h.redis.Users(nodeAddr(0)), old), rc.Status.OldUserClients, len(rc.Status.Leases))
	}
}

// Only Deployments, StatefulSets and DaemonSets of the cluster's own namespace are adopted.
func TestAdoptLoggedInTakesOnlyOwnNamespacesWorkloads(t *testing.T) {
	rc := cluster()
	got := adoptLoggedIn(rc, []v1beta1.OldUserClient{
		{Workload: "Deployment/api"}, {Workload: "StatefulSet/db"}, {Workload: "DaemonSet/agent"},
		{Workload: "CronJob/report"}, {Workload: "Pod/debug"}, {Workload: ""},
		{Workload: "Deployment/api in namespace billing"},
	})
	if want := []string{"Deployment/api", "StatefulSet/db", "DaemonSet/agent"}; !slices.Equal(got, want) {
		t.Errorf("adopted %v, want %v", got, want)
	}
	if again := adoptLoggedIn(rc, []v1beta1.OldUserClient{{Workload: "Deployment/api"}}); len(again) != 0 {
		t.Errorf("adopted again %v", again)
	}
	if n := len(rc.Status.Consumers); n != 3 || strings.Contains(rc.Status.Consumers[0].Name, " ") {
		t.Errorf("status.consumers %+v", rc.Status.Consumers)
	}
}
