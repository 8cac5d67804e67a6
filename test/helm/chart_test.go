package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/test/docblocks"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// everything turns on every optional part of the chart.
const everything = `
metrics:
  certSecret: keyroll-metrics-tls
  serviceMonitor:
    enabled: true
    labels: {release: prometheus}
    prometheusServiceAccount: {name: prometheus-k8s, namespace: monitoring}
  prometheusRule:
    enabled: true
networkPolicy:
  metricsFrom:
  - namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: monitoring}
extraArgs: ["--lease-check-interval=30s"]
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Exists}]
podAnnotations: {example.com/team: platform}
imagePullSecrets: [{name: regcred}]
image: {repository: registry.example/keyroll, tag: v0.1.0}
resources:
  requests: {cpu: 100m, memory: 96Mi, ephemeral-storage: 16Mi}
  limits: {cpu: "1", memory: 384Mi, ephemeral-storage: 64Mi}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/os, operator: In, values: [linux]}
`

// TestHelmChartRendersAndLints: helm lint is clean for every kind of values; the chart renders
// what each value asks for, the CRDs, RBAC and alerts of deploy/ unchanged and a manager that
// matches deploy/manager; and what it renders installs under the restricted Pod Security
// Standard, with pods that the ReplicaSet controller creates admitted and Ready (kwok). Subtests
// can be added: the manager running on a real node is the next one.
func TestHelmChartRendersAndLints(t *testing.T) {
	dir := t.TempDir()
	everythingFile := filepath.Join(dir, "everything.yaml")
	if err := os.WriteFile(everythingFile, []byte(everything), 0o600); err != nil {
		t.Fatal(err)
	}
	variants := map[string][]string{
		"defaults":      nil,
		"everything on": {"-f", everythingFile},
		"plain metrics": {"--set", "metrics.secure=false", "--set", "metrics.serviceMonitor.enabled=true"},
		"no metrics":    {"--set", "metrics.enabled=false"},
		"one replica": {"--set", "replicas=1", "--set", "leaderElection.enabled=false",
			"--set", "podDisruptionBudget.enabled=false", "--set", "networkPolicy.enabled=false", "--set", "log.format=console"},
		"cert-manager":          {"--set", "webhook.certManager.enabled=true"},
		"no admission policies": {"--set", "admissionPolicies.enabled=false"},
		"beside another install": {"--set", "serviceAccount.name=canary",
			"--set-json", `admissionPolicies.redisClusterSelector={"matchLabels":{"keyroll.dev/install":"canary"}}`},
		"cert-manager, own issuer": {"--set", "webhook.certManager.enabled=true",
			"--set-json", `webhook.certManager.issuerRef={"name":"corp-ca","kind":"ClusterIssuer","group":"cert-manager.io"}`},
	}
	t.Run("lint", func(t *testing.T) {
		for name, args := range variants {
			out, err := render.Helm(t, nil, append([]string{"lint", "--strict", render.Chart(), "--kube-version", render.KubeVersion}, args...)...)
			if err != nil || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") || strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
				t.Errorf("helm lint --strict with %s: %v\n%s", name, err, out)
			}
		}
		// values.schema.json refuses wrong values, naming them, in lint as in install and template.
		for name, args := range map[string][]string{
			"/leaderElection/enabled":       {"--set", "leaderElection.enabled=false"},
			"/log/format":                   {"--set", "log.format=text"},
			"'replica'":                     {"--set", "replica=3"},
			"/metrics/port":                 {"--set", "metrics.port=0"},
			"/webhook/certManager/duration": {"--set", "webhook.certManager.duration=90 days"},
		} {
			for _, cmd := range [][]string{{"lint", "--strict", render.Chart()}, {"template", "keyroll", render.Chart()}} {
				if out, err := render.Helm(t, nil, append(cmd, args...)...); err == nil {
					t.Errorf("helm %s accepts a wrong %s:\n%s", cmd[0], name, out)
				} else if !strings.Contains(out, name) {
					t.Errorf("helm %s refuses a wrong %s without naming it:\n%s", cmd[0], name, out)
				}
			}
		}
	})
	t.Run("values", func(t *testing.T) { testValues(t, variants) })
	t.Run("helm test", testHelmTestObjects)
	t.Run("same as deploy", testSameAsDeploy)
	t.Run("installs under restricted", func(t *testing.T) {
		// The release names the chart's cluster-scoped objects (<release>-keyroll-...).
		ns, release := fw.Namespace(t, "keyroll-render"), fw.Name("render")
		objs := installRendered(t, release, ns, "-f", everythingFile)
		waitAvailable(t, objs)
		checkChartRBAC(t, ns, release+"-keyroll-manager")
	})
}

