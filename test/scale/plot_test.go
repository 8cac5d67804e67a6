package scale

// The side-by-side's figures: what they are counted from (Vault's audit log, /proc), and how they
// are printed, put in a table and plotted.

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/keyroll/keyroll/test/framework"
)

// variant is what one controller did for N credentials on a ground of its own.
type variant struct {
	name string
	// ready is keyroll's time until all RedisClusters were CredentialsReady (zero for ESO).
	ready time.Duration
	// secrets is the time until all N credentials were in Secrets.
	secrets time.Duration
	vault   vaultCalls
	// writes are the controller's API writes (its rest_client_requests_total).
	writes float64
	usage  framework.Usage
	// aclUsers are keyroll's ACL Secrets whose aclfile held the credential's user at the end.
	aclUsers int
}

// sideResult is one N: keyroll, ESO at its default flags, ESO at esoScaleFlags.
type sideResult struct {
	n                       int
	keyroll, eso, esoScaled variant
}

// vaultCalls are what Vault's audit log holds from the moment the device was enabled: successful
// reads of the role's credential path (issues), successful Kubernetes-auth logins, and all
// requests.
type vaultCalls struct{ issues, logins, requests int }

// countVault counts, in the audit log at path, Vault's calls (its issues as framework.AuditIssues counts them).
func countVault(b *testing.B, path string) vaultCalls {
	b.Helper()
	entries, err := framework.ReadAudit(path)
	if err != nil {
		b.Fatal(err)
	}
	var c vaultCalls
	for _, e := range entries {
		switch {
		case e.Type == "request":
			c.requests++
		case e.Type != "response" || e.Error != "":
		case e.Issued(credPath):
			c.issues++
		case e.Request.Path == "auth/kubernetes/login":
			c.logins++
		}
	}
	return c
}

// report prints one N's figures and reports them as the benchmark's metrics.
func (s sideResult) report(b *testing.B) {
	b.Helper()
	k := s.keyroll
	b.ReportMetric(k.ready.Seconds(), "keyroll-s-to-all-CredentialsReady")
	fmt.Printf("side: N=%d  keyroll  all CredentialsReady %.1f s  all state Secrets %.1f s (<name>-keyroll, where keyroll stages the credential "+
		"after its issue, before any node or consumer has it: on kwok no Redis node accepts the user, so neither the consumers' Secret "+
		"nor the ACL Secret gets it; %d/%d ACL Secrets held the user)  %s\n", s.n, k.ready.Seconds(), k.secrets.Seconds(), k.aclUsers, s.n, k.figures(s.n))
	for _, v := range []variant{k, s.eso, s.esoScaled} {
		b.ReportMetric(v.secrets.Seconds(), v.name+"-s-to-all-Secrets")
		b.ReportMetric(float64(v.vault.issues)/float64(s.n), v.name+"-vault-issues/credential")
		b.ReportMetric(mib(v), v.name+"-peak-RSS-MiB")
		b.ReportMetric(v.usage.CPU.Seconds(), v.name+"-cpu-s")
		if v.name == k.name {
			continue
		}
		fmt.Printf("side: N=%d  %s  all Secrets %.1f s  %s\n", s.n, v.name, v.secrets.Seconds(), v.figures(s.n))
		fmt.Printf("side: N=%d  keyroll/%s  time to all Secrets %.2f (CredentialsReady %.2f)  Vault requests %.2f  peak RSS %.2f  CPU %.2f\n",
			s.n, v.name, ratio(k.secrets.Seconds(), v.secrets.Seconds()), ratio(k.ready.Seconds(), v.secrets.Seconds()),
			ratio(float64(k.vault.requests), float64(v.vault.requests)), ratio(mib(k), mib(v)), ratio(k.usage.CPU.Seconds(), v.usage.CPU.Seconds()))
		b.ReportMetric(ratio(k.secrets.Seconds(), v.secrets.Seconds()), "time-keyroll/"+v.name)
	}
}

