package render

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

func testCluster() *v1beta1.RedisCluster {
	return &v1beta1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"},
		Spec: v1beta1.RedisClusterSpec{
			Replicas: 3, Image: "docker.io/library/redis", Version: "7.2",
			Credentials: v1beta1.CredentialsSpec{Source: v1beta1.SourceVaultLease, UsernameKey: "user", PasswordKey: "pass"},
		},
	}
}

func TestStatefulSetIsOnDeleteAndMountsNoCredential(t *testing.T) {
	rc := testCluster()
	sts := StatefulSet(rc, "v1", testProbeImage)
	if sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("update strategy %s, want OnDelete: keyroll restarts pods itself", sts.Spec.UpdateStrategy.Type)
	}
	if got, ok := sts.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]; ok {
		t.Errorf("redisPods Live: the pod template names credential %q, so it changes with each rotation", got)
	}
	rc.Spec.Rollout.RedisPods = v1beta1.RedisPodsRestart
	if got := StatefulSet(rc, "v1", testProbeImage).Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]; got != "v1" {
		t.Errorf("redisPods Restart: pod template credential version %q", got)
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if c.Image != "docker.io/library/redis:7.2" || *sts.Spec.Replicas != 3 || sts.Spec.ServiceName != "orders-headless" {
		t.Errorf("image %s, replicas %d, service %s", c.Image, *sts.Spec.Replicas, sts.Spec.ServiceName)
	}
	if sc := c.SecurityContext; sc == nil || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation {
		t.Errorf("container security context %+v", sc)
	}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName != ACLSecretName(rc) {
			t.Errorf("the pods mount Secret %s; they mount the ACL Secret only", v.Secret.SecretName)
		}
	}
}

func TestOwnedObjectsCarryTheManagedLabel(t *testing.T) {
	rc := testCluster()
	for _, labels := range []map[string]string{
		ACLSecret(rc, "x", Internal{}, "").Labels, CredentialsSecret(rc, "u", "p", "v", nil).Labels,
		StateSecret(rc, "a", nil).Labels, VaultPluginSecret(rc, "vault", "p").Labels,
		ConfigMap(rc).Labels, HeadlessService(rc).Labels, ClientService(rc).Labels,
		StatefulSet(rc, "v", testProbeImage).Labels, PodDisruptionBudget(rc).Labels,
	} {
		if labels[v1beta1.LabelManagedBy] != v1beta1.ManagedByValue || labels[v1beta1.LabelCluster] != "orders" {
			t.Errorf("labels %v", labels)
		}
	}
	s := CredentialsSecret(rc, "u", "p", "v9", nil)
	if string(s.Data["user"]) != "u" || string(s.Data["pass"]) != "p" || s.Annotations[v1beta1.AnnotationCredentialVersion] != "v9" {
		t.Errorf("credentials Secret %+v", s)
	}
	if sel := ClientService(rc).Spec.Selector; sel[v1beta1.LabelRole] != v1beta1.RolePrimary || sel[v1beta1.LabelCluster] != "orders" {
		t.Errorf("the client Service selects %v, want the cluster's pod labelled primary", sel)
	}
}

func TestRedisConfLoadsTheACLFile(t *testing.T) {
	cm := ConfigMap(testCluster())
	if !strings.Contains(cm.Data["redis.conf"], "aclfile /etc/keyroll/acl/users.acl") {
		t.Errorf("redis.conf: %s", cm.Data["redis.conf"])
	}
	if !strings.Contains(cm.Data["start.sh"], `primary="orders-0.orders-headless 6379"`) {
		t.Errorf("start.sh does not make replicas of a new cluster follow pod 0: %s", cm.Data["start.sh"])
	}
	if want := "orders-0.orders-headless 6379\norders-1.orders-headless 6379\norders-2.orders-headless 6379\n"; cm.Data["peers"] != want {
		t.Errorf("peers %q, want %q", cm.Data["peers"], want)
	}
}

// The budget lets one Redis pod of the cluster go at a time, and counts the StatefulSet's pods
// only: the disruption controller works out the budget from the StatefulSet's scale, and a pod
// of another cluster (or not owned by the StatefulSet) in its selection would stop it.
func TestPodDisruptionBudgetTakesOneRedisPodAtATime(t *testing.T) {
	rc := testCluster()
	pdb := PodDisruptionBudget(rc)
	sts := StatefulSet(rc, "v", testProbeImage)
	if pdb.Name != "orders-redis" || pdb.Namespace != "shop" {
		t.Errorf("PodDisruptionBudget %s/%s, want shop/orders-redis", pdb.Namespace, pdb.Name)
	}
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("unhealthyPodEvictionPolicy %v, want AlwaysAllow: a pod that is not Ready must never block a drain", p)
	}
	if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.String() != "1" || pdb.Spec.MinAvailable != nil {
		t.Errorf("maxUnavailable %v, minAvailable %v: want maxUnavailable 1 only", mu, pdb.Spec.MinAvailable)
	}
	if !maps.Equal(pdb.Spec.Selector.MatchLabels, sts.Spec.Selector.MatchLabels) || len(pdb.Spec.Selector.MatchExpressions) > 0 {
		t.Errorf("the budget selects %v, the StatefulSet %v: they must select the same pods", pdb.Spec.Selector, sts.Spec.Selector)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Errorf("the budget %v does not select the pods of the template %v", sel, sts.Spec.Template.Labels)
	}
	other := testCluster()
	other.Name = "orders-redis" // a cluster named as this one's budget
	if sel.Matches(labels.Set(StatefulSet(other, "v", testProbeImage).Spec.Template.Labels)) {
		t.Errorf("the budget of orders selects the pods of cluster orders-redis")
	}
	if PodDisruptionBudgetName(other) == PodDisruptionBudgetName(rc) {
		t.Errorf("two clusters share the budget name %s", PodDisruptionBudgetName(rc))
	}
}