// testValues: each variant renders what its values ask for.
func testValues(t *testing.T, variants map[string][]string) {
	rendered := map[string][]*unstructured.Unstructured{}
	for name, args := range variants {
		objs, err := render.HelmTemplate(t, "keyroll", "keyroll-system", append([]string{"--skip-tests"}, args...)...)
		if err != nil {
			t.Fatalf("helm template with %s: %v", name, err)
		}
		rendered[name] = objs
	}
	mgr := func(variant string) (*appsv1.Deployment, corev1.Container) {
		d := &appsv1.Deployment{}
		convert(t, one(t, rendered[variant], "Deployment", "keyroll-manager"), d)
		return d, d.Spec.Template.Spec.Containers[0]
	}

	d, c := mgr("defaults")
	if *d.Spec.Replicas != 2 || c.Image != "keyroll:0.1.0" || c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("defaults: replicas %d, image %s (%s)", *d.Spec.Replicas, c.Image, c.ImagePullPolicy)
	}
	wantArgs(t, "defaults", c.Args, "--leader-elect=true", "--metrics-bind-address=:8443", "--metrics-secure=true",
		"--service-account-name=keyroll-manager", "--zap-encoder=json", "--leader-elect-lease-duration=15s")
	if a := d.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("defaults: the managers do not prefer separate nodes: %+v", a)
	}
	for _, kind := range []string{"PodDisruptionBudget", "NetworkPolicy"} {
		one(t, rendered["defaults"], kind, "")
	}
	// The metrics and the conversion webhook.
	if n := len(render.Find(rendered["defaults"], "Service", "")); n != 2 {
		t.Errorf("defaults render %d Services, want 2 (metrics, conversion webhook)", n)
	}
	wantArgs(t, "defaults", c.Args, "--webhook-service=keyroll-webhook", "--webhook-secret=keyroll-webhook-certificate")
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
		if len(render.Find(rendered["defaults"], kind, "")) != 0 {
			t.Errorf("defaults render a %s (it needs the Prometheus Operator; off by default)", kind)
		}
	}

	d, c = mgr("everything on")
	wantArgs(t, "everything on", c.Args, "--metrics-cert-dir=/etc/keyroll/metrics-certs", "--lease-check-interval=30s")
	ps := d.Spec.Template.Spec
	if c.Image != "registry.example/keyroll:v0.1.0" || ps.NodeSelector["kubernetes.io/os"] != "linux" || len(ps.Tolerations) != 1 ||
		d.Spec.Template.Annotations["example.com/team"] != "platform" || len(ps.ImagePullSecrets) != 1 ||
		len(ps.Volumes) != 1 || ps.Volumes[0].Secret == nil || ps.Volumes[0].Secret.SecretName != "keyroll-metrics-tls" ||
		len(c.VolumeMounts) != 1 || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("everything on: the pod does not have what the values ask for: image %s, %+v", c.Image, ps)
	}
	wantResources := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("96Mi"),
			corev1.ResourceEphemeralStorage: resource.MustParse("16Mi")},
		Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("384Mi"),
			corev1.ResourceEphemeralStorage: resource.MustParse("64Mi")},
	}
	if !equality.Semantic.DeepEqual(c.Resources, wantResources) {
		got, _ := json.Marshal(c.Resources)
		want, _ := json.Marshal(wantResources)
		t.Errorf("everything on: the manager's resources are %s, want the values' %s", got, want)
	}
	// The values' affinity replaces the default one (prefer one manager per node) whole.
	if a := ps.Affinity; a == nil || a.PodAntiAffinity != nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
		len(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 1 ||
		!reflect.DeepEqual(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions,
			[]corev1.NodeSelectorRequirement{{Key: "kubernetes.io/os", Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}}}) {
		t.Errorf("everything on: the pod's affinity is not the values' one: %+v", a)
	}
	sm := one(t, rendered["everything on"], "ServiceMonitor", "keyroll")
	ep, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(ep) != 1 || ep[0].(map[string]any)["scheme"] != "https" || ep[0].(map[string]any)["port"] != "metrics" ||
		ep[0].(map[string]any)["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || sm.GetLabels()["release"] != "prometheus" {
		t.Errorf("everything on: ServiceMonitor %v", sm.Object)
	}
	selects(t, "everything on: the ServiceMonitor", sm, one(t, rendered["everything on"], "Service", "keyroll-metrics"))
	crb := one(t, rendered["everything on"], "ClusterRoleBinding", "keyroll-metrics-reader")
	if s, _, _ := unstructured.NestedSlice(crb.Object, "subjects"); len(s) != 1 ||
		s[0].(map[string]any)["name"] != "prometheus-k8s" || s[0].(map[string]any)["namespace"] != "monitoring" {
		t.Errorf("everything on: the metrics-reader binding is %v", crb.Object)
	}
	np := &networkingv1.NetworkPolicy{}
	convert(t, one(t, rendered["everything on"], "NetworkPolicy", "keyroll-manager"), np)
	// The metrics from metricsFrom; the probes and the conversion webhook (the API server) from anywhere.
	if len(np.Spec.Ingress) != 3 || len(np.Spec.Ingress[0].From) != 1 || len(np.Spec.Ingress[1].From) != 0 || len(np.Spec.Ingress[2].From) != 0 {
		t.Errorf("everything on: the metrics port is not limited to metricsFrom: %+v", np.Spec.Ingress)
	}

	_, c = mgr("plain metrics")
	wantArgs(t, "plain metrics", c.Args, "--metrics-secure=false")
	sm = one(t, rendered["plain metrics"], "ServiceMonitor", "keyroll")
	if ep, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints"); ep[0].(map[string]any)["scheme"] != "http" {
		t.Errorf("plain metrics: the ServiceMonitor scrapes %v", ep)
	}

	_, c = mgr("no metrics")
	wantArgs(t, "no metrics", c.Args, "--metrics-bind-address=0")
	if len(render.Find(rendered["no metrics"], "Service", "keyroll-metrics")) != 0 || slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" }) {
		t.Error("no metrics: a metrics Service or port is rendered")
	}

	if n := len(render.Find(rendered["defaults"], "Certificate", "")); n != 0 {
		t.Errorf("defaults render %d cert-manager Certificates; keyroll keeps the webhook's certificate itself", n)
	}
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--webhook-certificate") }) {
		t.Errorf("defaults: %v", c.Args)
	}
	_, c = mgr("cert-manager")
	wantArgs(t, "cert-manager", c.Args, "--webhook-certificate=cert-manager", "--webhook-secret=keyroll-webhook-certificate")
	cert := one(t, rendered["cert-manager"], "Certificate", "keyroll-webhook")
	spec, _, _ := unstructured.NestedMap(cert.Object, "spec")
	if spec["secretName"] != "keyroll-webhook-certificate" || !reflect.DeepEqual(spec["dnsNames"],
		[]any{"keyroll-webhook.keyroll-system.svc", "keyroll-webhook.keyroll-system.svc.cluster.local"}) ||
		!reflect.DeepEqual(spec["issuerRef"], map[string]any{"name": "keyroll-webhook-ca", "kind": "Issuer"}) {
		t.Errorf("cert-manager: the webhook's Certificate is %v", spec)
	}
	one(t, rendered["cert-manager"], "Certificate", "keyroll-webhook-ca")
	if n := len(render.Find(rendered["cert-manager"], "Issuer", "")); n != 2 {
		t.Errorf("cert-manager: %d Issuers, want 2 (self-signed, and the CA's)", n)
	}
	cert = one(t, rendered["cert-manager, own issuer"], "Certificate", "")
	if ref, _, _ := unstructured.NestedMap(cert.Object, "spec", "issuerRef"); ref["name"] != "corp-ca" || ref["kind"] != "ClusterIssuer" {
		t.Errorf("cert-manager, own issuer: issuerRef %v", ref)
	}
	if n := len(render.Find(rendered["cert-manager, own issuer"], "Issuer", "")); n != 0 {
		t.Errorf("cert-manager, own issuer: the chart made %d Issuers of its own", n)
	}
	kust, err := render.Kustomize("cert-manager")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range append(render.Find(kust, "Certificate", ""), render.Find(kust, "Issuer", "")...) {
		same(t, "deploy/cert-manager's "+k.GetKind()+" "+k.GetName(), one(t, rendered["cert-manager"], k.GetKind(), k.GetName()).Object["spec"], k.Object["spec"])
	}
	var kd appsv1.Deployment
	convert(t, one(t, kust, "Deployment", "keyroll-manager"), &kd)
	wantArgs(t, "deploy/cert-manager", kd.Spec.Template.Spec.Containers[0].Args, "--webhook-certificate=cert-manager")

	checkAdmissionPolicies(t, rendered)

	d, c = mgr("one replica")
	wantArgs(t, "one replica", c.Args, "--leader-elect=false", "--zap-encoder=console")
	if *d.Spec.Replicas != 1 || len(render.Find(rendered["one replica"], "PodDisruptionBudget", "")) != 0 ||
		len(render.Find(rendered["one replica"], "NetworkPolicy", "")) != 0 {
		t.Error("one replica: replicas, or a PodDisruptionBudget or NetworkPolicy that was turned off")
	}
}

