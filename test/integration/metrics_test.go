package integration

import (
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads the operator's /metrics.
func scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

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
	namespace(t, "metrics")
	vaultConnection(t, "vault-metrics", ground.Vault.Addr, "metrics")
	rc := redisCluster(t, "metrics", "orders", "vault-metrics", "database/creds/short")
	cur := waitReady(t, rc, 60*time.Second)
	waitConnectionReady(t, "vault-metrics")

	fams := scrape(t)
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
	cluster := map[string]string{"namespace": "metrics", "name": "orders"}
	expiry, ok := value(fams, "keyroll_lease_expiry_seconds", cluster)
	want := time.Until(cur.Status.Credential.ExpiresAt.Time).Seconds()
	if !ok || math.Abs(expiry-want) > 3 || expiry > 20 {
		t.Errorf("keyroll_lease_expiry_seconds %v (found %v), want about %.1f", expiry, ok, want)
	}
	if v, ok := value(fams, "keyroll_vault_token_expiry_seconds", map[string]string{"connection": "vault-metrics"}); !ok || v <= 0 {
		t.Errorf("keyroll_vault_token_expiry_seconds for vault-metrics: %v (found %v)", v, ok)
	}
	if v, ok := value(fams, "keyroll_vault_request_duration_seconds", map[string]string{"operation": "issue"}); !ok || v < 1 {
		t.Errorf("no issue request in keyroll_vault_request_duration_seconds: %v", v)
	}
	for name := range fams {
		for _, m := range fams[name].Metric {
			for _, l := range m.Label {
				if l.GetName() == "lease" || l.GetValue() == cur.Status.Credential.LeaseID {
					t.Errorf("metric %s carries a lease id", name)
				}
			}
		}
	}

	// The 20 s lease is renewed: the renewal counter moves and the expiry gauge follows the lease.
	renewed, _ := value(fams, "keyroll_lease_renewals_total", map[string]string{"result": "success"})
	eventually(t, 30*time.Second, func() string {
		if get(t, rc).Status.Credential.LastRenewal == nil {
			return "not renewed yet"
		}
		return ""
	})
	cur = get(t, rc)
	fams = scrape(t)
	if v, _ := value(fams, "keyroll_lease_renewals_total", map[string]string{"result": "success"}); v <= renewed {
		t.Errorf("keyroll_lease_renewals_total{result=success} %v after a renewal, was %v", v, renewed)
	}
	expiry, _ = value(fams, "keyroll_lease_expiry_seconds", cluster)
	if want := time.Until(cur.Status.Credential.ExpiresAt.Time).Seconds(); math.Abs(expiry-want) > 3 {
		t.Errorf("after the renewal keyroll_lease_expiry_seconds is %v, want about %.1f", expiry, want)
	}
	t.Logf("lease expires in %.1f s after the renewal", expiry)
}

func TestProbesAnswerAndReadinessWaitsForTheCaches(t *testing.T) {
	eventually(t, 30*time.Second, func() string {
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