func TestRedisPodsPreferDifferentNodes(t *testing.T) {
	for name, tc := range map[string]struct {
		policy             v1beta1.PodAntiAffinityPolicy
		preferred, require bool
	}{
		"unset, as before the field": {"", true, false},
		"Preferred":                  {v1beta1.PodAntiAffinityPreferred, true, false},
		"Required":                   {v1beta1.PodAntiAffinityRequired, false, true},
		"None":                       {v1beta1.PodAntiAffinityNone, false, false},
	} {
		t.Run(name, func(t *testing.T) {
			rc := testCluster()
			rc.Spec.PodAntiAffinity = tc.policy
			tmpl := StatefulSet(rc, "v", testProbeImage).Spec.Template
			var terms []corev1.PodAffinityTerm
			var preferred, required int
			if a := tmpl.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
				for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
					if w.Weight != 100 {
						t.Errorf("weight %d, want 100", w.Weight)
					}
					terms, preferred = append(terms, w.PodAffinityTerm), preferred+1
				}
				required = len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
				terms = append(terms, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
			}
			if (preferred == 1) != tc.preferred || (required == 1) != tc.require || preferred+required > 1 {
				t.Fatalf("%d preferred and %d required anti-affinity terms: %+v", preferred, required, tmpl.Spec.Affinity)
			}
			if tc.policy == v1beta1.PodAntiAffinityNone && tmpl.Spec.Affinity != nil {
				t.Errorf("None: affinity %+v", tmpl.Spec.Affinity)
			}
			for _, term := range terms {
				sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
				if err != nil {
					t.Fatal(err)
				}
				if term.TopologyKey != corev1.LabelHostname || !sel.Matches(labels.Set(tmpl.Labels)) || !maps.Equal(term.LabelSelector.MatchLabels, SelectorLabels(rc)) {
					t.Errorf("term %+v: want the cluster's own pods, by node (%s)", term, corev1.LabelHostname)
				}
			}
		})
	}
}

// testProbeImage is the probe sidecar's image in these tests.
const testProbeImage = "registry.example/keyroll:v1"

// The liveness probe is not the readiness probe (a replica that resyncs is not Ready and must
// not be restarted for it); a startup probe gives Redis ten minutes to answer first; after that a
// Redis is restarted only after a minute without an answer. The kubelet asks the probe sidecar
// over HTTP, never by starting a process in the Redis container.
func TestLivenessProbeIsPatientAndNotTheReadinessProbe(t *testing.T) {
	spec := StatefulSet(testCluster(), "v", testProbeImage).Spec.Template.Spec
	c := spec.Containers[0]
	live, start, ready := c.LivenessProbe, c.StartupProbe, c.ReadinessProbe
	for _, p := range []*corev1.Probe{ready, live, start} {
		if p == nil || p.HTTPGet == nil || p.Exec != nil {
			t.Fatalf("probe %+v: want an HTTP probe", p)
		}
		if p.HTTPGet.Port.IntValue() != probePort || p.HTTPGet.Scheme != corev1.URISchemeHTTP { // as the API server would default it
			t.Errorf("probe %+v: want HTTP to the sidecar's port %d", p.HTTPGet, probePort)
		}
		if p.PeriodSeconds == 0 || p.TimeoutSeconds == 0 || p.FailureThreshold == 0 || p.SuccessThreshold != 1 {
			t.Errorf("probe %+v leaves a field to the API server's default", p)
		}
	}
	if live.HTTPGet.Path != "/live" || start.HTTPGet.Path != "/live" || ready.HTTPGet.Path != "/ready" {
		t.Errorf("paths: liveness %s, startup %s, readiness %s; want /live, /live, /ready", live.HTTPGet.Path, start.HTTPGet.Path, ready.HTTPGet.Path)
	}
	if got := live.PeriodSeconds * live.FailureThreshold; got < 60 || live.TimeoutSeconds < 5 {
		t.Errorf("liveness: restarted after %d s without an answer (timeout %d s); want at least 60 s, 5 s", got, live.TimeoutSeconds)
	}
	if got := start.PeriodSeconds * start.FailureThreshold; got < 600 {
		t.Errorf("startup: %d s for Redis to answer first; want at least 600 s", got)
	}

	if len(spec.InitContainers) != 1 {
		t.Fatalf("init containers %+v: want the probe sidecar alone", spec.InitContainers)
	}
	side := spec.InitContainers[0]
	if side.Image != testProbeImage || side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("probe sidecar: image %s, restart policy %v; want %s, a sidecar (Always)", side.Image, side.RestartPolicy, testProbeImage)
	}
	cmd := strings.Join(side.Command, " ")
	for _, want := range []string{"--user=" + ProbeUser, "--password-file=" + aclMountDir + "/" + ProbePasswordKey, "--listen-ip=$(POD_IP)", fmt.Sprintf("--port=%d", probePort)} {
		if !strings.Contains(cmd, want) {
			t.Errorf("probe sidecar's command %q lacks %s", cmd, want)
		}
	}
	if len(side.Ports) != 1 || side.Ports[0].ContainerPort != probePort {
		t.Errorf("probe sidecar's ports %+v: want %d", side.Ports, probePort)
	}
	if sc := side.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("probe sidecar's security context %+v: want a read-only root, no privilege escalation", sc)
	}
	if side.Resources.Limits.Memory().IsZero() || side.Resources.Requests.Cpu().IsZero() {
		t.Errorf("probe sidecar's resources %+v: want a memory limit and a CPU request", side.Resources)
	}
}