// checkAdmissionPolicies: the chart renders the admission policies of deploy/rbac with its own
// manager's user, two policies and their bindings by default and none when turned off; beside
// another install, the status policy covers the RedisClusters of the selector it is given.
func checkAdmissionPolicies(t *testing.T, rendered map[string][]*unstructured.Unstructured) {
	t.Helper()
	count := func(variant string) int {
		return len(render.Find(rendered[variant], "ValidatingAdmissionPolicy", "")) + len(render.Find(rendered[variant], "ValidatingAdmissionPolicyBinding", ""))
	}
	if n := count("defaults"); n != 4 {
		t.Errorf("defaults render %d admission policies and bindings, want 4", n)
	}
	if n := count("no admission policies"); n != 0 {
		t.Errorf("with admissionPolicies.enabled=false the chart renders %d admission policies and bindings", n)
	}
	for variant, user := range map[string]string{"defaults": "keyroll-system:keyroll-manager", "beside another install": "keyroll-system:canary"} {
		for _, p := range render.Find(rendered[variant], "ValidatingAdmissionPolicy", "") {
			b, err := json.Marshal(p.Object["spec"])
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(b), "'system:serviceaccount:"); n == 0 || n != strings.Count(string(b), "'system:serviceaccount:"+user+"'") {
				t.Errorf("%s: ValidatingAdmissionPolicy %s does not name the manager %s alone: %s", variant, p.GetName(), user, b)
			}
		}
	}
	binding := one(t, rendered["beside another install"], "ValidatingAdmissionPolicyBinding", "keyroll-redisclusters-status")
	if sel, _, _ := unstructured.NestedStringMap(binding.Object, "spec", "matchResources", "objectSelector", "matchLabels"); sel["keyroll.dev/install"] != "canary" {
		t.Errorf("beside another install: the status policy's binding does not select the install's RedisClusters: %v", binding.Object["spec"])
	}
	binding = one(t, rendered["defaults"], "ValidatingAdmissionPolicyBinding", "keyroll-redisclusters-status")
	if _, found, _ := unstructured.NestedMap(binding.Object, "spec", "matchResources"); found {
		t.Errorf("defaults: the status policy's binding selects some RedisClusters only: %v", binding.Object["spec"])
	}
}

