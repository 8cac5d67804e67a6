package audit

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// alertRule is an alerting rule of deploy/monitoring/alerts.yaml.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// ruleTestFile is what TestAlertRulesFireAsDocumented reads of the promtool test file, to check
// that it covers every alert; promtool reads the rest.
type ruleTestFile struct {
	EvaluationInterval string      `json:"evaluation_interval"`
	Tests              []ruleTests `json:"tests"`
}

type ruleTests struct {
	Name      string `json:"name"`
	AlertTest []struct {
		EvalTime  string `json:"eval_time"`
		Alertname string `json:"alertname"`
		ExpAlerts []struct {
			ExpLabels      map[string]string `json:"exp_labels"`
			ExpAnnotations map[string]string `json:"exp_annotations"`
		} `json:"exp_alerts"`
	} `json:"alert_rule_test"`
	ExprTest []struct {
		Expr       string `json:"expr"`
		EvalTime   string `json:"eval_time"`
		ExpSamples []any  `json:"exp_samples"`
	} `json:"promql_expr_test"`
}

// TestAlertRulesFireAsDocumented checks keyroll's alerts with promtool (built by test/tools): the
// rules are valid and lint-clean, and its unit tests (alerts_test_rules.yaml) pass, in which each
// alert fires on the series that should raise it once its `for` has passed and not a minute
// before, with its labels and annotations rendered, and stays silent on what a working keyroll
// reports. The test fails when an alert has no such tests, so that a new alert comes with them.
func TestAlertRulesFireAsDocumented(t *testing.T) {
	promtool, err := testground.Binary("promtool")
	if err != nil {
		t.Fatal(err)
	}
	alertsFile := filepath.Join(testground.RepoRoot(), "deploy", "monitoring", "alerts.yaml")
	src, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	// The chart renders its PrometheusRule from its own copy, which `make manifests` writes; a
	// copy edited by hand, or not regenerated, would ship other alerts than these.
	chartCopy, err := os.ReadFile(filepath.Join(render.Chart(), "files", "monitoring", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(chartCopy, src) {
		t.Errorf("deploy/helm/keyroll/files/monitoring/alerts.yaml differs from deploy/monitoring/alerts.yaml: run make manifests")
	}

	// promtool reads plain rule files; alerts.yaml is a PrometheusRule, whose spec is one.
	var prometheusRule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(src, &prometheusRule); err != nil || prometheusRule.Kind != "PrometheusRule" || len(prometheusRule.Spec.Groups) == 0 {
		t.Fatalf("%s is not a PrometheusRule with rule groups (kind %q): %v", alertsFile, prometheusRule.Kind, err)
	}
	rules, err := yaml.Marshal(map[string]any{"groups": prometheusRule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "alerts.rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	testFile, err := os.ReadFile("alerts_test_rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test_rules.yaml"), testFile, 0o600); err != nil {
		t.Fatal(err)
	}

	if out, err := run(promtool, "check", "rules", "--lint=all", "--lint-fatal", filepath.Join(dir, "alerts.rules.yaml")); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := run(promtool, "test", "rules", filepath.Join(dir, "alerts_test_rules.yaml")); err != nil || !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules (test/audit/alerts_test_rules.yaml): %v\n%s", err, out)
	}
	checkAlertTestsCover(t, alertRules(t, prometheusRule.Spec.Groups), testFile)
	checkScrapesKeepKeyrollLabels(t)
}

// alertRules returns the alerting rules of the rule groups.
func alertRules(t *testing.T, groups []any) []alertRule {
	t.Helper()
	b, err := yaml.Marshal(groups)
	if err != nil {
		t.Fatal(err)
	}
	var parsed []struct {
		Rules []alertRule `json:"rules"`
	}
	if err := yaml.Unmarshal(b, &parsed); err != nil {
		t.Fatal(err)
	}
	var alerts []alertRule
	for _, g := range parsed {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r)
			}
		}
	}
	if len(alerts) == 0 {
		t.Fatal("deploy/monitoring/alerts.yaml has no alerting rule")
	}
	return alerts
}

// checkAlertTestsCover fails the test unless every alert has the two test groups that
// alerts_test_rules.yaml describes, and every test group tests an alert of the file:
//   - "<alert> fires": the alert's expression is false at S - interval and true at S; the alert
//     does not fire at S + for - interval and fires at S + for, with the rule's labels and every
//     annotation it has;
//   - "<alert> stays silent": the alert is expected to be silent at every evaluation tested, the
//     last of them no earlier than S + for.
func checkAlertTestsCover(t *testing.T, alerts []alertRule, testFile []byte) {
	t.Helper()
	var file ruleTestFile
	if err := yaml.Unmarshal(testFile, &file); err != nil {
		t.Fatalf("alerts_test_rules.yaml: %v", err)
	}
	interval := duration(t, "evaluation_interval", file.EvaluationInterval)
	var names []string
	for _, a := range alerts {
		names = append(names, a.Alert+" fires", a.Alert+" stays silent")
	}
	groups := map[string]ruleTests{}
	for _, g := range file.Tests {
		if !slices.Contains(names, g.Name) {
			t.Errorf("alerts_test_rules.yaml: test group %q is not \"<alert> fires\" or \"<alert> stays silent\" for an alert of deploy/monitoring/alerts.yaml", g.Name)
		}
		groups[g.Name] = g
	}
	for _, a := range alerts {
		fires, ok := groups[a.Alert+" fires"]
		if !ok {
			t.Errorf("alerts_test_rules.yaml has no test group %q", a.Alert+" fires")
			continue
		}
		firesAt, err := checkFires(a, fires, interval, duration(t, a.Alert+" for", a.For))
		if err != nil {
			t.Errorf("alerts_test_rules.yaml, %s fires: %v", a.Alert, err)
		}
		silent, ok := groups[a.Alert+" stays silent"]
		if !ok {
			t.Errorf("alerts_test_rules.yaml has no test group %q", a.Alert+" stays silent")
			continue
		}
		var latest time.Duration
		for _, c := range silent.AlertTest {
			if c.Alertname != a.Alert {
				continue
			}
			if len(c.ExpAlerts) > 0 {
				t.Errorf("alerts_test_rules.yaml, %s stays silent: expects the alert at %s", a.Alert, c.EvalTime)
			}
			at, err := model.ParseDuration(c.EvalTime)
			if err != nil {
				t.Fatalf("alerts_test_rules.yaml, %s stays silent: %v", a.Alert, err)
			}
			latest = max(latest, time.Duration(at))
		}
		if latest < firesAt {
			t.Errorf("alerts_test_rules.yaml, %s stays silent: the last evaluation tested (%s) is earlier than the one it fires at in the other group (%s)", a.Alert, latest, firesAt)
		}
	}
}

