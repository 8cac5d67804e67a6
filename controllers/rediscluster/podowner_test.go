package rediscluster

import (
	"context"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/redisnode"
)

// deploymentPod is Deployment name of namespace shop, its ReplicaSet and one of its pods at ip,
// as the Deployment and ReplicaSet controllers make them.
func deploymentPod(name, ip string) (*appsv1.Deployment, *appsv1.ReplicaSet, *corev1.Pod) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("deploy-" + name)},
		Spec: appsv1.DeploymentSpec{Selector: sel}}
	rsSel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": name, "pod-template-hash": "7d9f"}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name + "-7d9f", UID: types.UID("rs-" + name),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: name, UID: d.UID, Controller: ptr.To(true)}}},
		Spec: appsv1.ReplicaSetSpec{Selector: rsSel}}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name + "-7d9f-abcde", Labels: map[string]string{"app": name, "pod-template-hash": "7d9f"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}},
		Status: corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning},
	}
	return d, rs, p
}

// A pod's controller is its workload only if it vouches for the pod: it exists in the pod's
// namespace with the reference's UID and selects the pod, and a ReplicaSet's Deployment does the
// same for the ReplicaSet's pods. Any other pod is a bare pod, whose workload keyroll never
// restarts; a controller keyroll cannot read (a Job) is named as given, for reports only.
func TestAPodsOwnerIsItsWorkloadOnlyIfItSelectsThePod(t *testing.T) {
	owned := func(p *corev1.Pod, kind, name string, uid types.UID) *corev1.Pod {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}}
		return p
	}
	cases := map[string]struct {
		pod    func(d *appsv1.Deployment, rs *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod
		change func(d *appsv1.Deployment, rs *appsv1.ReplicaSet)
		want   string
	}{
		"a Deployment's pod": {want: "Deployment/api"},
		"a bare pod": {pod: func(_ *appsv1.Deployment, _ *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			p.OwnerReferences = nil
			return p
		}, want: "Pod/api-7d9f-abcde"},
		"a ReplicaSet that does not exist": {pod: func(_ *appsv1.Deployment, _ *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			return owned(p, "ReplicaSet", "api-5c6d", "rs-forged")
		}, want: "Pod/api-7d9f-abcde"},
		"the ReplicaSet's name with another UID": {pod: func(_ *appsv1.Deployment, rs *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			return owned(p, "ReplicaSet", rs.Name, "rs-forged")
		}, want: "Pod/api-7d9f-abcde"},
		"a ReplicaSet that does not select the pod": {pod: func(_ *appsv1.Deployment, _ *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			p.Labels = map[string]string{"app": "api"}
			return p
		}, want: "Pod/api-7d9f-abcde"},
		"a ReplicaSet no Deployment controls": {change: func(_ *appsv1.Deployment, rs *appsv1.ReplicaSet) { rs.OwnerReferences = nil }, want: "Pod/api-7d9f-abcde"},
		"a ReplicaSet that names a Deployment with another UID": {change: func(_ *appsv1.Deployment, rs *appsv1.ReplicaSet) {
			rs.OwnerReferences[0].UID = "deploy-forged"
		}, want: "Pod/api-7d9f-abcde"},
		"a Deployment that does not select the pod": {change: func(d *appsv1.Deployment, _ *appsv1.ReplicaSet) {
			d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}
		}, want: "Pod/api-7d9f-abcde"},
		"the Deployment itself named as the controller": {pod: func(d *appsv1.Deployment, _ *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			return owned(p, "Deployment", d.Name, d.UID)
		}, want: "Deployment/api"}, // named as given: keyroll restarts no workload of an unchecked kind
		"a StatefulSet that selects the pod": {pod: func(_ *appsv1.Deployment, _ *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			return owned(p, "StatefulSet", "db", "sts-db")
		}, want: "StatefulSet/db"},
		"a StatefulSet's name with another UID": {pod: func(_ *appsv1.Deployment, _ *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			return owned(p, "StatefulSet", "db", "sts-forged")
		}, want: "Pod/api-7d9f-abcde"},
		"a DaemonSet that does not select the pod": {pod: func(_ *appsv1.Deployment, _ *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			return owned(p, "DaemonSet", "agent", "ds-agent")
		}, want: "Pod/api-7d9f-abcde"},
		"a Job": {pod: func(_ *appsv1.Deployment, _ *appsv1.ReplicaSet, p *corev1.Pod) *corev1.Pod {
			return owned(p, "Job", "report", "job-report")
		}, want: "Job/report"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, rs, p := deploymentPod("api", "10.0.9.9")
			if tc.change != nil {
				tc.change(d, rs)
			}
			if tc.pod != nil {
				p = tc.pod(d, rs, p)
			}
			db := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db", UID: "sts-db"},
				Spec: appsv1.StatefulSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}}}
			agent := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "agent", UID: "ds-agent"},
				Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}}}}
			k8s := fake.NewClientBuilder().WithObjects(d, rs, db, agent).Build()
			kind, name, err := (&podOwners{Reader: k8s}).workloadOf(context.Background(), p)
			if err != nil || kind+"/"+name != tc.want {
				t.Errorf("workload %s/%s, %v; want %s", kind, name, err, tc.want)
			}
		})
	}
}