// testSameAsDeploy: the chart, as release keyroll in keyroll-system, renders every object of
// deploy/default (but the Namespace) under the same name, with the same CRDs, RBAC rules and
// manager pod; and the alerts and ServiceMonitor of deploy/monitoring.
func testSameAsDeploy(t *testing.T) {
	chart, err := render.HelmTemplate(t, "keyroll", "keyroll-system", "--set", "metrics.prometheusRule.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	kust, err := render.Kustomize("default")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kust {
		if k.GetKind() == "Namespace" {
			continue
		}
		c := render.Find(chart, k.GetKind(), k.GetName())
		ns := k.GetNamespace()
		if strings.HasPrefix(k.GetKind(), "ValidatingAdmissionPolicy") {
			ns = "" // cluster-scoped: kustomize gives them deploy/default's namespace all the same (kustomize#6051)
		}
		if len(c) != 1 || c[0].GetNamespace() != ns {
			t.Errorf("the chart does not render %s %s/%s of deploy/default", k.GetKind(), k.GetNamespace(), k.GetName())
			continue
		}
		switch k.GetKind() {
		case "CustomResourceDefinition":
			same(t, k.GetName(), c[0].Object["spec"], k.Object["spec"])
		case "ClusterRole", "Role":
			same(t, k.GetKind()+" "+k.GetName()+" rules", c[0].Object["rules"], k.Object["rules"])
		case "ClusterRoleBinding", "RoleBinding":
			same(t, k.GetKind()+" "+k.GetName()+" roleRef", c[0].Object["roleRef"], k.Object["roleRef"])
			same(t, k.GetKind()+" "+k.GetName()+" subjects", c[0].Object["subjects"], k.Object["subjects"])
		case "PodDisruptionBudget":
			same(t, "PodDisruptionBudget maxUnavailable", c[0].Object["spec"].(map[string]any)["maxUnavailable"], k.Object["spec"].(map[string]any)["maxUnavailable"])
		case "NetworkPolicy":
			for _, f := range []string{"policyTypes", "egress", "ingress"} {
				same(t, "NetworkPolicy "+f, c[0].Object["spec"].(map[string]any)[f], k.Object["spec"].(map[string]any)[f])
			}
		case "Deployment":
			sameManager(t, c[0], k)
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			same(t, k.GetKind()+" "+k.GetName(), c[0].Object["spec"], k.Object["spec"])
		}
	}
	for _, kind := range []string{"ClusterRole", "Role", "CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if n, m := len(render.Find(chart, kind, "")), len(render.Find(kust, kind, "")); n != m {
			t.Errorf("the chart renders %d %s, deploy/default %d", n, kind, m)
		}
	}

	// The CRD files of the chart are the generated ones, byte for byte.
	gen, _ := filepath.Glob(filepath.Join(testground.RepoRoot(), "deploy", "crd", "keyroll.dev_*.yaml"))
	copies, _ := filepath.Glob(filepath.Join(render.Chart(), "crds", "*.yaml"))
	if len(gen) == 0 || len(gen) != len(copies) {
		t.Errorf("deploy/crd has %d CRDs, the chart's crds/ %d: run make manifests", len(gen), len(copies))
	}
	for _, g := range gen {
		a, _ := os.ReadFile(g)
		b, err := os.ReadFile(filepath.Join(render.Chart(), "crds", filepath.Base(g)))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("the chart's crds/%s differs from deploy/crd: run make manifests", filepath.Base(g))
		}
	}

	// The alerts are those of deploy/monitoring/alerts.yaml.
	b, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "monitoring", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]any{}
	if err := yaml.Unmarshal(b, &alerts); err != nil {
		t.Fatal(err)
	}
	rule := one(t, chart, "PrometheusRule", "keyroll")
	same(t, "PrometheusRule spec", rule.Object["spec"], alerts["spec"])
	if groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups"); len(groups) == 0 {
		t.Error("the PrometheusRule has no alert groups")
	}
	sameServiceMonitor(t, kust)
}

