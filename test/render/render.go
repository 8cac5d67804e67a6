// Package render renders keyroll's manifests as its users install them: kustomize over a directory
// of deploy/ (`kubectl apply -k`) and the Helm chart through the helm CLI that test/tools builds
// (`helm template`), for the tests that check, audit and apply them.
package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/test/testground"
)

// KubeVersion is the Kubernetes version of the test ground, which helm renders and lints for.
const KubeVersion = "v1.37.2"

// Chart is the path of keyroll's Helm chart.
func Chart() string { return filepath.Join(testground.RepoRoot(), "deploy", "helm", "keyroll") }

// Kustomize renders a directory of deploy/ as `kubectl apply -k` does.
func Kustomize(dir string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(testground.RepoRoot(), "deploy", dir))
	if err != nil {
		return nil, fmt.Errorf("kustomize deploy/%s: %w", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, err
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs, nil
}

// Helm runs the helm CLI of the test ground with args, with its configuration, cache and data in
// a temporary directory of the test (never the user's), and returns what it printed. env is
// added to the environment (KUBECONFIG=... for commands that talk to a cluster).
func Helm(t testing.TB, env []string, args ...string) (string, error) {
	t.Helper()
	bin, err := testground.Binary("helm")
	if err != nil {
		return "", err
	}
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// HelmTemplate renders the chart as `helm template RELEASE --namespace NAMESPACE --include-crds`
// with extra arguments (--set ..., -f ...), for the test ground's Kubernetes version.
func HelmTemplate(t testing.TB, release, namespace string, extra ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	args := append([]string{"template", release, Chart(), "--namespace", namespace, "--include-crds", "--kube-version", KubeVersion}, extra...)
	out, err := Helm(t, nil, args...)
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// Decode splits a multi-document YAML stream into objects, skipping empty documents.
func Decode(stream string) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		m := map[string]any{}
		if err := d.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

// InstallOrder sorts objects as an install succeeds: Namespaces and CRDs before what lives in them.
func InstallOrder(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	first := func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "Namespace" || o.GetKind() == "CustomResourceDefinition"
	}
	out := slices.Clone(objs)
	slices.SortStableFunc(out, func(a, b *unstructured.Unstructured) int {
		switch {
		case first(a) && !first(b):
			return -1
		case first(b) && !first(a):
			return 1
		}
		return 0
	})
	return out
}

// Find returns the objects of a kind, with a name if name is not empty.
func Find(objs []*unstructured.Unstructured, kind, name string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			out = append(out, o)
		}
	}
	return out
}

// WriteYAML writes objects as one multi-document YAML file.
func WriteYAML(path string, objs []*unstructured.Unstructured) error {
	var b bytes.Buffer
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		if err != nil {
			return err
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return os.WriteFile(path, b.Bytes(), 0o600)
}
