package api

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/keyroll/keyroll/apis/v1beta1"
	keyrollapply "github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/test/framework"
	rendered "github.com/keyroll/keyroll/test/render"
)

// The admission policies of deploy/rbac/admission_policies.yaml, as deploy/default names them.
const (
	writesPolicy = "keyroll-manager-writes"
	statusPolicy = "keyroll-redisclusters-status"
)

// TestManagerCannotPatchOutsideWhatItOwns: with deploy/default installed, the manager's service
// account (impersonated) holds the ClusterRole deploy/default binds it to and, beside it, a wider
// one that lets it delete workloads, update and delete Secrets and create pods, so that RBAC lets
// every request below through and only the admission policies decide. It changes a workload of
// another owner only by the pod-template annotation keyroll.dev/credential-version, and deletes
// none; it changes a RedisCluster's own StatefulSet, Redis pods and Secrets, and Secrets of its own
// namespace; every other request is refused, and the refusal names the policy. A RedisCluster's
// status is written by the manager and by no tenant, even one whose Role grants it.
func TestManagerCannotPatchOutsideWhatItOwns(t *testing.T) {
	ctx := context.Background()
	objs := render(t, "default")
	apply(t, objs)
	installed := time.Now()
	sas := rendered.Find(objs, "ServiceAccount", "")
	if len(sas) != 1 {
		t.Fatalf("deploy/default renders %d ServiceAccounts, want the manager's", len(sas))
	}
	managerNS := sas[0].GetNamespace()
	user := "system:serviceaccount:" + managerNS + ":" + sas[0].GetName()
	wider(t, user, sas[0].GetName(), managerNS)
	mgr := fw.ClientAs(t, user, "system:serviceaccounts", "system:serviceaccounts:"+managerNS, "system:authenticated")

	tenant := fw.Namespace(t, "admission-tenant")
	for _, ns := range []string{tenant, "kube-system"} {
		if err := fw.Ground.CP.EnsureServiceAccount(ctx, ns, "default"); err != nil {
			t.Fatal(err)
		}
	}
	system := daemonSet("lookalike-proxy", "kube-system")
	fw.Create(t, system)
	rc := fw.RedisCluster(t, tenant, "orders", "vault", "database/creds/orders")
	// The API server enforces a policy once its cache holds it: a dry run (admitted, never stored)
	// is asked until the first refusal.
	waitEnforced(t, writesPolicy, installed, func() error { return mgr.Create(ctx, secret("stolen", tenant), client.DryRunAll) })
	t.Run("workloads", func(t *testing.T) { checkWorkloads(t, mgr, rc, system) })
	t.Run("pods", func(t *testing.T) { checkPods(t, mgr, rc) })
	t.Run("secrets", func(t *testing.T) { checkSecrets(t, mgr, rc, managerNS) })
	t.Run("status", func(t *testing.T) { checkStatus(t, mgr, rc, installed) })
}