// sameServiceMonitor: deploy/monitoring/servicemonitor.yaml scrapes what the chart's ServiceMonitor
// scrapes, as the chart does (HTTPS with Prometheus's token, the same tlsConfig), from the metrics
// Service of deploy/manager, whose labels its selector matches; and binds the same account to the
// metrics reader (kube-prometheus's prometheus-k8s in monitoring, given to the chart here).
func sameServiceMonitor(t *testing.T, kust []*unstructured.Unstructured) {
	t.Helper()
	chart, err := render.HelmTemplate(t, "keyroll", "keyroll-system", "--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.serviceMonitor.prometheusServiceAccount.name=prometheus-k8s",
		"--set", "metrics.serviceMonitor.prometheusServiceAccount.namespace=monitoring")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "monitoring", "servicemonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	monitoring, err := render.Decode(string(b))
	if err != nil {
		t.Fatal(err)
	}
	sm, chartSM := one(t, monitoring, "ServiceMonitor", "keyroll"), one(t, chart, "ServiceMonitor", "keyroll")
	if sm.GetNamespace() != chartSM.GetNamespace() {
		t.Errorf("deploy/monitoring's ServiceMonitor is in %q, the chart's in %q", sm.GetNamespace(), chartSM.GetNamespace())
	}
	ep, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	chartEP, _, _ := unstructured.NestedSlice(chartSM.Object, "spec", "endpoints")
	same(t, "ServiceMonitor endpoints", chartEP, ep)
	if len(ep) != 1 {
		t.Fatalf("deploy/monitoring's ServiceMonitor has %d endpoints, want 1", len(ep))
	}
	e := ep[0].(map[string]any)
	if tls, _ := e["tlsConfig"].(map[string]any); e["scheme"] != "https" || e["port"] != "metrics" || e["path"] != "/metrics" ||
		e["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || len(tls) == 0 {
		t.Errorf("deploy/monitoring's ServiceMonitor does not scrape the secure endpoint with Prometheus's token: %v", e)
	}
	svc := one(t, kust, "Service", "keyroll-metrics")
	if svc.GetNamespace() != sm.GetNamespace() {
		t.Errorf("deploy/monitoring's ServiceMonitor is in %q, deploy/manager's metrics Service in %q", sm.GetNamespace(), svc.GetNamespace())
	}
	selects(t, "deploy/monitoring's ServiceMonitor", sm, svc)
	selects(t, "the chart's ServiceMonitor", chartSM, one(t, chart, "Service", "keyroll-metrics"))
	ports, _, _ := unstructured.NestedFieldNoCopy(svc.Object, "spec", "ports") // kustomize's output holds ints, which NestedSlice cannot copy
	if p, _ := ports.([]any); !slices.ContainsFunc(p, func(p any) bool { return p.(map[string]any)["name"] == e["port"] }) {
		t.Errorf("deploy/manager's metrics Service has no port %v: %v", e["port"], ports)
	}
	crb, chartCRB := one(t, monitoring, "ClusterRoleBinding", "keyroll-metrics-reader"), one(t, chart, "ClusterRoleBinding", "keyroll-metrics-reader")
	same(t, "the metrics reader's ClusterRoleBinding roleRef", chartCRB.Object["roleRef"], crb.Object["roleRef"])
	same(t, "the metrics reader's ClusterRoleBinding subjects", chartCRB.Object["subjects"], crb.Object["subjects"])
}

