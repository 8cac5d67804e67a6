// Command bundle writes keyroll's OLM bundle (bundle/ and bundle.Dockerfile at the repository's
// root) from what `kubectl apply -k deploy/default` installs, the samples and the Helm chart's
// metadata: `make bundle` runs it, and test/bundle checks that the committed bundle is what it
// writes and that the operator-framework validators accept it.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// MaintainersEmail is the address the CSV gives for the chart's maintainers (the chart has none,
// and OperatorHub requires one): set it to the project's real address before publishing there.
const MaintainersEmail = "maintainers@keyroll.dev"

// Package is the OLM package name, and Channel its one channel.
const (
	Package = "keyroll"
	Channel = "alpha"
)

func main() {
	out := flag.String("out", testground.RepoRoot(), "Directory to write bundle/ and bundle.Dockerfile into.")
	flag.Parse()
	files, err := Generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bundle:", err)
		os.Exit(1)
	}
	if err := os.RemoveAll(filepath.Join(*out, "bundle")); err != nil {
		fmt.Fprintln(os.Stderr, "bundle:", err)
		os.Exit(1)
	}
	for name, data := range files {
		path := filepath.Join(*out, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "bundle:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bundle:", err)
			os.Exit(1)
		}
	}
}

// chart is what the bundle takes from the Helm chart: the release and its metadata.
type chart struct {
	Version     string `json:"appVersion"`
	Description string `json:"description"`
	KubeVersion string `json:"kubeVersion"`
	Home        string `json:"home"`
	Keywords    []string
	Maintainers []struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	} `json:"maintainers"`
}

// Generate returns the bundle's files by their path from the repository's root.
func Generate() (map[string][]byte, error) {
	root := testground.RepoRoot()
	var ch chart
	if err := readYAML(filepath.Join(root, "deploy", "helm", "keyroll", "Chart.yaml"), &ch); err != nil {
		return nil, err
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
		} `json:"image"`
	}
	if err := readYAML(filepath.Join(root, "deploy", "helm", "keyroll", "values.yaml"), &values); err != nil {
		return nil, err
	}
	image := values.Image.Repository + ":" + ch.Version
	objs, err := render.Kustomize("default")
	if err != nil {
		return nil, err
	}
	samples, err := render.Kustomize("samples")
	if err != nil {
		return nil, err
	}
	icon, err := os.ReadFile(filepath.Join(root, "docs", "icon.svg"))
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	var crds []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "CustomResourceDefinition":
			crds = append(crds, o)
			if files["bundle/manifests/"+o.GetName()+".yaml"], err = yaml.Marshal(o.Object); err != nil {
				return nil, err
			}
		case "Service", "PodDisruptionBudget":
			if o.GetName() == "keyroll-webhook" {
				continue // OLM makes the conversion webhook's Service (webhookdefinitions)
			}
			// Installed beside the operator, in the namespace OLM installs it into.
			o.SetNamespace("")
			if files["bundle/manifests/keyroll-"+strings.ToLower(o.GetKind())+"-"+o.GetName()+".yaml"], err = yaml.Marshal(o.Object); err != nil {
				return nil, err
			}
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			// OLM installs neither kind from a bundle: under OLM, a cluster administrator applies
			// deploy/rbac/admission_policies.yaml, with the service account OLM gives the manager.
			continue
		case "ClusterRole":
			if bound(objs, o.GetName()) {
				continue // in the CSV's clusterPermissions
			}
			// Roles keyroll's users bind themselves (metrics reader, namespace identity).
			if files["bundle/manifests/keyroll-clusterrole-"+o.GetName()+".yaml"], err = yaml.Marshal(o.Object); err != nil {
				return nil, err
			}
		}
	}
	csv, err := clusterServiceVersion(ch, image, objs, crds, samples, icon)
	if err != nil {
		return nil, err
	}
	if files["bundle/manifests/"+Package+".clusterserviceversion.yaml"], err = yaml.Marshal(csv); err != nil {
		return nil, err
	}
	labels := annotations()
	if files["bundle/metadata/annotations.yaml"], err = yaml.Marshal(map[string]any{"annotations": labels}); err != nil {
		return nil, err
	}
	var df bytes.Buffer
	df.WriteString("# The OLM bundle image of keyroll (make bundle writes it, with bundle/).\nFROM scratch\n\n")
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&df, "LABEL %s=%s\n", k, labels[k])
	}
	df.WriteString("\nCOPY bundle/manifests /manifests/\nCOPY bundle/metadata /metadata/\n")
	files["bundle.Dockerfile"] = df.Bytes()
	return files, nil
}

