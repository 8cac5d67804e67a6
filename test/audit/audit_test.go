package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// skip is an entry of skips.yaml: a kube-score check not enforced on some objects, and why.
type skip struct {
	Check string `json:"check"`
	// Source is where the objects come from: kustomize (deploy/default), helm (the chart with its
	// default values), keyroll (what keyroll renders for deploy/samples) or samples (the
	// Kubernetes objects of deploy/samples themselves, which users copy).
	Source []string `json:"source"`
	Kind   string   `json:"kind"`
	// Name of the objects; "*" is every object of the kind.
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// finding is a check that did not pass on one object.
type finding struct {
	source, kind, namespace, name, check, summary string
}

func (f finding) String() string {
	return fmt.Sprintf("%s: %s %s/%s: %s: %s", f.source, f.kind, f.namespace, f.name, f.check, f.summary)
}

// TestManifestsPassKubeScore scores the kustomize tree, the Helm chart, the objects keyroll
// renders for the samples and the samples' own workload objects with every kube-score check,
// optional ones included. A finding fails
// the test unless skips.yaml lists it with a reason, and a skip that matches nothing any more
// fails it too, so that the list says what is true.
func TestManifestsPassKubeScore(t *testing.T) {
	skips := loadSkips(t)
	kust, err := render.Kustomize("default")
	if err != nil {
		t.Fatal(err)
	}
	chart, err := render.HelmTemplate(t, "keyroll", "keyroll-system")
	if err != nil {
		t.Fatal(err)
	}
	samples, err := render.Kustomize("samples")
	if err != nil {
		t.Fatal(err)
	}
	samples = slices.DeleteFunc(samples, func(o *unstructured.Unstructured) bool { // keyroll's and ESO's kinds
		return strings.Contains(o.GroupVersionKind().Group, ".") && !strings.HasSuffix(o.GroupVersionKind().Group, ".k8s.io")
	})
	sources := map[string][]*unstructured.Unstructured{"kustomize": kust, "helm": chart, "keyroll": renderedForSamples(t), "samples": samples}
	used := make([]bool, len(skips))
	for _, source := range sourceNames {
		scored, findings := score(t, source, sources[source])
		for _, kind := range []string{"Deployment", "StatefulSet"} {
			if n := len(render.Find(sources[source], kind, "")); n > 0 && scored[kind] != n {
				t.Errorf("%s: kube-score scored %d of %d %s", source, scored[kind], n, kind)
			}
		}
		for _, f := range findings {
			if i := matching(skips, f); i >= 0 {
				used[i] = true
				t.Logf("skipped %s (%s)", f, skips[i].Reason)
				continue
			}
			t.Errorf("kube-score %s\n\tfix it, or list it in test/audit/skips.yaml with the reason", f)
		}
	}
	for i, s := range skips {
		if !used[i] {
			t.Errorf("test/audit/skips.yaml: %s on %s %s (%v) matches no finding any more: remove it", s.Check, s.Kind, s.Name, s.Source)
		}
	}
}

// sourceNames are the sources of the objects scored, as skips.yaml names them.
var sourceNames = []string{"kustomize", "helm", "keyroll", "samples"}

// loadSkips reads skips.yaml and checks that each entry names a real check and gives a reason.
func loadSkips(t *testing.T) []skip {
	t.Helper()
	b, err := os.ReadFile("skips.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var skips []skip
	if err := yaml.UnmarshalStrict(b, &skips); err != nil {
		t.Fatalf("skips.yaml: %v", err)
	}
	out, err := kubeScore("list")
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if id, _, ok := strings.Cut(line, ","); ok {
			checks[id] = true
		}
	}
	for _, s := range skips {
		if !checks[s.Check] {
			t.Errorf("skips.yaml: %q is not a kube-score check", s.Check)
		}
		if len(strings.TrimSpace(s.Reason)) < 20 || s.Kind == "" || s.Name == "" || len(s.Source) == 0 {
			t.Errorf("skips.yaml: %s needs a source, kind, name and a reason: %+v", s.Check, s)
		}
		for _, src := range s.Source {
			if !slices.Contains(sourceNames, src) {
				t.Errorf("skips.yaml: %s: unknown source %q", s.Check, src)
			}
		}
	}
	return skips
}

func matching(skips []skip, f finding) int {
	for i, s := range skips {
		if s.Check == f.check && slices.Contains(s.Source, f.source) && s.Kind == f.kind && (s.Name == "*" || s.Name == f.name) {
			return i
		}
	}
	return -1
}

// score runs every kube-score check over objects and returns how many objects of each kind it
// scored and the checks that did not pass.
func score(t *testing.T, source string, objs []*unstructured.Unstructured) (map[string]int, []finding) {
	t.Helper()
	file := filepath.Join(t.TempDir(), source+".yaml")
	if err := render.WriteYAML(file, objs); err != nil {
		t.Fatal(err)
	}
	// kube-score exits 1 when a check is critical; the JSON says which.
	out, _ := kubeScore("score", "--kubernetes-version", "v1.37", "--all-default-optional", "--output-format", "json", file)
	var scored []struct {
		TypeMeta   struct{ Kind string } `json:"type_meta"`
		ObjectMeta struct {
			Name, Namespace string
		} `json:"object_meta"`
		Checks []struct {
			Check struct {
				ID string `json:"id"`
			} `json:"check"`
			Grade    int  `json:"grade"`
			Skipped  bool `json:"skipped"`
			Comments []struct {
				Path, Summary string
			} `json:"comments"`
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &scored); err != nil {
		t.Fatalf("kube-score over %s: %v\n%s", source, err, out)
	}
	kinds := map[string]int{}
	var findings []finding
	for _, o := range scored {
		kinds[o.TypeMeta.Kind]++
		for _, c := range o.Checks {
			const allOK = 10 // kube-score's grades: 1 critical, 5 warning, 7 almost OK, 10 all OK
			if c.Skipped || c.Grade >= allOK {
				continue
			}
			var summaries []string
			for _, cm := range c.Comments {
				summaries = append(summaries, strings.TrimSpace(cm.Path+" "+cm.Summary))
			}
			findings = append(findings, finding{source: source, kind: o.TypeMeta.Kind, namespace: o.ObjectMeta.Namespace,
				name: o.ObjectMeta.Name, check: c.Check.ID, summary: strings.Join(summaries, "; ")})
		}
	}
	return kinds, findings
}

func kubeScore(args ...string) (string, error) {
	bin, err := testground.Binary("kube-score")
	if err != nil {
		return "", err
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if err != nil && errOut.Len() > 0 {
		err = fmt.Errorf("kube-score %s: %w: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), err
}

// renderedForSamples waits until keyroll has created every object of both sample RedisClusters
// (the Redis objects come before any credential; the ExternalSecret with the credential source)
// and reads back everything it created for them but the Secrets (which hold credentials, and
// which kube-score does not score). No Redis pod mounts a credential: of the Secrets keyroll and
// External Secrets Operator wrote for a sample, its StatefulSet mounts the ACL Secret only.
func renderedForSamples(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	// What each sample must have before it is read back: its objects, and the Secrets that hold a
	// credential or a password of keyroll's own users.
	type want struct{ gvk, name string }
	clusters := map[string][]want{
		"orders": {{"apps/v1/StatefulSet", "orders"}, {"v1/Secret", "orders-acl"}, {"v1/Secret", "orders-keyroll"}},
		"payments": {{"apps/v1/StatefulSet", "payments"}, {"v1/Secret", "payments-acl"}, {"v1/Secret", "payments-keyroll"},
			{"external-secrets.io/v1/ExternalSecret", "payments"}, {"v1/Secret", "payments-eso"}},
	}
	deadline := time.Now().Add(3 * time.Minute)
	for _, name := range []string{"orders", "payments"} {
		for _, w := range clusters[name] {
			o := &unstructured.Unstructured{}
			gv, kind := w.gvk[:strings.LastIndex(w.gvk, "/")], w.gvk[strings.LastIndex(w.gvk, "/")+1:]
			o.SetAPIVersion(gv)
			o.SetKind(kind)
			for {
				err := fw.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: w.name}, o)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					rc := &v1beta1.RedisCluster{}
					_ = fw.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, rc)
					t.Fatalf("sample %s: no %s %s: %v; conditions %+v", name, kind, w.name, err, rc.Status.Conditions)
				}
				time.Sleep(250 * time.Millisecond)
			}
			if kind == "StatefulSet" {
				checkMountsNoCredential(t, o, name)
			}
		}
	}
	var objs []*unstructured.Unstructured
	for _, gvk := range []schema.GroupVersionKind{
		{Group: "apps", Version: "v1", Kind: "StatefulSet"}, {Version: "v1", Kind: "Service"}, {Version: "v1", Kind: "ConfigMap"},
		{Group: "policy", Version: "v1", Kind: "PodDisruptionBudget"}, {Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicy"},
		{Group: "external-secrets.io", Version: "v1", Kind: "ExternalSecret"},
	} {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := fw.Client.List(ctx, list, client.InNamespace("default"), client.HasLabels{v1beta1.LabelCluster}); err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			o := &list.Items[i]
			o.SetGroupVersionKind(gvk)
			o.SetManagedFields(nil)
			unstructured.RemoveNestedField(o.Object, "status")
			objs = append(objs, o)
		}
	}
	if len(render.Find(objs, "ExternalSecret", "")) != 1 {
		t.Fatalf("read back %d ExternalSecrets, want the payments sample's", len(render.Find(objs, "ExternalSecret", "")))
	}
	if len(render.Find(objs, "StatefulSet", "")) != len(clusters) {
		t.Fatalf("read back %d StatefulSets for %d sample RedisClusters", len(render.Find(objs, "StatefulSet", "")), len(clusters))
	}
	return objs
}

// checkMountsNoCredential fails the test unless the StatefulSet's pods take no Secret but the
// cluster's ACL Secret (the aclfile, with password hashes, and the probe's and replication's own
// passwords) and, with TLS, its <name>-tls (the nodes' certificate and key, and the CA, never the
// CA's key): not the consumers' credentials Secret, nor keyroll's state Secret, nor the Secret
// External Secrets Operator writes, nor the CA's Secret <name>-tls-ca.
func checkMountsNoCredential(t *testing.T, sts *unstructured.Unstructured, cluster string) {
	t.Helper()
	spec, _, _ := unstructured.NestedMap(sts.Object, "spec", "template", "spec")
	var secrets []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				m, ok := x.(map[string]any)
				switch {
				case !ok:
				case k == "secret": // a volume (secretName) or a projected volume's source (name)
					for _, key := range []string{"secretName", "name"} {
						if name, _ := m[key].(string); name != "" {
							secrets = append(secrets, name)
						}
					}
				case k == "secretKeyRef" || k == "secretRef": // env and envFrom
					if name, _ := m["name"].(string); name != "" {
						secrets = append(secrets, name)
					}
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(spec)
	if len(secrets) == 0 {
		t.Errorf("sample %s: the StatefulSet takes no Secret; want its ACL Secret %s-acl (found none: is the walk wrong?)", cluster, cluster)
	}
	for _, name := range secrets {
		if name != cluster+"-acl" && name != cluster+"-tls" {
			t.Errorf("sample %s: the Redis pods take Secret %s; they may take only the ACL Secret %s-acl and the TLS Secret %s-tls", cluster, name, cluster, cluster)
		}
	}
}