// selects: the ServiceMonitor's selector has labels, and the Service carries each of them.
func selects(t *testing.T, what string, sm, svc *unstructured.Unstructured) {
	t.Helper()
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if len(sel) == 0 {
		t.Errorf("%s selects no labels: %v", what, sm.Object["spec"])
	}
	for k, v := range sel {
		if svc.GetLabels()[k] != v {
			t.Errorf("%s selects %s=%s, which the metrics Service %s does not carry (%v)", what, k, v, svc.GetName(), svc.GetLabels())
		}
	}
}

// sameManager: the chart's manager pod is deploy/manager's: security contexts, resources,
// probes and ports equal, and every argument of deploy/manager is passed.
func sameManager(t *testing.T, chartObj, kustObj *unstructured.Unstructured) {
	t.Helper()
	var c, k appsv1.Deployment
	convert(t, chartObj, &c)
	convert(t, kustObj, &k)
	if *c.Spec.Replicas != *k.Spec.Replicas {
		t.Errorf("the chart runs %d managers, deploy/manager %d", *c.Spec.Replicas, *k.Spec.Replicas)
	}
	cp, kp := c.Spec.Template.Spec, k.Spec.Template.Spec
	same(t, "pod securityContext", cp.SecurityContext, kp.SecurityContext)
	same(t, "serviceAccountName", cp.ServiceAccountName, kp.ServiceAccountName)
	cc, kc := cp.Containers[0], kp.Containers[0]
	same(t, "container securityContext", cc.SecurityContext, kc.SecurityContext)
	same(t, "resources", cc.Resources, kc.Resources)
	same(t, "livenessProbe", cc.LivenessProbe, kc.LivenessProbe)
	same(t, "readinessProbe", cc.ReadinessProbe, kc.ReadinessProbe)
	same(t, "ports", cc.Ports, kc.Ports)
	same(t, "env", cc.Env, kc.Env)
	wantArgs(t, "the chart's manager (as deploy/manager)", cc.Args, kc.Args...)
}

// installRendered applies helm template's output (without the Prometheus Operator's kinds, whose
// CRDs the test ground does not have) in a new namespace, which it labels for the restricted Pod
// Security Standard first, and fails on any warning of the API server (Pod Security admission
// warns about a Deployment whose pods it would refuse).
func installRendered(t *testing.T, release, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{}
	if err := fw.Client.Get(ctx, client.ObjectKey{Name: namespace}, ns); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(ns.DeepCopy())
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["pod-security.kubernetes.io/enforce"], ns.Labels["pod-security.kubernetes.io/enforce-version"] = "restricted", "latest"
	if err := fw.Client.Patch(ctx, ns, patch); err != nil {
		t.Fatal(err)
	}
	objs, err := render.HelmTemplate(t, release, namespace, append([]string{"--skip-tests"}, args...)...) // helm install makes no test objects
	if err != nil {
		t.Fatal(err)
	}
	c, warnings := fw.WarningClient(t)
	var applied []*unstructured.Unstructured
	for _, o := range render.InstallOrder(objs) {
		if strings.HasPrefix(o.GetAPIVersion(), "monitoring.coreos.com/") {
			continue
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("keyroll-test"), client.ForceOwnership); err != nil {
			t.Fatalf("helm template | kubectl apply: %s %s refused: %v", o.GetKind(), o.GetName(), err)
		}
		applied = append(applied, o)
	}
	if w := warnings.All(); len(w) > 0 {
		t.Errorf("the API server warned while installing the chart: %v", w)
	}
	return applied
}

