package render

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

func testCluster() *v1alpha1.RedisCluster {
	return &v1alpha1.RedisCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"},
		Spec: v1alpha1.RedisClusterSpec{
			Replicas: 3, Image: "docker.io/library/redis", Version: "7.2",
			Credentials: v1alpha1.CredentialsSpec{Source: v1alpha1.SourceVaultLease, UsernameKey: "user", PasswordKey: "pass"},
		},
	}
}

func TestStatefulSetIsOnDeleteAndMountsNoCredential(t *testing.T) {
	rc := testCluster()
	sts := StatefulSet(rc, "v1")
	if sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("update strategy %s, want OnDelete: keyroll restarts pods itself", sts.Spec.UpdateStrategy.Type)
	}
	if got, ok := sts.Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion]; ok {
		t.Errorf("redisPods Live: the pod template names credential %q, so it changes with each rotation", got)
	}
	rc.Spec.Rollout.RedisPods = v1alpha1.RedisPodsRestart
	if got := StatefulSet(rc, "v1").Spec.Template.Annotations[v1alpha1.AnnotationCredentialVersion]; got != "v1" {
		t.Errorf("redisPods Restart: pod template credential version %q", got)
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if c.Image != "docker.io/library/redis:7.2" || *sts.Spec.Replicas != 3 || sts.Spec.ServiceName != "orders-headless" {
		t.Errorf("image %s, replicas %d, service %s", c.Image, *sts.Spec.Replicas, sts.Spec.ServiceName)
	}
	probe := strings.Join(c.ReadinessProbe.Exec.Command, " ")
	if !strings.Contains(probe, "REDISCLI_AUTH") || !strings.Contains(probe, "--user "+ProbeUser) || !strings.Contains(probe, "master_link_status:up") {
		t.Errorf("the readiness probe must log in as the probe user without a password on the command line, and check replication: %s", probe)
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
		ACLSecret(rc, "x", Internal{}, "").Labels, CredentialsSecret(rc, "u", "p", "v").Labels,
		StateSecret(rc, "a", nil).Labels, VaultPluginSecret(rc, "vault", "p").Labels,
		ConfigMap(rc).Labels, HeadlessService(rc).Labels, ClientService(rc).Labels,
		StatefulSet(rc, "v").Labels,
	} {
		if labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue || labels[v1alpha1.LabelCluster] != "orders" {
			t.Errorf("labels %v", labels)
		}
	}
	s := CredentialsSecret(rc, "u", "p", "v9")
	if string(s.Data["user"]) != "u" || string(s.Data["pass"]) != "p" || s.Annotations[v1alpha1.AnnotationCredentialVersion] != "v9" {
		t.Errorf("credentials Secret %+v", s)
	}
	if sel := ClientService(rc).Spec.Selector[appsv1.StatefulSetPodNameLabel]; sel != "orders-0" {
		t.Errorf("the client Service selects %q, want the primary orders-0", sel)
	}
}

func TestRedisConfLoadsTheACLFile(t *testing.T) {
	cm := ConfigMap(testCluster())
	if !strings.Contains(cm.Data["redis.conf"], "aclfile /etc/keyroll/acl/users.acl") {
		t.Errorf("redis.conf: %s", cm.Data["redis.conf"])
	}
	if !strings.Contains(cm.Data["start.sh"], "replicaof orders-0.orders-headless 6379") {
		t.Errorf("start.sh does not make replicas follow pod 0: %s", cm.Data["start.sh"])
	}
}
