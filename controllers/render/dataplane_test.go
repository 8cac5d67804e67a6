package render

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// templateVariants are specs that render different Redis pod templates: the contract covers each.
func templateVariants() map[string]*v1beta1.RedisCluster {
	base := testCluster
	storage := base()
	storage.Spec.Storage = &v1beta1.StorageSpec{Size: resource.MustParse("1Gi")}
	single := base()
	single.Spec.Replicas = 1
	resources := base()
	resources.Spec.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}}
	spread := base()
	spread.Spec.PodAntiAffinity = v1beta1.PodAntiAffinityRequired
	restart := base()
	restart.Spec.Rollout.RedisPods = v1beta1.RedisPodsRestart
	plugin := base()
	plugin.Spec.VaultPlugin = &v1beta1.VaultPluginSpec{Username: "vault"}
	return map[string]*v1beta1.RedisCluster{"default": base(), "storage": storage, "single": single,
		"resources": resources, "spread": spread, "restart": restart, "vaultPlugin": plugin}
}

// v010Hashes are the pod-template hashes keyroll v0.1.0 wrote for templateVariants with the probe
// image testProbeImage (computed by that release's own PodTemplateHash).
var v010Hashes = map[string]string{
	"default": "d36298a13af1af2a", "resources": "c6fa13596cd5ffb6", "restart": "d36298a13af1af2a", "single": "d36298a13af1af2a",
	"spread": "d046162375b278fc", "storage": "5666b35fe7042dd9", "vaultPlugin": "d36298a13af1af2a",
}

// dataPlaneDigests records, for each data-plane version, a digest of the templates it renders for
// templateVariants (their hashes, the probe image apart).
var dataPlaneDigests = map[int]string{1: "276a805033314ed8"}

func variantHashes(t *testing.T, hash func(corev1.PodTemplateSpec) string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, rc := range templateVariants() {
		tmpl := StatefulSet(rc, "v", testProbeImage).Spec.Template
		tmpl.Annotations = nil // the hash is of the template before its annotations are set
		out[name] = hash(tmpl)
	}
	return out
}

// TestDataPlaneVersionNamesTheTemplate: for the same spec, the Redis pod template changes only with
// DataPlaneVersion (and DataPlaneChanges says what changed): an upgrade that keeps the version
// restarts no Redis pod, so a change of the template under the same version fails here.
func TestDataPlaneVersionNamesTheTemplate(t *testing.T) {
	hashes := variantHashes(t, PodTemplateHash)
	var b strings.Builder
	for _, name := range []string{"default", "storage", "single", "resources", "spread", "restart", "vaultPlugin"} {
		fmt.Fprintf(&b, "%s=%s;", name, hashes[name])
	}
	sum := sha256.Sum256([]byte(b.String()))
	got := hex.EncodeToString(sum[:8])
	want, ok := dataPlaneDigests[DataPlaneVersion]
	if !ok || got != want {
		t.Errorf("data plane %d renders templates of digest %s, recorded %q: the Redis pod template changed for the same spec. "+
			"Raise DataPlaneVersion, say in DataPlaneChanges what the pods get, and record the digest for the new version", DataPlaneVersion, got, want)
	}
	for v := 2; v <= DataPlaneVersion; v++ {
		if DataPlaneChanges[v] == "" {
			t.Errorf("DataPlaneChanges does not say what data plane %d changed", v)
		}
	}
}

// TestLegacyHashIsTheOneV010Wrote: LegacyPodTemplateHash of today's template, with the pod's probe
// image, is the hash keyroll v0.1.0 wrote on the pods it made: such pods run data plane 1 and are
// left alone by an upgrade. It holds while DataPlaneVersion is 1; the version that follows
// renders other templates, restarts v0.1.0's pods in the maintenance window, and drops this test.
func TestLegacyHashIsTheOneV010Wrote(t *testing.T) {
	got := variantHashes(t, func(tmpl corev1.PodTemplateSpec) string { return LegacyPodTemplateHash(tmpl, testProbeImage) })
	for name, want := range v010Hashes {
		if got[name] != want {
			t.Errorf("%s: legacy hash %s, keyroll v0.1.0 wrote %s", name, got[name], want)
		}
	}
	if len(v010Hashes) != len(got) {
		t.Errorf("v0.1.0's hashes are recorded for %d variants of %d", len(v010Hashes), len(got))
	}
}