// annotations are the bundle's metadata (metadata/annotations.yaml, and the image's labels).
func annotations() map[string]string {
	return map[string]string{
		"operators.operatorframework.io.bundle.mediatype.v1":       "registry+v1",
		"operators.operatorframework.io.bundle.manifests.v1":       "manifests/",
		"operators.operatorframework.io.bundle.metadata.v1":        "metadata/",
		"operators.operatorframework.io.bundle.package.v1":         Package,
		"operators.operatorframework.io.bundle.channels.v1":        Channel,
		"operators.operatorframework.io.bundle.channel.default.v1": Channel,
	}
}

// bound says whether a ClusterRoleBinding of objs binds the ClusterRole name.
func bound(objs []*unstructured.Unstructured, name string) bool {
	for _, b := range render.Find(objs, "ClusterRoleBinding", "") {
		if n, _, _ := unstructured.NestedString(b.Object, "roleRef", "name"); n == name {
			return true
		}
	}
	return false
}

// rulesBound are the rules of the roles of kind that bindings of bindingKind give the service
// account sa.
func rulesBound(objs []*unstructured.Unstructured, bindingKind, kind, sa string) []any {
	var rules []any
	for _, b := range render.Find(objs, bindingKind, "") {
		subjects, _ := get(b.Object, "subjects").([]any)
		if !slices.ContainsFunc(subjects, func(s any) bool {
			m, _ := s.(map[string]any)
			return m["kind"] == "ServiceAccount" && m["name"] == sa
		}) {
			continue
		}
		name, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		for _, r := range render.Find(objs, kind, name) {
			rs, _ := get(r.Object, "rules").([]any)
			rules = append(rules, rs...)
		}
	}
	return rules
}

