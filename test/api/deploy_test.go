package api

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	krender "github.com/keyroll/keyroll/controllers/render"
	rendered "github.com/keyroll/keyroll/test/render"
	"github.com/keyroll/keyroll/test/testground"
)

// render runs kustomize over a directory of deploy/, as `kubectl apply -k` does, in the order an
// apply succeeds (namespaces and CRDs first).
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := rendered.Kustomize(dir)
	if err != nil {
		t.Fatal(err)
	}
	return rendered.InstallOrder(objs)
}

// apply server-side-applies objects in order.
func apply(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if err := fw.Client.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("keyroll-test"), client.ForceOwnership); err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

func TestDeployDefaultInstallsUnderRestrictedPodSecurity(t *testing.T) {
	objs := render(t, "default")
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for kind, n := range map[string]int{"CustomResourceDefinition": 2, "Namespace": 1, "ServiceAccount": 1,
		"ClusterRole": 3, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1, "Deployment": 1,
		"Service": 2, "PodDisruptionBudget": 1, "NetworkPolicy": 1,
		"ValidatingAdmissionPolicy": 2, "ValidatingAdmissionPolicyBinding": 2} {
		if kinds[kind] != n {
			t.Errorf("deploy/default renders %d %s, want %d", kinds[kind], kind, n)
		}
	}
	var ns *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			ns = o
		}
	}
	if ns == nil || ns.GetLabels()["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Fatalf("the operator namespace is not labelled for the restricted Pod Security Standard")
	}

	// Collect the API server's warnings: Pod Security admission warns about a Deployment whose pods
	// it would refuse.
	c, warnings := fw.WarningClient(t)
	for _, o := range objs {
		if err := c.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("keyroll-test"), client.ForceOwnership); err != nil {
			t.Fatalf("kubectl apply -k deploy/default: %s %s refused: %v", o.GetKind(), o.GetName(), err)
		}
	}
	if w := warnings.All(); len(w) > 0 {
		t.Errorf("the API server warned while installing deploy/default: %v", w)
	}

	// Pods are what Pod Security admission enforces: a pod from the manager's template is admitted
	// in the restricted namespace, and a pod that breaks the standard is refused there (so the
	// enforcement is real).
	deploy := &appsv1.Deployment{}
	if err := fw.Client.Get(context.Background(), client.ObjectKey{Namespace: ns.GetName(), Name: "keyroll-manager"}, deploy); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "manager-template", Namespace: ns.GetName(), Labels: deploy.Spec.Template.Labels},
		Spec:       deploy.Spec.Template.Spec,
	}
	if err := fw.Client.Create(context.Background(), pod); err != nil {
		t.Fatalf("a pod from the manager Deployment's template is refused in the restricted namespace: %v", err)
	}
	bad := pod.DeepCopy()
	bad.ObjectMeta = metav1.ObjectMeta{Name: "privileged", Namespace: ns.GetName()}
	bad.Spec.Containers[0].SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}
	err := fw.Client.Create(context.Background(), bad)
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "restricted") {
		t.Fatalf("a pod adding a capability was not refused by Pod Security admission: %v", err)
	}
}

func TestManagerDeploymentIsHardened(t *testing.T) {
	var deploy *appsv1.Deployment
	for _, o := range render(t, "default") {
		if o.GetKind() == "Deployment" {
			deploy = &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, deploy); err != nil {
				t.Fatal(err)
			}
		}
	}
	if deploy == nil {
		t.Fatal("no Deployment in deploy/default")
	}
	ps := deploy.Spec.Template.Spec
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot ||
		ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context must run as non-root with seccomp RuntimeDefault: %+v", ps.SecurityContext)
	}
	for _, c := range ps.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("container %s: want a read-only root filesystem, no privilege escalation and all capabilities dropped: %+v", c.Name, sc)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() ||
			c.Resources.Limits.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("container %s: want CPU and memory requests and limits: %+v", c.Name, c.Resources)
		}
		if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
			c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("container %s: want /healthz liveness and /readyz readiness probes", c.Name)
		}
		if !slices.Contains(c.Args, "--leader-elect=true") {
			t.Errorf("container %s: leader election must be on: %v", c.Name, c.Args)
		}
	}
}