// checkWorkloads: a DaemonSet of kube-system and a tenant's Deployment keep everything but the
// pod-template annotation keyroll.dev/credential-version, and neither is deleted; that annotation
// alone is changed on a Deployment, a StatefulSet and a DaemonSet; a StatefulSet the RedisCluster
// owns is created, changed and deleted, one it does not own is not created.
func checkWorkloads(t *testing.T, mgr client.Client, rc *v1beta1.RedisCluster, system *appsv1.DaemonSet) {
	ctx := context.Background()
	verdict(t, "a label of a DaemonSet of kube-system", mergePatch(mgr, system.DeepCopy(), `{"metadata":{"labels":{"tier":"keyroll"}}}`), writesPolicy)
	ds := system.DeepCopy()
	base := client.MergeFrom(ds.DeepCopy())
	ds.Spec.Template.Spec.Containers[0].Image = "registry.example/evil:1"
	verdict(t, "the image of a DaemonSet of kube-system", mgr.Patch(ctx, ds, base), writesPolicy)
	verdict(t, "deleting a DaemonSet of kube-system", mgr.Delete(ctx, system), writesPolicy)
	if err := fw.Client.Get(ctx, client.ObjectKeyFromObject(system), ds); err != nil ||
		ds.Spec.Template.Spec.Containers[0].Image != system.Spec.Template.Spec.Containers[0].Image || len(ds.Labels) != 0 {
		t.Errorf("the DaemonSet of kube-system changed: %v %+v", err, ds)
	}

	shop := deployment("shop", rc.Namespace)
	fw.Create(t, shop)
	for what, patch := range map[string]string{
		"its labels":                      `{"metadata":{"labels":{"team":"keyroll"}}}`,
		"its annotations":                 `{"metadata":{"annotations":{"example.com/owner":"keyroll"}}}`,
		"an owner (for the collector)":    `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"6d1f4a52-0000-4000-8000-000000000000"}]}}`,
		"a finalizer":                     `{"metadata":{"finalizers":["example.com/hold"]}}`,
		"its replicas":                    `{"spec":{"replicas":5}}`,
		"minReadySeconds":                 `{"spec":{"minReadySeconds":30}}`,
		"a pod template label":            `{"spec":{"template":{"metadata":{"labels":{"extra":"x"}}}}}`,
		"another pod template annotation": `{"spec":{"template":{"metadata":{"annotations":{"example.com/debug":"on"}}}}}`,
		"the credential version and the image": `{"spec":{"template":{"metadata":{"annotations":{"` + v1beta1.AnnotationCredentialVersion +
			`":"v2"}},"spec":{"containers":[{"name":"app","image":"registry.example/evil:1"}]}}}}`,
	} {
		verdict(t, "a tenant's Deployment: "+what, mergePatch(mgr, shop.DeepCopy(), patch), writesPolicy)
	}
	// A consumer of each kind is rolled onto a credential, then onto the next, as the rollout
	// patches it (rollout_consumers.go): the API server changes a DaemonSet's annotations too.
	sts, daemons := statefulSet("ledger", rc.Namespace), daemonSet("agent", rc.Namespace)
	fw.Create(t, sts)
	fw.Create(t, daemons)
	for _, c := range []struct {
		obj      client.Object
		template *metav1.ObjectMeta
	}{{shop, &shop.Spec.Template.ObjectMeta}, {sts, &sts.Spec.Template.ObjectMeta}, {daemons, &daemons.Spec.Template.ObjectMeta}} {
		for _, version := range []string{"v2", "v3"} {
			base := client.MergeFrom(c.obj.DeepCopyObject().(client.Object))
			c.template.Annotations = map[string]string{v1beta1.AnnotationCredentialVersion: version}
			what := fmt.Sprintf("a tenant's %T: the credential version alone (%s)", c.obj, version)
			verdict(t, what, mgr.Patch(ctx, c.obj, base), "")
		}
	}
	verdict(t, "deleting a tenant's Deployment", mgr.Delete(ctx, shop), writesPolicy)

	owned := statefulSet(rc.Name, rc.Namespace)
	if err := controllerutil.SetControllerReference(rc, owned, fw.Client.Scheme()); err != nil {
		t.Fatal(err)
	}
	verdict(t, "creating the RedisCluster's StatefulSet", applyAsKeyroll(mgr, owned.DeepCopy()), "")
	owned.Spec.Replicas = ptr.To[int32](3)
	verdict(t, "changing the RedisCluster's StatefulSet", applyAsKeyroll(mgr, owned.DeepCopy()), "")
	verdict(t, "creating a StatefulSet no RedisCluster owns", applyAsKeyroll(mgr, statefulSet("rogue", rc.Namespace)), writesPolicy)
	verdict(t, "deleting the RedisCluster's StatefulSet", mgr.Delete(ctx, owned), "")
}