func clusterServiceVersion(ch chart, image string, objs, crds, samples []*unstructured.Unstructured, icon []byte) (map[string]any, error) {
	deps := render.Find(objs, "Deployment", "")
	if len(deps) != 1 {
		return nil, fmt.Errorf("deploy/default has %d Deployments, want the manager's", len(deps))
	}
	dep := deps[0]
	spec, _ := get(dep.Object, "spec").(map[string]any)
	containers, _ := get(spec, "template", "spec", "containers").([]any)
	for _, c := range containers {
		if m, ok := c.(map[string]any); ok && m["name"] == "manager" {
			m["image"] = image
			// OLM keeps the conversion webhook's certificate and the CRDs' conversion settings.
			args, _ := m["args"].([]any)
			m["args"] = append(args, "--webhook-certificate=olm")
		}
	}
	sa, _ := get(spec, "template", "spec", "serviceAccountName").(string)
	var examples []any
	for _, s := range samples {
		if s.GetAPIVersion() == v1beta1.GroupVersion.String() {
			examples = append(examples, s.Object)
		}
	}
	alm, err := json.MarshalIndent(examples, "", "  ")
	if err != nil {
		return nil, err
	}
	var owned []any
	for _, c := range crds {
		owned = append(owned, ownedCRD(c))
	}
	var maintainers []any
	for _, m := range ch.Maintainers {
		maintainers = append(maintainers, map[string]any{"name": m.Name, "email": MaintainersEmail})
	}
	name := Package + ".v" + ch.Version
	return map[string]any{
		"apiVersion": "operators.coreos.com/v1alpha1",
		"kind":       "ClusterServiceVersion",
		"metadata": map[string]any{
			"name": name,
			"annotations": map[string]any{
				"alm-examples":   string(alm),
				"capabilities":   "Full Lifecycle",
				"categories":     "Database,Security",
				"containerImage": image,
				"description":    ch.Description,
				"repository":     ch.Home,
				"support":        "keyroll maintainers",
				"operators.operatorframework.io/suggested-namespace": "keyroll-system",
			},
		},
		"spec": map[string]any{
			"displayName":    "keyroll",
			"description":    description,
			"version":        ch.Version,
			"minKubeVersion": minKube(ch.KubeVersion),
			"maturity":       "alpha",
			"keywords":       ch.Keywords,
			"maintainers":    maintainers,
			"provider":       map[string]any{"name": "keyroll", "url": ch.Home},
			"links": []any{
				map[string]any{"name": "Source", "url": ch.Home},
				map[string]any{"name": "Vault administrators' guide", "url": ch.Home + "/blob/main/docs/vault-administrators.md"},
				map[string]any{"name": "RedisCluster owners' guide", "url": ch.Home + "/blob/main/docs/redis-cluster-owners.md"},
			},
			"icon": []any{map[string]any{"base64data": base64.StdEncoding.EncodeToString(icon), "mediatype": "image/svg+xml"}},
			// keyroll watches every namespace (a label selector narrows it, not a namespace list).
			"installModes": []any{
				map[string]any{"type": "OwnNamespace", "supported": false},
				map[string]any{"type": "SingleNamespace", "supported": false},
				map[string]any{"type": "MultiNamespace", "supported": false},
				map[string]any{"type": "AllNamespaces", "supported": true},
			},
			"customresourcedefinitions": map[string]any{"owned": owned},
			// The conversion webhook between v1alpha1 and v1beta1: OLM makes its Service and
			// certificate, mounts the certificate in the manager's pods and points the CRDs at it.
			"webhookdefinitions": []any{map[string]any{
				"type": "ConversionWebhook", "generateName": "ckeyroll.keyroll.dev", "deploymentName": dep.GetName(),
				"containerPort": 443, "targetPort": 9443, "webhookPath": "/convert",
				"conversionCRDs":          crdNames(crds),
				"admissionReviewVersions": []any{"v1"}, "sideEffects": "None",
			}},
			"install": map[string]any{
				"strategy": "deployment",
				"spec": map[string]any{
					"deployments":        []any{map[string]any{"name": dep.GetName(), "label": dep.GetLabels(), "spec": spec}},
					"clusterPermissions": []any{map[string]any{"serviceAccountName": sa, "rules": rulesBound(objs, "ClusterRoleBinding", "ClusterRole", sa)}},
					"permissions":        []any{map[string]any{"serviceAccountName": sa, "rules": rulesBound(objs, "RoleBinding", "Role", sa)}},
				},
			},
		},
	}, nil
}

// crdNames are the names of the CRDs.
func crdNames(crds []*unstructured.Unstructured) []any {
	var out []any
	for _, c := range crds {
		out = append(out, c.GetName())
	}
	return out
}

// minKube is the lowest Kubernetes version of the chart's kubeVersion (">=1.30.0-0": 1.30.0).
func minKube(constraint string) string {
	v := strings.TrimPrefix(strings.TrimSpace(constraint), ">=")
	v, _, _ = strings.Cut(v, "-")
	return v
}

// ownedCRD describes one of keyroll's CRDs for the console: its kind, version and the fields shown.
func ownedCRD(crd *unstructured.Unstructured) map[string]any {
	kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
	versions, _ := get(crd.Object, "spec", "versions").([]any)
	version := ""
	for _, v := range versions {
		if m, ok := v.(map[string]any); ok && m["storage"] == true {
			version, _ = m["name"].(string)
		}
	}
	d := descriptors[kind]
	return map[string]any{
		"name": crd.GetName(), "kind": kind, "version": version,
		"displayName": d.display, "description": d.description,
		"specDescriptors": d.spec, "statusDescriptors": d.status,
		"resources": d.resources,
	}
}

