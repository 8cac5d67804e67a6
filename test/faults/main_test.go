// Package faults is keyroll's fault matrix: the operator, built from main.go and run as its own
// process, is killed with SIGKILL at named steps (controllers/stoppoint) and restarted; Vault is
// cut off, blackholed and sealed through the ground's proxy; and each row checks, counting the
// leases in Vault as root before and after, that no lease is lost or leaked and no credential is
// issued twice where one was due. The Redis pods run on the ground's real node; consumers are
// kwok's stand-ins. Each row prints its measured outcome; TestMain prints the matrix, and writes
// it into docs/reliability.md when KEYROLL_RELIABILITY_DOC names that file (make reliability).
package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"testing"

	vaultapi "github.com/hashicorp/vault/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	ground *testground.Ground
	k8s    client.Client
	// operatorBin is keyroll's manager binary, built once for the package.
	operatorBin string
	// auditLog is the Vault audit device's file.
	auditLog string
)

// The Vault roles of the rows: each row issues from its own, so that its leases can be counted
// in Vault apart from the others'.
var roles = []testground.RedisRole{
	{Name: "f-issue", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-issue-report", DefaultTTL: 30 * time.Second, MaxTTL: time.Hour},
	{Name: "f-ledger", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-secret", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-rollout", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-revoke", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-revoked", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-leader", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-outage", DefaultTTL: 2 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-blackhole", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-healthy", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-sealed", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-source-a", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-source-b", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-stalled", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-status-500", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-status-504", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-status-refused", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-delete", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-delete-down", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	g, c, stop, err := harness.StartPackage(testground.Options{Node: true, Workloads: true, Redis: true, Vault: true}, setupVault)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	ground, k8s = g, c
	if operatorBin, err = harness.BuildOperator(g.Dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if live, orphans, err := orphansLeft(); err != nil || len(orphans) > 0 {
		fmt.Fprintf(os.Stderr, "after the matrix: leases in Vault that no ledger holds: %v (%v)\n", orphans, err)
		code = 1
	} else {
		matrix.note(fmt.Sprintf("Across the matrix: %d leases live in Vault at the end, every one in a RedisCluster's ledger (0 that no ledger holds).", live))
	}
	summary, leaks := scanLogs()
	matrix.note(summary)
	if len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "secret values found in the operators' logs: %v\n", leaks)
		code = 1
	}
	if code != 0 { // kept for the diagnosis, outside the ground's directory, which goes with it
		logFile := filepath.Join(os.TempDir(), "keyroll-faults-operators.log")
		if err := os.WriteFile(logFile, []byte(logs.text()), 0o600); err == nil {
			fmt.Fprintf(os.Stderr, "the operators' logs: %s\n", logFile)
		}
	}
	fmt.Println(matrix.markdown())
	if doc := os.Getenv("KEYROLL_RELIABILITY_DOC"); doc != "" && code == 0 {
		if err := matrix.writeInto(doc); err != nil {
			fmt.Fprintf(os.Stderr, "writing the matrix into %s: %v\n", doc, err)
			return 1
		}
	}
	return code
}

// setupVault gives the operator what a Vault administrator would (deploy/vault/policy.hcl), and
// the opt-in policy of the orphan-lease sweep (deploy/vault/sweeper-policy.hcl).
func setupVault(ctx context.Context, g *testground.Ground) error {
	if err := harness.SetupVault(ctx, g, roles...); err != nil {
		return err
	}
	var hcl []byte
	for _, f := range []string{"policy.hcl", "sweeper-policy.hcl"} {
		b, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "vault", f))
		if err != nil {
			return err
		}
		hcl = append(append(hcl, b...), '\n')
	}
	if err := g.Vault.WritePolicy(ctx, harness.OperatorRole, string(hcl)); err != nil {
		return err
	}
	// Every request Vault answers, for counting issues exactly (auditIssues).
	auditLog = filepath.Join(g.Dir, "vault-audit.log")
	return g.Vault.Root.Sys().EnableAuditWithOptionsWithContext(ctx, "file", &vaultapi.EnableAuditOptions{
		Type: "file", Options: map[string]string{"file_path": auditLog},
	})
}
