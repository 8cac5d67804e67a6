package integration

import (
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/keyroll/keyroll/test/framework"
)

// value finds the metric of a family whose labels include the given ones.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetricsAreServedAndMoveWithTheLease(t *testing.T) {
	ns := fw.Namespace(t, "metrics")
	vc := fw.VaultConnection(t, "vault-metrics", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("short"))
	cur := fw.WaitReady(t, rc, 60*time.Second)
	fw.WaitConnectionReady(t, vc.Name, 30*time.Second)

	// The operator's /metrics (a test that ran before may have restarted the operator, on new ports).
	fams, err := framework.ScrapeMetrics(fw.Operator().MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]dto.MetricType{
		"keyroll_lease_expiry_seconds":           dto.MetricType_GAUGE,
		"keyroll_credential_issues_total":        dto.MetricType_COUNTER,
		"keyroll_vault_request_duration_seconds": dto.MetricType_HISTOGRAM,
		"keyroll_vault_token_expiry_seconds":     dto.MetricType_GAUGE,
		"keyroll_pods_on_superseded_credential":  dto.MetricType_GAUGE,
	}
	for name, typ := range types {
		if f := fams[name]; f == nil || f.GetType() != typ {
			t.Errorf("metric %s missing or not a %s", name, typ)
		}
	}
	cluster := map[string]string{"namespace": ns, "name": "orders"}
	expiry, ok := value(fams, "keyroll_lease_expiry_seconds", cluster)
	want := time.Until(cur.Status.Credential.Lease.ExpiresAt.Time).Seconds()
	if !ok || math.Abs(expiry-want) > 3 || expiry > 20 {
		t.Errorf("keyroll_lease_expiry_seconds %v (found %v), want about %.1f", expiry, ok, want)
	}
	if v, ok := value(fams, "keyroll_vault_token_expiry_seconds", map[string]string{"connection": vc.Name}); !ok || v <= 0 {
		t.Errorf("keyroll_vault_token_expiry_seconds for %s: %v (found %v)", vc.Name, v, ok)
	}
	if v, ok := value(fams, "keyroll_vault_request_duration_seconds", map[string]string{"operation": "issue"}); !ok || v < 1 {
		t.Errorf("no issue request in keyroll_vault_request_duration_seconds: %v", v)
	}
	for name := range fams {
		for _, m := range fams[name].Metric {
			for _, l := range m.Label {
				if l.GetName() == "lease" || l.GetValue() == cur.Status.Credential.Lease.LeaseID {
					t.Errorf("metric %s carries a lease id", name)
				}
			}
		}
	}

	// The 20 s lease is renewed: the renewal counter moves and the expiry gauge follows the lease.
	renewed, _ := value(fams, "keyroll_lease_renewals_total", map[string]string{"result": "success"})
	framework.Eventually(t, 30*time.Second, func() string {
		if fw.Get(t, rc).Status.Credential.Lease.LastRenewal == nil {
			return "not renewed yet"
		}
		return ""
	})
	cur = fw.Get(t, rc)
	if fams, err = framework.ScrapeMetrics(fw.Operator().MetricsURL); err != nil {
		t.Fatal(err)
	}
	if v, _ := value(fams, "keyroll_lease_renewals_total", map[string]string{"result": "success"}); v <= renewed {
		t.Errorf("keyroll_lease_renewals_total{result=success} %v after a renewal, was %v", v, renewed)
	}
	expiry, _ = value(fams, "keyroll_lease_expiry_seconds", cluster)
	if want := time.Until(cur.Status.Credential.Lease.ExpiresAt.Time).Seconds(); math.Abs(expiry-want) > 3 {
		t.Errorf("after the renewal keyroll_lease_expiry_seconds is %v, want about %.1f", expiry, want)
	}
	t.Logf("lease expires in %.1f s after the renewal", expiry)
}

func TestProbesAnswerAndReadinessWaitsForTheCaches(t *testing.T) {
	// The running operator's probes (a test that ran before may have restarted it, on new ports).
	probesURL := fw.Operator().ProbesURL
	framework.Eventually(t, 30*time.Second, func() string {
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(probesURL + path)
			if err != nil {
				return err.Error()
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return path + ": " + resp.Status
			}
		}
		return ""
	})
	resp, err := http.Get(probesURL + "/readyz?verbose")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "[+]caches-synced ok") {
		t.Errorf("/readyz does not check the caches:\n%s", body)
	}
}