type crdDescriptors struct {
	display, description string
	spec, status         []any
	resources            []any
}

func field(path, name, description string, xs ...string) map[string]any {
	m := map[string]any{"path": path, "displayName": name, "description": description}
	if len(xs) > 0 {
		m["x-descriptors"] = xs
	}
	return m
}

var descriptors = map[string]crdDescriptors{
	"RedisCluster": {
		display:     "Redis Cluster",
		description: "Redis with a credential from Vault, renewed, rotated on a schedule and rolled out to its consumers without downtime.",
		spec: []any{
			field("replicas", "Replicas", "Redis pods: one primary, the others its replicas.", "urn:alm:descriptor:com.tectonic.ui:podCount"),
			field("credentials.source", "Credentials source", "VaultLease (keyroll holds the lease) or ExternalSecret (External Secrets Operator fetches it)."),
			field("credentials.vaultLease.connectionRef.name", "VaultConnection", "The VaultConnection the credential is issued through."),
			field("rotation.schedule", "Rotation schedule", "When a new credential is issued and rolled out (cron)."),
			field("rollout.consumers", "Consumers", "Workloads restarted onto each new credential, one at a time."),
		},
		status: []any{
			field("phase", "Phase", "Summary of the cluster's state.", "urn:alm:descriptor:io.kubernetes.phase"),
			field("conditions", "Conditions", "What keyroll found and did.", "urn:alm:descriptor:io.kubernetes.conditions"),
			field("credential.version", "Credential version", "The version of the credential the consumers have."),
			field("readyReplicas", "Ready replicas", "Redis pods that are Ready.", "urn:alm:descriptor:com.tectonic.ui:podStatuses"),
		},
		resources: []any{
			map[string]any{"kind": "StatefulSet", "name": "", "version": "v1"},
			map[string]any{"kind": "Secret", "name": "", "version": "v1"},
			map[string]any{"kind": "Service", "name": "", "version": "v1"},
			map[string]any{"kind": "PodDisruptionBudget", "name": "", "version": "v1"},
		},
	},
	"VaultConnection": {
		display:     "Vault Connection",
		description: "How keyroll reaches Vault (address, authentication) and which namespaces and paths may use it.",
		spec: []any{
			field("address", "Vault address", "Vault's address."),
			field("allowedNamespaces", "Allowed namespaces", "The namespaces whose RedisClusters may use this connection."),
			field("allowedPaths", "Allowed paths", "The Vault paths those RedisClusters may read credentials from."),
		},
		status: []any{
			field("conditions", "Conditions", "Whether keyroll can log in to Vault.", "urn:alm:descriptor:io.kubernetes.conditions"),
		},
	},
}

const description = `keyroll is a Kubernetes operator that runs Redis with credentials from HashiCorp Vault and rotates
them without downtime. It issues a Redis credential from Vault's database secrets engine (or adopts one
that External Secrets Operator fetches), keeps its lease alive, rotates it on a schedule, puts each new
credential on every Redis node, live, before any client gets it, then rolls the workloads that use it one
at a time, each only while the previous one is Ready, and revokes every lease it obtained, superseded
ones included, before the cluster is gone.

- **VaultConnection** (cluster-scoped): how keyroll reaches Vault, and which namespaces and Vault paths
  may use it.
- **RedisCluster**: the Redis pods, where their credential comes from, its rotation schedule and the
  consumers to roll.

See the Vault administrators' guide and the RedisCluster owners' guide in the repository's docs/.`

// get is the value at path in obj, not copied (kustomize's objects hold ints, which the
// unstructured helpers refuse to copy), or nil.
func get(obj map[string]any, path ...string) any {
	v, _, _ := unstructured.NestedFieldNoCopy(obj, path...)
	return v
}

func readYAML(path string, into any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return yaml.Unmarshal(b, into)
}