// figures are a variant's Vault calls, API writes and usage, as printed.
func (v variant) figures(n int) string {
	return fmt.Sprintf("Vault issues %d, logins %d, requests %d  API writes/credential %.1f  peak RSS %.0f MiB  CPU %.1f s",
		v.vault.issues, v.vault.logins, v.vault.requests, v.writes/float64(n), mib(v), v.usage.CPU.Seconds())
}

func mib(v variant) float64 { return float64(v.usage.PeakRSSBytes) / (1 << 20) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// sideBySideHead is the head of the side-by-side table of docs/performance.md.
const sideBySideHead = "| N | controller | all CredentialsReady | all Secrets | Vault issues / logins / requests | API writes per credential | peak RSS | CPU | keyroll/this: time to all Secrets, peak RSS |\n" +
	"|---|---|---|---|---|---|---|---|---|\n"

// sideBySideRows are the table's rows: for each N, keyroll, ESO at its defaults and ESO at
// esoScaleFlags. keyroll's "all Secrets" is its state Secrets (see sideKeyroll).
func sideBySideRows(results []sideResult) []string {
	var rows []string
	for _, s := range results {
		k := s.keyroll
		for _, v := range []variant{k, s.eso, s.esoScaled} {
			who, ready, vs := "ESO v0.20.4, default flags", "—", "—"
			switch v.name {
			case k.name:
				who, ready = "keyroll (state Secret)", fmt.Sprintf("%.1f s", k.ready.Seconds())
			case s.esoScaled.name:
				who = "ESO v0.20.4, `" + strings.Join(esoScaleFlags, " ") + "`"
			}
			if v.name != k.name {
				vs = fmt.Sprintf("%.2f, %.2f", ratio(k.secrets.Seconds(), v.secrets.Seconds()), ratio(mib(k), mib(v)))
			}
			rows = append(rows, fmt.Sprintf("| %d | %s | %s | %.1f s | %d / %d / %d | %.1f | %.0f MiB | %.1f s | %s |", s.n, who, ready,
				v.secrets.Seconds(), v.vault.issues, v.vault.logins, v.vault.requests, v.writes/float64(s.n), mib(v), v.usage.CPU.Seconds(), vs))
		}
	}
	return rows
}

// sideBySideTable is the whole table, head and rows.
func sideBySideTable(results []sideResult) string {
	return sideBySideHead + strings.Join(sideBySideRows(results), "\n") + "\n"
}

// writeSidePlot writes a PNG line plot to path of the times against N: keyroll's until all
// CredentialsReady and until all state Secrets, and ESO's (both variants) until all Secrets.
// Nothing is written when path is empty or there are no results.
func writeSidePlot(path string, results []sideResult) error {
	if path == "" || len(results) == 0 {
		return nil
	}
	line := func(pick func(sideResult) time.Duration) plotter.XYs {
		xys := make(plotter.XYs, len(results))
		for i, s := range results {
			xys[i].X, xys[i].Y = float64(s.n), pick(s).Seconds()
		}
		return xys
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Dynamic Redis credentials from one Vault role, on kwok (%d cores)", runtime.NumCPU())
	p.X.Label.Text = "N (RedisClusters / ExternalSecrets)"
	p.Y.Label.Text = "seconds until all N"
	p.Legend.Top, p.Legend.Left = true, true
	err := plotutil.AddLinePoints(p,
		"keyroll: all CredentialsReady", line(func(s sideResult) time.Duration { return s.keyroll.ready }),
		"keyroll: all credentials in Secrets (state Secret)", line(func(s sideResult) time.Duration { return s.keyroll.secrets }),
		"ESO v0.20.4, default flags: all Secrets", line(func(s sideResult) time.Duration { return s.eso.secrets }),
		"ESO v0.20.4, "+strings.Join(esoScaleFlags, " ")+": all Secrets", line(func(s sideResult) time.Duration { return s.esoScaled.secrets }),
	)
	if err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	p.Y.Min, p.X.Min = 0, 0
	p.Add(plotter.NewGrid())
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("saving the plot to %s: %w", path, err)
	}
	return nil
}
