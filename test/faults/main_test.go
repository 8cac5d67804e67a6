// Package faults is keyroll's fault matrix: the operator, built from main.go and run as its own
// process, is killed with SIGKILL at named steps (controllers/stoppoint) and restarted; Vault is
// cut off, blackholed and sealed through the ground's proxy; and each row checks, counting the
// leases in Vault as root before and after, that no lease is lost or leaked and no credential is
// issued twice where one was due. The Redis pods run on the ground's real node; consumers are
// kwok's stand-ins. A row's RedisClusters are deleted when it ends (test/framework's namespace
// cleanup): an operator of a later row revokes their leases, which stay in their ledgers until one
// does (or for good, when their Vault was a row's proxy). Each row prints its measured outcome;
// TestMain checks that no lease is left that no ledger holds and that no secret value was logged,
// prints the matrix, and writes it into docs/reliability.md when KEYROLL_RELIABILITY_DOC names
// that file (make reliability).
package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	fw *framework.Framework
	// operatorBin is keyroll's manager binary, built once for the package.
	operatorBin string
	// auditLog is the file of the package's Vault audit device.
	auditLog string
)

// The Vault roles of the rows, named without the package's prefix (fw.Role and fw.Path add it):
// each row issues from its own, so that its leases can be counted in Vault apart from the others'.
// A row's namespace and VaultConnection have its role's base name.
var roles = []testground.RedisRole{
	{Name: "f-issue", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	// TestHugeClientNamesDoNotHurtTheManager: the cluster whose clients have huge names, and
	// another whose short leases must go on being renewed meanwhile.
	{Name: "f-hugenames", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-hugenames-other", DefaultTTL: 30 * time.Second, MaxTTL: time.Hour},
	{Name: "f-issue-report", DefaultTTL: 30 * time.Second, MaxTTL: time.Hour},
	{Name: "f-intents", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
	{Name: "f-nsid.orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
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
	fw = framework.New(framework.Config{
		Name:   "faults",
		Ground: testground.Options{Node: true, Workloads: true, Redis: true, Vault: true},
		Roles:  roles,
		Setup:  setup,
		// A row seals Vault, and the matrix counts every credential Vault issued on its roles.
		OwnVault: true,
		Teardown: func(_ context.Context, _ *framework.Framework, code int) int { return endOfMatrix(code) },
	})
	os.Exit(fw.Run(m))
}

// endOfMatrix checks, once every row ran, that no lease is left that no ledger holds and that no
// secret value reached the operators' logs; prints the matrix, and writes it into
// KEYROLL_RELIABILITY_DOC when that names a file and everything passed. It returns the exit code.
func endOfMatrix(code int) int {
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

// setup gives the operator, besides what fw.SetupVault gave it (deploy/vault/policy.hcl), the
// opt-in policy of the orphan-lease sweep (deploy/vault/sweeper-policy.hcl); enables Vault's audit
// device, which records every request Vault answers, for counting issues exactly
// (framework.AuditIssues); and builds the operator.
func setup(ctx context.Context, f *framework.Framework) (err error) {
	if err := f.WriteOperatorPolicy(ctx, "policy.hcl", "sweeper-policy.hcl"); err != nil {
		return err
	}
	if auditLog, err = f.EnableAudit(ctx); err != nil {
		return err
	}
	operatorBin, err = framework.BuildOperator(f.Ground.Dir)
	return err
}