// waitAvailable waits until the manager Deployment's pods, created by the ReplicaSet controller
// and so admitted by Pod Security admission, are Ready (kwok plays their kubelet), and checks that
// the namespace's enforcement is real: a pod adding a capability is refused.
func waitAvailable(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	dep := one(t, objs, "Deployment", "")
	d := &appsv1.Deployment{}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if err := fw.Client.Get(ctx, client.ObjectKeyFromObject(dep), d); err != nil {
			t.Fatal(err)
		}
		if d.Spec.Replicas != nil && d.Status.AvailableReplicas == *d.Spec.Replicas {
			break
		}
		for _, c := range d.Status.Conditions {
			if c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue {
				t.Fatalf("the chart's manager pods are refused: %s", c.Message)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the chart's manager Deployment did not get its pods Ready (Pod Security admission refusing them?): %+v", d.Status)
		}
		time.Sleep(250 * time.Millisecond)
	}
	pods := &corev1.PodList{}
	if err := fw.Client.List(ctx, pods, client.InNamespace(d.Namespace), client.MatchingLabels(d.Spec.Selector.MatchLabels)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != int(*d.Spec.Replicas) {
		t.Errorf("%d manager pods, want %d", len(pods.Items), *d.Spec.Replicas)
	}
	bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "privileged", Namespace: d.Namespace}, Spec: *d.Spec.Template.Spec.DeepCopy()}
	bad.Spec.Containers[0].SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}
	if err := fw.Client.Create(ctx, bad); err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "restricted") {
		t.Fatalf("a pod adding a capability was not refused by Pod Security admission in %s: %v", d.Namespace, err)
	}
}

// checkChartRBAC asks the API server what the chart's service account may do.
func checkChartRBAC(t *testing.T, namespace, serviceAccount string) {
	t.Helper()
	user := "system:serviceaccount:" + namespace + ":" + serviceAccount
	for _, tc := range []struct {
		verb, group, resource, namespace string
		allowed                          bool
		name                             string
	}{
		{"list", "keyroll.dev", "redisclusters", "", true, ""},
		{"patch", "keyroll.dev", "redisclusters/status", "default", true, ""},
		// A token of its own service account, and of no other.
		{"create", "", "serviceaccounts/token", namespace, true, serviceAccount},
		{"create", "", "serviceaccounts/token", namespace, false, "default"},
		{"create", "", "serviceaccounts/token", "default", false, serviceAccount},
		{"delete", "", "secrets", "default", false, ""},
		{"update", "", "secrets", "default", false, ""},
		{"update", "coordination.k8s.io", "leases", namespace, true, ""},
		{"update", "coordination.k8s.io", "leases", "default", false, ""},
		{"create", "authentication.k8s.io", "tokenreviews", "", true, ""},
		{"create", "authorization.k8s.io", "subjectaccessreviews", "", true, ""},
		{"delete", "keyroll.dev", "vaultconnections", "", false, ""},
		{"create", "", "pods", "default", false, ""},
	} {
		res, sub, _ := strings.Cut(tc.resource, "/")
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: tc.verb, Group: tc.group, Resource: res, Subresource: sub, Namespace: tc.namespace, Name: tc.name},
		}}
		out, err := fw.Clientset.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if out.Status.Allowed != tc.allowed {
			t.Errorf("the chart's service account: %s %s.%s %q in %q allowed %v, want %v", tc.verb, tc.resource, tc.group, tc.name, tc.namespace, out.Status.Allowed, tc.allowed)
		}
	}
}

func one(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	found := render.Find(objs, kind, name)
	if len(found) != 1 {
		t.Fatalf("want one %s %q, rendered %d", kind, name, len(found))
	}
	return found[0]
}

func convert(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
		t.Fatal(err)
	}
}