// checkPods: a Redis pod (the cluster's StatefulSet controls it, and it is named after it) is
// labelled, gets a new probe sidecar image and is deleted; a pod with the same labels that the
// StatefulSet does not control, and a pod of kube-system, are neither changed nor deleted, and the
// manager creates no pod.
func checkPods(t *testing.T, mgr client.Client, rc *v1beta1.RedisCluster) {
	ctx := context.Background()
	sts := statefulSet(rc.Name, rc.Namespace)
	fw.Create(t, sts)
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr.To(true)}
	node := redisPod(rc, rc.Name+"-0", owner)
	fw.Create(t, node)
	lookalike := redisPod(rc, rc.Name+"-1")
	fw.Create(t, lookalike)
	system := redisPod(rc, "coredns-0")
	system.Namespace, system.Labels = "kube-system", map[string]string{"k8s-app": "kube-dns"}
	fw.Create(t, system)

	role := `{"metadata":{"labels":{"` + v1beta1.LabelRole + `":"` + v1beta1.RolePrimary + `"}}}`
	verdict(t, "labelling a Redis pod's role", mergePatch(mgr, node.DeepCopy(), role), "")
	p := node.DeepCopy()
	base := client.StrategicMergeFrom(p.DeepCopy())
	p.Spec.InitContainers[0].Image = "registry.example/keyroll:v2"
	verdict(t, "a Redis pod's probe sidecar image", mgr.Patch(ctx, p, base), "")
	verdict(t, "labelling a look-alike pod", mergePatch(mgr, lookalike.DeepCopy(), role), writesPolicy)
	verdict(t, "deleting a look-alike pod", mgr.Delete(ctx, lookalike), writesPolicy)
	verdict(t, "labelling a pod of kube-system", mergePatch(mgr, system.DeepCopy(), role), writesPolicy)
	verdict(t, "deleting a pod of kube-system", mgr.Delete(ctx, system), writesPolicy)
	verdict(t, "creating a pod that looks like a Redis pod", mgr.Create(ctx, redisPod(rc, rc.Name+"-2", owner)), writesPolicy)
	// As a rollout restarts it (rollout_engine.go).
	verdict(t, "deleting a Redis pod", mgr.Delete(ctx, node, client.Preconditions{UID: &node.UID}), "")
}

// checkSecrets: in a tenant's namespace the manager creates, changes and deletes a Secret the
// RedisCluster owns, and no other; in its own namespace, any.
func checkSecrets(t *testing.T, mgr client.Client, rc *v1beta1.RedisCluster, managerNS string) {
	ctx := context.Background()
	verdict(t, "creating a Secret no RedisCluster owns", applyAsKeyroll(mgr, secret("stolen", rc.Namespace)), writesPolicy)
	token := secret(rc.Name+"-token", rc.Namespace)
	token.Type, token.Annotations, token.StringData = corev1.SecretTypeServiceAccountToken, map[string]string{corev1.ServiceAccountNameKey: "default"}, nil
	if err := controllerutil.SetControllerReference(rc, token, fw.Client.Scheme()); err != nil {
		t.Fatal(err)
	}
	verdict(t, "creating a service account token Secret the RedisCluster owns", applyAsKeyroll(mgr, token), writesPolicy)
	theirs := secret("team-db", rc.Namespace)
	fw.Create(t, theirs)
	verdict(t, "changing a tenant's Secret", mergePatch(mgr, theirs.DeepCopy(), `{"stringData":{"password":"known"}}`), writesPolicy)
	verdict(t, "deleting a tenant's Secret", mgr.Delete(ctx, theirs), writesPolicy)

	owned := secret(rc.Name+"-credentials", rc.Namespace)
	if err := controllerutil.SetControllerReference(rc, owned, fw.Client.Scheme()); err != nil {
		t.Fatal(err)
	}
	verdict(t, "creating the RedisCluster's Secret", applyAsKeyroll(mgr, owned.DeepCopy()), "")
	verdict(t, "changing the RedisCluster's Secret", mergePatch(mgr, owned.DeepCopy(), `{"stringData":{"password":"next"}}`), "")
	verdict(t, "deleting the RedisCluster's Secret", mgr.Delete(ctx, owned), "")

	own := secret("keyroll-tokens-admission-test", managerNS)
	verdict(t, "creating a Secret of the manager's namespace", applyAsKeyroll(mgr, own.DeepCopy()), "")
	verdict(t, "changing a Secret of the manager's namespace", mergePatch(mgr, own.DeepCopy(), `{"stringData":{"password":"next"}}`), "")
	verdict(t, "deleting a Secret of the manager's namespace", mgr.Delete(ctx, own), "")
}

