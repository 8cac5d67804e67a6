// Package audit scores keyroll's manifests with kube-score (built by test/tools): the kustomize
// tree (deploy/default), the Helm chart with its default values, and the objects keyroll itself
// renders for deploy/samples, read back from a real API server where the operator, running in this
// process against Vault, Redis and External Secrets Operator, created them. Every finding must be
// fixed or listed in skips.yaml with its reason. Trivy's configuration checks audit the kustomize
// tree, the chart and the OLM bundle the same way (trivy_test.go, trivy-skips.yaml), and promtool
// checks and unit-tests the alerts of deploy/monitoring (alerts_test.go).
package audit

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

func TestMain(m *testing.M) {
	for _, tool := range []string{"kube-score", "helm"} {
		if _, err := testground.Binary(tool); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	// deploy/samples have fixed names (namespace default, VaultConnection vault, roles orders and
	// payments): nothing is prefixed.
	fw = framework.New(framework.Config{
		Name:   "",
		Ground: testground.Options{Workloads: true, Redis: true, Vault: true, ExternalSecrets: true},
		Roles: []testground.RedisRole{
			{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
			{Name: "payments", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		},
		Setup:    setup,
		Operator: &framework.OperatorOptions{},
	})
	os.Exit(fw.Run(m))
}

// setup gives the samples the rest of what they need, as the playground does (the framework wrote
// the Redis roles orders and payments and the operator's Kubernetes auth): External Secrets
// Operator's Kubernetes auth for the payments generator (service account external-secrets in
// default); then it applies deploy/samples with the Vault addresses pointed at the ground's Vault.
func setup(ctx context.Context, f *framework.Framework) error {
	if err := f.WriteExternalSecretsPolicy(ctx, "external-secrets"); err != nil {
		return err
	}
	if err := f.ExternalSecretsAuth(ctx, "default", "external-secrets", "external-secrets", time.Hour); err != nil {
		return err
	}
	if _, err := framework.ApplySamples(ctx, f.Client, f.Ground.Vault.Addr, "keyroll-audit"); err != nil {
		return fmt.Errorf("applying deploy/samples: %w", err)
	}
	return nil
}