// checkFires checks the group "<alert> fires" as checkAlertTestsCover says, and returns when the
// alert fires.
func checkFires(a alertRule, g ruleTests, interval, forDuration time.Duration) (time.Duration, error) {
	exprAt := map[time.Duration]bool{} // evaluation time: the expression returns a sample
	for _, e := range g.ExprTest {
		if strings.TrimSpace(e.Expr) == strings.TrimSpace(a.Expr) {
			at, err := model.ParseDuration(e.EvalTime)
			if err != nil {
				return 0, err
			}
			exprAt[time.Duration(at)] = len(e.ExpSamples) > 0
		}
	}
	firingAt := map[time.Duration]bool{}
	var firesAt time.Duration
	for _, c := range g.AlertTest {
		if c.Alertname != a.Alert {
			continue
		}
		at, err := model.ParseDuration(c.EvalTime)
		if err != nil {
			return 0, err
		}
		firingAt[time.Duration(at)] = len(c.ExpAlerts) > 0
		if len(c.ExpAlerts) == 0 {
			continue
		}
		firesAt = time.Duration(at)
		for _, exp := range c.ExpAlerts {
			for k, v := range a.Labels {
				if exp.ExpLabels[k] != v {
					return 0, fmt.Errorf("at %s the alert is expected without its label %s=%s", c.EvalTime, k, v)
				}
			}
			for k := range a.Annotations {
				if _, ok := exp.ExpAnnotations[k]; !ok {
					return 0, fmt.Errorf("at %s the alert is expected without its annotation %s", c.EvalTime, k)
				}
			}
		}
	}
	if firesAt == 0 {
		return 0, fmt.Errorf("no evaluation expects the alert")
	}
	turnsTrue := firesAt - forDuration
	if wasFalse, tested := exprAt[turnsTrue-interval]; !tested || wasFalse || !exprAt[turnsTrue] {
		return 0, fmt.Errorf("no promql_expr_test of the alert's expression shows it turning true at %s (empty at %s, a sample at %s), its for (%s) before the alert fires at %s",
			turnsTrue, turnsTrue-interval, turnsTrue, forDuration, firesAt)
	}
	if firing, tested := firingAt[firesAt-interval]; !tested || firing {
		return 0, fmt.Errorf("no evaluation expects the alert silent at %s, one evaluation before it fires", firesAt-interval)
	}
	return firesAt, nil
}

func duration(t *testing.T, what, s string) time.Duration {
	t.Helper()
	d, err := model.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("%s %q: not a positive duration: %v", what, s, err)
	}
	return time.Duration(d)
}

// checkScrapesKeepKeyrollLabels: both ServiceMonitors (deploy/monitoring's and the chart's) honor
// the scraped labels. keyroll's metrics name a RedisCluster by its namespace and name; without
// honorLabels, Prometheus would overwrite namespace with the metrics Service's (keyroll-system, the
// RedisCluster's moving to exported_namespace), and the alerts would name the wrong cluster.
func checkScrapesKeepKeyrollLabels(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "monitoring", "servicemonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	monitoring, err := render.Decode(string(b))
	if err != nil {
		t.Fatal(err)
	}
	chart, err := render.HelmTemplate(t, "keyroll", "keyroll-system", "--set", "metrics.serviceMonitor.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	monitors := map[string][]*unstructured.Unstructured{
		"deploy/monitoring/servicemonitor.yaml": render.Find(monitoring, "ServiceMonitor", ""),
		"the chart":                             render.Find(chart, "ServiceMonitor", ""),
	}
	for where, sms := range monitors {
		if len(sms) == 0 {
			t.Errorf("%s has no ServiceMonitor", where)
		}
		for _, sm := range sms {
			endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			for _, e := range endpoints {
				if honor, _ := e.(map[string]any)["honorLabels"].(bool); !honor {
					t.Errorf("%s: ServiceMonitor %s scrapes port %v without honorLabels: true, so the alerts' namespace label would be keyroll-system's", where, sm.GetName(), e.(map[string]any)["port"])
				}
			}
		}
	}
}

// run runs a tool and returns what it printed, both streams.
func run(bin string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
