package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// TestBundleValidates runs the operator-framework validators (the default bundle suite and the
// OperatorHub one, built by test/tools as olm-validate) on the committed bundle, for the test
// ground's Kubernetes version: no error. Warnings are logged.
func TestBundleValidates(t *testing.T) {
	bin, err := testground.Binary("olm-validate")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, filepath.Join(testground.RepoRoot(), "bundle"), strings.TrimPrefix(render.KubeVersion, "v")).CombinedOutput()
	t.Logf("olm-validate:\n%s", out)
	if err != nil {
		t.Fatalf("the bundle does not validate: %v", err)
	}
	if !strings.Contains(string(out), "2 CRDs, CSV "+Package+".v") {
		t.Errorf("olm-validate did not load the bundle's CSV and both CRDs")
	}
}

// The generated CSV carries the manager's Deployment, its permissions, the samples and the
// conversion webhook, whose certificate OLM keeps (the bundle has no webhook Service of its own).
func TestClusterServiceVersionCarriesTheInstall(t *testing.T) {
	files, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	csv := string(files["bundle/manifests/"+Package+".clusterserviceversion.yaml"])
	for _, want := range []string{"name: keyroll-manager", "serviceAccountName: keyroll-manager", "clusterPermissions:", "permissions:",
		"redisclusters", "vaultconnections", `"kind": "RedisCluster"`, `"kind": "VaultConnection"`, "minKubeVersion: 1.30.0", "AllNamespaces",
		"webhookdefinitions:", "type: ConversionWebhook", "webhookPath: /convert", "- redisclusters.keyroll.dev", "--webhook-certificate=olm"} {
		if !strings.Contains(csv, want) {
			t.Errorf("the CSV lacks %q", want)
		}
	}
	if _, ok := files["bundle/manifests/keyroll-service-keyroll-webhook.yaml"]; ok {
		t.Error("the bundle has keyroll's webhook Service; OLM makes its own")
	}
}
