package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// trivySourceNames are the sources of the objects Trivy scans, as trivy-skips.yaml names them:
// kustomize (deploy/default), helm (the chart with its default values), helm-everything (the chart
// with every optional part on) and bundle (bundle/manifests, with the objects its
// ClusterServiceVersion has OLM create).
var trivySourceNames = []string{"kustomize", "helm", "helm-everything", "bundle"}

// chartEverything turns on every optional part of the chart, those on by default included so that
// the list says what is scanned: the Prometheus Operator's ServiceMonitor (with its binding to the
// metrics reader) and PrometheusRule, a serving certificate for the metrics, cert-manager for the
// conversion webhook's certificate, the admission policies, the NetworkPolicy, the
// PodDisruptionBudget and the helm test pod.
var chartEverything = []string{
	"--set", "metrics.serviceMonitor.enabled=true",
	"--set", "metrics.serviceMonitor.prometheusServiceAccount.name=prometheus-k8s",
	"--set", "metrics.serviceMonitor.prometheusServiceAccount.namespace=monitoring",
	"--set", "metrics.prometheusRule.enabled=true",
	"--set", "metrics.certSecret=keyroll-metrics-tls",
	"--set", "webhook.certManager.enabled=true",
	"--set", "admissionPolicies.enabled=true",
	"--set", "networkPolicy.enabled=true",
	"--set", "podDisruptionBudget.enabled=true",
	"--set", "test.enabled=true",
}

// failingSeverities are the severities of Trivy's findings that fail the audit; the others are
// logged.
var failingSeverities = []string{"HIGH", "CRITICAL"}

// trivyFinding is a check of Trivy's that failed on one object.
type trivyFinding struct {
	finding
	severity string
}

// TestManifestsPassTrivy scans the kustomize tree, the Helm chart (with its default values, and
// with every optional part on) and the OLM bundle with Trivy's configuration scan and the checks
// built into it, offline. A HIGH or CRITICAL finding fails the test unless trivy-skips.yaml lists
// it with a reason, and a skip that matches nothing fails it too.
func TestManifestsPassTrivy(t *testing.T) {
	if _, err := testground.Binary("trivy"); err != nil {
		t.Fatal(err)
	}
	skips := loadTrivySkips(t)
	sources := map[string][]*unstructured.Unstructured{}
	var err error
	if sources["kustomize"], err = render.Kustomize("default"); err != nil {
		t.Fatal(err)
	}
	if sources["helm"], err = render.HelmTemplate(t, "keyroll", "keyroll-system"); err != nil {
		t.Fatal(err)
	}
	if sources["helm-everything"], err = render.HelmTemplate(t, "keyroll", "keyroll-system", chartEverything...); err != nil {
		t.Fatal(err)
	}
	sources["bundle"] = bundleObjects(t)

	used := make([]bool, len(skips))
	for _, source := range trivySourceNames {
		for _, f := range trivyFindings(t, source, sources[source]) {
			if !slices.Contains(failingSeverities, f.severity) {
				t.Logf("trivy %s (%s, not enforced)", f, f.severity)
				continue
			}
			if i := matching(skips, f.finding); i >= 0 {
				used[i] = true
				t.Logf("skipped %s (%s): %s", f, f.severity, skips[i].Reason)
				continue
			}
			t.Errorf("trivy %s (%s)\n\tfix it, or list it in test/audit/trivy-skips.yaml with the reason", f, f.severity)
		}
	}
	for i, s := range skips {
		if !used[i] {
			t.Errorf("test/audit/trivy-skips.yaml: %s on %s %s (%v) matches no finding any more: remove it", s.Check, s.Kind, s.Name, s.Source)
		}
	}

	// The gate can fail: a privileged manager container is found, and no skip covers it.
	t.Run("privileged container fails", func(t *testing.T) {
		manager := render.Find(sources["kustomize"], "Deployment", "keyroll-manager")
		if len(manager) != 1 {
			t.Fatalf("deploy/default renders %d Deployments keyroll-manager, want 1", len(manager))
		}
		// A copy through JSON: kustomize's output holds ints, which DeepCopy cannot copy.
		b, err := json.Marshal(manager[0].Object)
		if err != nil {
			t.Fatal(err)
		}
		privileged := &unstructured.Unstructured{}
		if err := json.Unmarshal(b, &privileged.Object); err != nil {
			t.Fatal(err)
		}
		containers, _, _ := unstructured.NestedSlice(privileged.Object, "spec", "template", "spec", "containers")
		if len(containers) == 0 {
			t.Fatal("the manager Deployment has no container")
		}
		if err := unstructured.SetNestedField(containers[0].(map[string]any), true, "securityContext", "privileged"); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedSlice(privileged.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			t.Fatal(err)
		}
		var failing []string
		for _, f := range trivyFindings(t, "kustomize", []*unstructured.Unstructured{privileged}) {
			if slices.Contains(failingSeverities, f.severity) && matching(skips, f.finding) < 0 {
				failing = append(failing, f.String())
			}
		}
		if len(failing) == 0 {
			t.Fatal("trivy finds no HIGH or CRITICAL issue that trivy-skips.yaml leaves standing in a privileged manager Deployment")
		}
		t.Logf("a privileged manager fails the audit: %s", strings.Join(failing, "; "))
	})
}