// same compares two values as JSON does (a YAML integer may decode as int64 or float64).
func same(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(normal(t, got), normal(t, want)) {
		g, _ := yaml.Marshal(got)
		w, _ := yaml.Marshal(want)
		t.Errorf("%s differs between the chart and deploy/:\nchart:\n%s\ndeploy:\n%s", what, g, w)
	}
}

func normal(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func wantArgs(t *testing.T, what string, args []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(args, w) {
			t.Errorf("%s: argument %s missing from %v", what, w, args)
		}
	}
}

// TestHelmInstallCommands runs the README's helm install as written, with the test ground's helm
// and kubectl: the release is deployed, its manager Deployment runs the image it names in the
// restricted namespace, and its pods are Ready (kwok).
func TestHelmInstallCommands(t *testing.T) {
	home := t.TempDir()
	env := []string{
		"KUBECONFIG=" + fw.Ground.CP.Kubeconfig, "PATH=" + testground.BinDir() + ":" + os.Getenv("PATH"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"), "HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}
	for _, b := range docblocks.Tagged(t, testground.RepoRoot(), "helm-install") {
		docblocks.Run(t, b, testground.RepoRoot(), env, 4*time.Minute)
	}
	out, err := render.Helm(t, []string{"KUBECONFIG=" + fw.Ground.CP.Kubeconfig}, "status", "keyroll", "--namespace", "keyroll-system")
	if err != nil || !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status keyroll: %v\n%s", err, out)
	}
	d := &appsv1.Deployment{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: "keyroll-system", Name: "keyroll-manager"}, d); err != nil {
		t.Fatalf("the README's helm install did not create the manager Deployment: %v", err)
	}
	if img := d.Spec.Template.Spec.Containers[0].Image; img != "registry.example/keyroll:v0.1.0" || d.Status.AvailableReplicas != 2 {
		t.Errorf("the installed manager runs %s with %d available replicas", img, d.Status.AvailableReplicas)
	}
	ns := &corev1.Namespace{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Name: "keyroll-system"}, ns); err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("keyroll-system is not labelled restricted: %v %v", err, ns.Labels)
	}
	checkChartRBAC(t, "keyroll-system", "keyroll-manager")
}

// testHelmTestObjects: the chart's helm test is made of test hooks only (none is installed with
// the release): a pod that reads the metrics Service's URL as a service account bound to the
// metrics-reader ClusterRole, made before it; none without metrics or with test.enabled false.
func testHelmTestObjects(t *testing.T) {
	objs, err := render.HelmTemplate(t, "keyroll", "keyroll-system")
	if err != nil {
		t.Fatal(err)
	}
	var tests []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/component"] == "test" {
			tests = append(tests, o)
			if a := o.GetAnnotations(); a["helm.sh/hook"] != "test" || !strings.Contains(a["helm.sh/hook-delete-policy"], "hook-succeeded") {
				t.Errorf("%s %s is not a test hook deleted once the test passes: %v", o.GetKind(), o.GetName(), a)
			}
			if o.GetKind() != "Pod" && o.GetAnnotations()["helm.sh/hook-weight"] != "-1" {
				t.Errorf("%s %s is not made before the test pod", o.GetKind(), o.GetName())
			}
		}
	}
	pod := &corev1.Pod{}
	convert(t, one(t, tests, "Pod", "keyroll-test-metrics"), pod)
	crb := &rbacv1.ClusterRoleBinding{}
	convert(t, one(t, tests, "ClusterRoleBinding", "keyroll-test"), crb)
	one(t, tests, "ServiceAccount", "keyroll-test")
	one(t, tests, "NetworkPolicy", "keyroll-test")
	if crb.RoleRef.Name != "keyroll-metrics-reader" || len(crb.Subjects) != 1 || crb.Subjects[0].Name != pod.Spec.ServiceAccountName {
		t.Errorf("the test pod's account %s is not bound to keyroll-metrics-reader: %+v", pod.Spec.ServiceAccountName, crb)
	}
	if env := pod.Spec.Containers[0].Env; len(env) != 1 || env[0].Value != "https://keyroll-metrics.keyroll-system.svc:8443/metrics" {
		t.Errorf("the test pod reads %v, not the metrics Service", env)
	}
	for _, args := range [][]string{{"--set", "test.enabled=false"}, {"--set", "metrics.enabled=false"}} {
		objs, err := render.HelmTemplate(t, "keyroll", "keyroll-system", args...)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetLabels()["app.kubernetes.io/component"] == "test" {
				t.Errorf("with %v the chart renders test object %s %s", args, o.GetKind(), o.GetName())
			}
		}
	}
}
