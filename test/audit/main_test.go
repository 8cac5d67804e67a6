// Package audit scores keyroll's manifests with kube-score (built by test/tools): the kustomize
// tree (deploy/default), the Helm chart with its default values, and the objects keyroll itself
// renders for deploy/samples, read back from a real API server where the operator, running in this
// process against Vault, Redis and External Secrets Operator, created them. Every finding must be
// fixed or listed in skips.yaml with its reason.
package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	ground *testground.Ground
	k8s    client.Client
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	for _, tool := range []string{"kube-score", "helm"} {
		if _, err := testground.Binary(tool); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	g, c, stop, err := harness.StartPackage(testground.Options{Workloads: true, Redis: true, Vault: true, ExternalSecrets: true}, setupVault)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	ground, k8s = g, c
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	op, err := harness.Start(ctx, g, harness.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the operator: %v\n", err)
		return 1
	}
	defer func() { _ = op.Stop() }()
	if err := applySamples(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "applying deploy/samples: %v\n", err)
		return 1
	}
	return m.Run()
}

// setupVault gives the samples what they need, as the playground does: Redis roles orders and
// payments, the operator's Kubernetes auth, and External Secrets Operator's for the payments
// generator (service account external-secrets in default).
func setupVault(ctx context.Context, g *testground.Ground) error {
	err := harness.SetupVault(ctx, g,
		testground.RedisRole{Name: "orders", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour},
		testground.RedisRole{Name: "payments", DefaultTTL: 10 * time.Minute, MaxTTL: time.Hour})
	if err != nil {
		return err
	}
	policy, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "vault", "external-secrets-policy.hcl"))
	if err != nil {
		return err
	}
	if err := g.Vault.WritePolicy(ctx, "external-secrets", string(policy)); err != nil {
		return err
	}
	if err := g.CP.EnsureServiceAccount(ctx, "default", "external-secrets"); err != nil {
		return err
	}
	return g.Vault.WriteKubernetesAuthRole(ctx, testground.KubernetesAuthRole{
		Name: "external-secrets", ServiceAccounts: []string{"external-secrets"}, Namespaces: []string{"default"},
		Policies: []string{"external-secrets"}, TokenTTL: time.Hour,
	})
}

// applySamples applies deploy/samples with the Vault addresses pointed at the ground's Vault.
func applySamples(ctx context.Context) error {
	objs, err := render.Kustomize("samples")
	if err != nil {
		return err
	}
	for _, o := range objs {
		switch {
		case o.GetKind() == "VaultConnection":
			_ = unstructured.SetNestedField(o.Object, ground.Vault.Addr, "spec", "address")
		case strings.HasPrefix(o.GetAPIVersion(), "generators.external-secrets.io"):
			_ = unstructured.SetNestedField(o.Object, ground.Vault.Addr, "spec", "provider", "server")
		}
		if err := k8s.Patch(ctx, o, client.Apply, client.FieldOwner("keyroll-audit"), client.ForceOwnership); err != nil {
			return fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}