// With rollout.unlistedClients Restart, a tenant's bare pod that names another team's
// Deployment's ReplicaSet as its controller (and carries the Deployment's labels) does not get
// that Deployment restarted: the ReplicaSet it names does not exist, so it is a bare pod, held for
// as an unlisted client under its own name. The Deployment's own pod, logged in too, still gets
// its Deployment restarted.
func TestRestartTrustsNoForgedOwnerReference(t *testing.T) {
	billing, billingRS, _ := deploymentPod("billing", "10.0.9.8")
	report, reportRS, reportPod := deploymentPod("report", "10.0.9.9")
	h := newHarness(t, cluster(func(rc *v1beta1.RedisCluster) {
		rc.Spec.Rollout.UnlistedClients = v1beta1.UnlistedClientsSpec{Action: v1beta1.UnlistedClientsRestart}
	}), billing, billingRS, report, reportRS)
	forged := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "tenant", Labels: map[string]string{"app": "billing", "pod-template-hash": "5c6d"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "billing-5c6d", UID: "rs-forged", Controller: ptr.To(true)}}},
		Status: corev1.PodStatus{PodIP: "10.0.9.7", Phase: corev1.PodRunning},
	}
	for _, p := range []client.Object{forged, reportPod} {
		if err := h.k8s.Create(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	_, old := h.rotateHolding(t, "10.0.9.7:51000")
	h.redis.SetClients(nodeAddr(0), redisnode.Conn{User: old, Addr: "10.0.9.7:51000"}, redisnode.Conn{User: old, Addr: "10.0.9.9:51000"})
	rc := h.settle(t)
	version := func(d *appsv1.Deployment) string {
		if err := h.k8s.Get(context.Background(), client.ObjectKeyFromObject(d), d); err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]
	}
	if got := version(billing); got != "" {
		t.Errorf("Deployment billing was restarted (credential %q) for a pod that only claims to be its own; consumers %+v", got, rc.Status.Consumers)
	}
	if got := version(report); got != rc.Status.Credential.Version {
		t.Errorf("Deployment report on credential %q, want restarted onto %s", got, rc.Status.Credential.Version)
	}
	workloads := []string{}
	for _, c := range rc.Status.OldUserClients {
		workloads = append(workloads, c.Workload)
	}
	if !slices.Contains(workloads, "Pod/tenant") || slices.Contains(workloads, "Deployment/billing") {
		t.Errorf("status.oldUserClients name %v, want the forged pod as Pod/tenant", workloads)
	}
}