// checkStatus: a tenant whose Role lets it write RedisClusters' status is refused; the manager
// writes it. installed is when deploy/default was applied, which the wait for the policy is timed
// from.
func checkStatus(t *testing.T, mgr client.Client, rc *v1beta1.RedisCluster, installed time.Time) {
	ctx := context.Background()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "redisclusters-status", Namespace: rc.Namespace},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1beta1.GroupVersion.Group}, Resources: []string{"redisclusters"}, Verbs: []string{"get"}},
			{APIGroups: []string{v1beta1.GroupVersion.Group}, Resources: []string{"redisclusters/status"}, Verbs: []string{"get", "update", "patch"}},
		},
	}
	fw.Create(t, role)
	fw.Create(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice", Namespace: rc.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "alice"}},
	})
	alice := fw.ClientAs(t, "alice", "system:authenticated")
	forge := func(c client.Client, opts ...client.SubResourcePatchOption) error {
		return c.Status().Patch(ctx, rc.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"status":{"observedGeneration":7}}`)), opts...)
	}
	waitEnforced(t, statusPolicy, installed, func() error { return forge(alice, client.DryRunAll) })
	verdict(t, "a tenant writing a RedisCluster's status", forge(alice), statusPolicy)
	verdict(t, "the manager writing a RedisCluster's status", forge(mgr), "")
}

// wider binds to the manager's service account, until the test ends, what its ClusterRole does
// not grant and the policies must refuse all the same.
func wider(t *testing.T, user, sa, namespace string) {
	t.Helper()
	name := "admission-test-wider"
	fw.Create(t, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"apps"}, Resources: []string{"deployments", "daemonsets", "statefulsets"}, Verbs: []string{"delete"}},
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"update", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}},
		},
	})
	fw.Create(t, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: namespace}},
	})
	t.Logf("%s holds deploy/default's ClusterRole and %s", user, name)
}

// waitEnforced asks until policy, installed at since, refuses request (30 s at most).
func waitEnforced(t *testing.T, policy string, since time.Time, request func() error) {
	t.Helper()
	framework.Eventually(t, 30*time.Second, func() string {
		if err := request(); !byPolicy(err, policy) {
			return fmt.Sprintf("ValidatingAdmissionPolicy %s is not enforced yet: %v", policy, err)
		}
		return ""
	})
	t.Logf("ValidatingAdmissionPolicy %s enforced within %s", policy, time.Since(since).Round(time.Millisecond))
}

// verdict checks the API server's answer to one of the manager's requests: allowed when policy is
// empty, else refused by that policy (not by RBAC, nor by anything else).
func verdict(t *testing.T, what string, err error, policy string) {
	t.Helper()
	switch {
	case policy == "" && err != nil:
		t.Errorf("%s: refused, want allowed: %v", what, err)
	case policy != "" && err == nil:
		t.Errorf("%s: allowed, want refused by ValidatingAdmissionPolicy %s", what, policy)
	case policy != "" && !byPolicy(err, policy):
		t.Errorf("%s: refused, but not by ValidatingAdmissionPolicy %s: %v", what, policy, err)
	}
}

func byPolicy(err error, policy string) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}

func mergePatch(c client.Client, obj client.Object, patch string, opts ...client.PatchOption) error {
	return c.Patch(context.Background(), obj, client.RawPatch(types.MergePatchType, []byte(patch)), opts...)
}

// applyAsKeyroll writes obj as keyroll writes the objects a RedisCluster owns: server-side apply,
// field manager keyroll, forcing ownership (controllers/apply).
func applyAsKeyroll(c client.Client, obj client.Object) error {
	gvk, err := c.GroupVersionKindFor(obj)
	if err != nil {
		return err
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	obj.SetManagedFields(nil)
	obj.SetResourceVersion("")
	return keyrollapply.ServerSide(context.Background(), c, obj, keyrollapply.FieldOwner)
}

func podTemplate(labels map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
	}
}

func daemonSet(name, ns string) *appsv1.DaemonSet {
	labels := map[string]string{"app": name}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: podTemplate(labels)},
	}
}

func deployment(name, ns string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: podTemplate(labels)},
	}
}

func statefulSet(name, ns string) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: podTemplate(labels),
			ServiceName: name},
	}
}

// redisPod is a pod with the labels of rc's Redis pods and a probe sidecar, with owners.
func redisPod(rc *v1beta1.RedisCluster, name string, owners ...metav1.OwnerReference) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rc.Namespace, OwnerReferences: owners, Labels: map[string]string{
			"app.kubernetes.io/name": "redis", "app.kubernetes.io/instance": rc.Name, v1beta1.LabelCluster: rc.Name,
		}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "probe", Image: "registry.example/keyroll:v1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}},
			Containers:     []corev1.Container{{Name: "redis", Image: "registry.example/redis:7"}},
		},
	}
}

func secret(name, ns string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		StringData: map[string]string{"password": "first"},
	}
}
