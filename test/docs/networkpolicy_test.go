package docs

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// The NetworkPolicy the owners' guide gives to owners who write their own (Network access) is one
// the API server takes as written: a server-side dry-run create, with unknown or duplicate fields
// refused. And it admits what the guide says: it selects the Redis pods of cluster orders, its
// first rule admits keyroll's manager pods in keyroll's namespace and its second the cluster's own
// Redis pods, each on TCP 6379.
func TestOwnersGuideNetworkPolicyIsAcceptedAndAdmitsKeyroll(t *testing.T) {
	blocks := yamlBlocks(t, filepath.Join("docs", "redis-cluster-owners.md"), "kind: NetworkPolicy")
	if len(blocks) != 1 {
		t.Fatalf("want one NetworkPolicy example in the owners' guide, found %d", len(blocks))
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(blocks[0]), &obj.Object); err != nil {
		t.Fatalf("the example is not YAML: %v\n%s", err, blocks[0])
	}

	// The guide fixes the names (its namespace, keyroll's): nothing is prefixed.
	f := framework.New(framework.Config{})
	if err := f.Use(testground.StartT(t, testground.Options{})); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f.Namespace(t, obj.GetNamespace())
	if err := f.Client.Create(ctx, obj, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("the API server refuses the owners' guide's NetworkPolicy: %v", err)
	}
	if err := f.Client.Get(ctx, client.ObjectKeyFromObject(obj), &networkingv1.NetworkPolicy{}); err == nil {
		t.Error("the dry run created the NetworkPolicy")
	}

	np := &networkingv1.NetworkPolicy{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, np); err != nil {
		t.Fatal(err)
	}
	rc := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: np.Namespace, Name: "orders"}, Spec: v1beta1.RedisClusterSpec{Replicas: 3}}
	redisPod := labels.Set(render.StatefulSet(rc, "", testground.ProbeImage).Spec.Template.Labels)
	manager := labels.Set(managerPodLabels(t))
	keyrollNS := labels.Set{corev1.LabelMetadataName: f.OperatorNS}
	if !selects(t, &np.Spec.PodSelector, redisPod) {
		t.Errorf("the example's podSelector %v does not select the Redis pods of cluster orders (%v)", np.Spec.PodSelector, redisPod)
	}
	if len(np.Spec.Ingress) < 2 {
		t.Fatalf("the example has %d ingress rules, want keyroll's and the replicas' first", len(np.Spec.Ingress))
	}
	for i, want := range []struct {
		what      string
		ns, pod   labels.Set
		namespace bool
	}{{"keyroll's manager", keyrollNS, manager, true}, {"the cluster's Redis pods", nil, redisPod, false}} {
		rule := np.Spec.Ingress[i]
		if len(rule.From) != 1 || !port6379(rule.Ports) {
			t.Errorf("ingress rule %d (%s): from %v, ports %v; want one peer, TCP 6379", i, want.what, rule.From, rule.Ports)
			continue
		}
		peer := rule.From[0]
		if want.namespace != (peer.NamespaceSelector != nil) || (peer.NamespaceSelector != nil && !selects(t, peer.NamespaceSelector, want.ns)) ||
			peer.PodSelector == nil || !selects(t, peer.PodSelector, want.pod) {
			t.Errorf("ingress rule %d does not admit %s (namespace %v, pod %v): %+v", i, want.what, want.ns, want.pod, peer)
		}
	}
}

// yamlBlocks are the yaml blocks of a doc that contain what.
func yamlBlocks(t *testing.T, file, what string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	var cur *strings.Builder
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := strings.TrimSpace(sc.Text())
		switch {
		case cur == nil && line == "```yaml":
			cur = &strings.Builder{}
		case cur != nil && line == "```":
			if strings.Contains(cur.String(), what) {
				out = append(out, cur.String())
			}
			cur = nil
		case cur != nil:
			cur.WriteString(sc.Text() + "\n")
		}
	}
	return out
}

// managerPodLabels are the labels of the manager's pods, as deploy/ installs them.
func managerPodLabels(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "manager", "manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	d := &appsv1.Deployment{}
	if err := yaml.Unmarshal(b, d); err != nil {
		t.Fatal(err)
	}
	if len(d.Spec.Template.Labels) == 0 {
		t.Fatal("the manager Deployment's pods have no labels")
	}
	return d.Spec.Template.Labels
}

func selects(t *testing.T, s *metav1.LabelSelector, l labels.Set) bool {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		t.Fatalf("selector %v: %v", s, err)
	}
	return !sel.Empty() && sel.Matches(l)
}

func port6379(ports []networkingv1.NetworkPolicyPort) bool {
	return len(ports) == 1 && ports[0].Port != nil && ports[0].Port.IntValue() == 6379 &&
		ports[0].Protocol != nil && *ports[0].Protocol == corev1.ProtocolTCP
}