// trivy-skips.yaml has the entries of skips.yaml (skip), with Trivy's check IDs (KSV-0041).
func loadTrivySkips(t *testing.T) []skip {
	t.Helper()
	b, err := os.ReadFile("trivy-skips.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var skips []skip
	if err := yaml.UnmarshalStrict(b, &skips); err != nil {
		t.Fatalf("trivy-skips.yaml: %v", err)
	}
	for _, s := range skips {
		if s.Check == "" || len(strings.TrimSpace(s.Reason)) < 20 || s.Kind == "" || s.Name == "" || len(s.Source) == 0 {
			t.Errorf("trivy-skips.yaml: each entry needs a check, source, kind, name and a reason: %+v", s)
		}
		for _, src := range s.Source {
			if !slices.Contains(trivySourceNames, src) {
				t.Errorf("trivy-skips.yaml: %s: unknown source %q", s.Check, src)
			}
		}
	}
	return skips
}

// trivyFindings writes objects one to a file, scans them with trivy config, and returns the
// checks that failed. It fails the test unless Trivy took every file for a Kubernetes object and
// ran checks on it, so that a scan that recognised nothing cannot pass.
func trivyFindings(t *testing.T, source string, objs []*unstructured.Unstructured) []trivyFinding {
	t.Helper()
	if len(objs) == 0 {
		t.Fatalf("%s: no objects to scan", source)
	}
	dir := t.TempDir()
	byFile := map[string]*unstructured.Unstructured{}
	for i, o := range objs {
		name := fmt.Sprintf("%03d-%s-%s.yaml", i, strings.ToLower(o.GetKind()), o.GetName())
		if err := render.WriteYAML(filepath.Join(dir, name), []*unstructured.Unstructured{o}); err != nil {
			t.Fatal(err)
		}
		byFile[name] = o
	}
	var report struct {
		Results []struct {
			Target         string
			Type           string
			MisconfSummary *struct {
				Successes, Failures int
			}
			Misconfigurations []struct {
				ID, AVDID, Title, Message, Severity, Status string
			}
		}
	}
	if err := json.Unmarshal(trivyConfig(t, dir), &report); err != nil {
		t.Fatalf("%s: trivy's report: %v", source, err)
	}
	var findings []trivyFinding
	checked := map[string]bool{}
	for _, r := range report.Results {
		o, ok := byFile[r.Target]
		if !ok {
			t.Errorf("%s: trivy reports on %s, which is none of the files written", source, r.Target)
			continue
		}
		if r.Type != "kubernetes" || r.MisconfSummary == nil || r.MisconfSummary.Successes+r.MisconfSummary.Failures == 0 {
			t.Errorf("%s: trivy ran no Kubernetes check on %s (type %q)", source, r.Target, r.Type)
			continue
		}
		checked[r.Target] = true
		for _, m := range r.Misconfigurations {
			if m.Status != "FAIL" {
				continue
			}
			id := m.ID
			if id == "" {
				id = m.AVDID
			}
			f := trivyFinding{severity: m.Severity, finding: finding{source: source, kind: o.GetKind(),
				namespace: o.GetNamespace(), name: o.GetName(), check: id, summary: m.Title + ": " + m.Message}}
			// A check reports once per rule or container that fails it, often with the same message.
			if !slices.Contains(findings, f) {
				findings = append(findings, f)
			}
		}
	}
	for name := range byFile {
		if !checked[name] {
			t.Errorf("%s: trivy did not scan %s as a Kubernetes object", source, name)
		}
	}
	return findings
}

// trivyConfig runs `trivy config` over dir and returns its JSON report. Trivy runs offline, with
// the checks compiled into it: --skip-check-update keeps it from fetching the checks bundle (and
// with an empty cache it falls back to the embedded checks), --skip-version-check and
// --disable-telemetry from calling home, and the cache is the test's own. It runs in a network
// namespace of its own with no interface but loopback, so that any download it would still try
// fails instead of reaching out, and the audit gives the same answer on every machine.
func trivyConfig(t *testing.T, dir string) []byte {
	t.Helper()
	trivy, err := testground.Binary("trivy")
	if err != nil {
		t.Fatal(err)
	}
	unshare, err := testground.SystemBinary("unshare", "util-linux")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	report := filepath.Join(work, "report.json")
	args := []string{"--net", "--map-root-user", trivy, "config",
		"--cache-dir", filepath.Join(work, "cache"), "--skip-check-update", "--skip-version-check", "--disable-telemetry",
		"--misconfig-scanners", "kubernetes", "--k8s-version", strings.TrimPrefix(render.KubeVersion, "v"),
		"--format", "json", "--output", report, dir}
	var logs bytes.Buffer
	cmd := exec.Command(unshare, args...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Run(); err != nil {
		t.Fatalf("unshare %s: %v\n%s", strings.Join(args, " "), err, logs.String())
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("trivy wrote no report: %v\n%s", err, logs.String())
	}
	return b
}

// bundleObjects returns the objects of bundle/manifests and those its ClusterServiceVersion has
// OLM create: the manager's Deployments, and the ClusterRoles and Roles of its service accounts
// (named as the service account; OLM generates their names).
func bundleObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(testground.RepoRoot(), "bundle", "manifests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("bundle/manifests has no manifests: %v", err)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		decoded, err := render.Decode(string(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		objs = append(objs, decoded...)
	}
	csvs := render.Find(objs, "ClusterServiceVersion", "")
	if len(csvs) != 1 {
		t.Fatalf("bundle/manifests has %d ClusterServiceVersions, want 1", len(csvs))
	}
	csv := csvs[0]
	namespace := csv.GetAnnotations()["operators.operatorframework.io/suggested-namespace"]
	install, _, _ := unstructured.NestedMap(csv.Object, "spec", "install", "spec")
	deployments, _ := install["deployments"].([]any)
	if len(deployments) == 0 {
		t.Fatal("the ClusterServiceVersion installs no Deployment")
	}
	for _, d := range deployments {
		d, _ := d.(map[string]any)
		name, _ := d["name"].(string)
		if name == "" {
			t.Fatalf("the ClusterServiceVersion installs a Deployment without a name: %v", d)
		}
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "spec": d["spec"]}}
		o.SetName(name)
		o.SetNamespace(namespace)
		if labels, ok := d["label"].(map[string]any); ok {
			l := map[string]string{}
			for k, v := range labels {
				l[k], _ = v.(string)
			}
			o.SetLabels(l)
		}
		objs = append(objs, o)
	}
	for _, perm := range []struct{ field, kind string }{{"clusterPermissions", "ClusterRole"}, {"permissions", "Role"}} {
		field, kind := perm.field, perm.kind
		perms, _ := install[field].([]any)
		for _, p := range perms {
			p, _ := p.(map[string]any)
			account, _ := p["serviceAccountName"].(string)
			if account == "" {
				t.Fatalf("the ClusterServiceVersion's %s has an entry without a service account: %v", field, p)
			}
			o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "rules": p["rules"]}}
			o.SetName(account)
			if kind == "Role" {
				o.SetNamespace(namespace)
			}
			objs = append(objs, o)
		}
	}
	return objs
}