func TestGeneratedRBACHasNoWildcard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testground.RepoRoot(), "deploy", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rules := 0
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.TrimSpace(doc) == "" || strings.TrimSpace(doc) == "---" {
			continue
		}
		var role rbacv1.ClusterRole // a Role has the same shape
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
			t.Fatal(err)
		}
		for _, r := range role.Rules {
			rules++
			for _, list := range [][]string{r.Verbs, r.Resources, r.APIGroups, r.ResourceNames, r.NonResourceURLs} {
				for _, v := range list {
					if strings.Contains(v, "*") {
						t.Errorf("%s %s: wildcard %q in rule %+v", role.Kind, role.Name, v, r)
					}
				}
			}
			for _, v := range r.Verbs {
				if v == "escalate" || v == "bind" || v == "impersonate" {
					t.Errorf("%s %s: verb %q is never needed", role.Kind, role.Name, v)
				}
			}
		}
	}
	if rules == 0 {
		t.Fatal("deploy/rbac/role.yaml has no rules")
	}
}

func TestManagerServiceAccountMayDoWhatTheRoleSays(t *testing.T) {
	// The ClusterRole must be bound to the manager's ServiceAccount: ask the API server.
	apply(t, render(t, "default"))
	user := "system:serviceaccount:keyroll-system:keyroll-manager"
	cases := []struct {
		verb, group, resource, namespace string
		allowed                          bool
	}{
		{"list", "keyroll.dev", "redisclusters", "", true},
		{"patch", "keyroll.dev", "redisclusters/status", "default", true},
		{"create", "", "secrets", "default", true},
		{"delete", "", "pods", "default", true},
		{"create", "policy", "poddisruptionbudgets", "default", true},
		{"watch", "policy", "poddisruptionbudgets", "", true},
		{"update", "coordination.k8s.io", "leases", "keyroll-system", true},
		{"update", "coordination.k8s.io", "leases", "default", false},
		{"delete", "keyroll.dev", "vaultconnections", "", false},
		{"create", "", "pods", "default", false},
		{"delete", "apps", "deployments", "default", false},
		// Secure metrics: each scrape's token and permission are checked with the API server.
		{"create", "authentication.k8s.io", "tokenreviews", "", true},
		{"create", "authorization.k8s.io", "subjectaccessreviews", "", true},
	}
	for _, tc := range cases {
		ok := canI(t, fw.Clientset, user, tc.verb, tc.group, tc.resource, tc.namespace)
		if ok != tc.allowed {
			t.Errorf("%s %s.%s in %q: allowed %v, want %v", tc.verb, tc.resource, tc.group, tc.namespace, ok, tc.allowed)
		}
	}
}

func canI(t *testing.T, cs kubernetes.Interface, user, verb, group, resource, namespace string) bool {
	t.Helper()
	res, sub, _ := strings.Cut(resource, "/")
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:keyroll-system", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: verb, Group: group, Resource: res, Subresource: sub, Namespace: namespace,
		},
	}}
	out, err := cs.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out.Status.Allowed
}

// TestManagerNetworkPolicyLetsItReachRedis: keyroll changes the users of every Redis pod itself,
// connecting to each pod's IP on krender.RedisPort; where the network plugin enforces the manager's
// NetworkPolicy, its egress rules must allow that port (TCP, to any peer: Redis pods live in the
// RedisClusters' namespaces), or no credential ever reaches a node.
func TestManagerNetworkPolicyLetsItReachRedis(t *testing.T) {
	var np *unstructured.Unstructured
	for _, o := range render(t, "default") {
		if o.GetKind() == "NetworkPolicy" && o.GetName() == "keyroll-manager" {
			np = o
		}
	}
	if np == nil {
		t.Fatal("deploy/default has no NetworkPolicy keyroll-manager")
	}
	b, err := np.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	policy := &networkingv1.NetworkPolicy{}
	if err := yaml.Unmarshal(b, policy); err != nil {
		t.Fatal(err)
	}
	spec := policy.Spec
	if !slices.Contains(spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		t.Fatalf("the NetworkPolicy does not limit egress (%v): nothing to check", spec.PolicyTypes)
	}
	allowed := false
	for _, rule := range spec.Egress {
		if len(rule.To) != 0 {
			continue
		}
		if len(rule.Ports) == 0 {
			allowed = true
		}
		for _, p := range rule.Ports {
			if (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) && p.Port != nil && p.Port.IntValue() == krender.RedisPort {
				allowed = true
			}
		}
	}
	if !allowed {
		t.Errorf("the manager's NetworkPolicy lets it reach no Redis pod on TCP %d: egress %+v", krender.RedisPort, spec.Egress)
	}
}
