package render

import (
	"fmt"
	"maps"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// Builders of the objects a RedisCluster owns: plain functions from the spec to the object,
// without owner references (the reconciler sets those) and without a cluster.

// RedisPort is the port Redis listens on in every pod, and keyroll reaches each node on, by the
// pod's IP.
const RedisPort = 6379

const (
	redisUID       = 999 // the redis user of the official image
	configMountDir = "/etc/keyroll/config"
	aclMountDir    = "/etc/keyroll/acl"
	runDir         = "/run/keyroll"
)

// Names of the owned objects.
func HeadlessServiceName(rc *v1beta1.RedisCluster) string { return rc.Name + "-headless" }
func ConfigMapName(rc *v1beta1.RedisCluster) string       { return rc.Name + "-config" }
func ACLSecretName(rc *v1beta1.RedisCluster) string       { return rc.Name + "-acl" }

// PodDisruptionBudgetName is the cluster's only PodDisruptionBudget: one name per cluster, so
// that no two clusters' budgets share one.
func PodDisruptionBudgetName(rc *v1beta1.RedisCluster) string { return rc.Name + "-redis" }

// credentialsSecretName is spec.credentials.secretName, or <name>-credentials.
func CredentialsSecretName(rc *v1beta1.RedisCluster) string {
	if rc.Spec.Credentials.SecretName != "" {
		return rc.Spec.Credentials.SecretName
	}
	return rc.Name + "-credentials"
}

// selectorLabels select the Redis pods of a cluster.
func SelectorLabels(rc *v1beta1.RedisCluster) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":     "redis",
		"app.kubernetes.io/instance": rc.Name,
		v1beta1.LabelCluster:         rc.Name,
	}
}

// ownedLabels are set on every object keyroll creates for a cluster; the operator's Secret cache
// sees only Secrets that carry them.
func OwnedLabels(rc *v1beta1.RedisCluster) map[string]string {
	l := SelectorLabels(rc)
	l[v1beta1.LabelManagedBy] = v1beta1.ManagedByValue
	return l
}

func objectMeta(rc *v1beta1.RedisCluster, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: rc.Namespace, Labels: OwnedLabels(rc)}
}

// buildHeadlessService gives every Redis pod a stable DNS name, Ready or not.
func HeadlessService(rc *v1beta1.RedisCluster) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: objectMeta(rc, HeadlessServiceName(rc)),
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 SelectorLabels(rc),
			Ports:                    []corev1.ServicePort{redisServicePort()},
		},
	}
}

// ClientService is what clients connect to: the primary, the pod keyroll labels as such.
func ClientService(rc *v1beta1.RedisCluster) *corev1.Service {
	sel := SelectorLabels(rc)
	sel[v1beta1.LabelRole] = v1beta1.RolePrimary
	return &corev1.Service{
		ObjectMeta: objectMeta(rc, rc.Name),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: sel,
			Ports:    []corev1.ServicePort{redisServicePort()},
		},
	}
}

func redisServicePort() corev1.ServicePort {
	return corev1.ServicePort{Name: "redis", Port: RedisPort, TargetPort: intstr.FromString("redis"), Protocol: corev1.ProtocolTCP}
}

// PodDisruptionBudget lets a voluntary disruption (a node drain, an eviction) take one Redis pod
// of the cluster at a time. It selects the StatefulSet's pods by the StatefulSet's own selector,
// so it counts no pod the StatefulSet does not own. A pod that is not Ready (crash-looping, or
// never started) may always be evicted (unhealthyPodEvictionPolicy AlwaysAllow): it serves no
// client and replicates nothing, and with the default policy two such pods would block every
// node drain until someone deleted them by hand.
func PodDisruptionBudget(rc *v1beta1.RedisCluster) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: objectMeta(rc, PodDisruptionBudgetName(rc)),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr.To(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: SelectorLabels(rc)},
			UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow),
		},
	}
}

// buildConfigMap holds redis.conf (which loads the aclfile) and the start script.
func ConfigMap(rc *v1beta1.RedisCluster) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: objectMeta(rc, ConfigMapName(rc))}
	cm.Data = map[string]string{
		"redis.conf": fmt.Sprintf(`# Written by keyroll for RedisCluster %s/%s.
%sdir /data
aclfile %s/%s
protected-mode no
appendonly no
# Pods start one at a time: a replica's first sync need not wait for others to join it.
repl-diskless-sync-delay 0
include %s/runtime.conf
`, rc.Namespace, rc.Name, tlsConfig(rc), aclMountDir, ACLFileKey, runDir),
		"start.sh": startScript(rc),
		"peers":    peers(rc),
	}
	return cm
}

// peers names every pod of the cluster by its DNS name and port, one per line: the start script
// asks them who the primary is.
func peers(rc *v1beta1.RedisCluster) string {
	var b strings.Builder
	for i := range rc.Spec.Replicas {
		fmt.Fprintf(&b, "%s-%d.%s %d\n", rc.Name, i, HeadlessServiceName(rc), RedisPort)
	}
	return b.String()
}

// Keys of the ACL Secret the Redis pods mount: the aclfile (password hashes only) and the
// passwords of the two users a pod itself needs.
const (
	ReplicationPasswordKey = "replication-password"
	ProbePasswordKey       = "probe-password"
)

// AnnotationRulesAccepted on the ACL Secret names (RulesKey) the aclRules a Redis node of the
// cluster's image accepted: the aclfile holds app users only with rules Redis accepts, so that a
// pod never fails to start on its aclfile.
const AnnotationRulesAccepted = "keyroll.dev/acl-rules-accepted"

// ACLSecret holds the aclfile every Redis pod loads at start, and the replication and probe
// passwords. rulesAccepted is RulesKey of the rules the app users in the file have, or empty.
func ACLSecret(rc *v1beta1.RedisCluster, aclFile string, in Internal, rulesAccepted string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: objectMeta(rc, ACLSecretName(rc)),
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			ACLFileKey:             []byte(aclFile),
			ReplicationPasswordKey: []byte(in.Replication),
			ProbePasswordKey:       []byte(in.Probe),
		},
	}
	if rulesAccepted != "" {
		s.Annotations = map[string]string{AnnotationRulesAccepted: rulesAccepted}
	}
	return s
}

// Keys of the state Secret, which only keyroll reads: the admin user's password, and the current
// credential (VaultLease mode), kept there from its issue on, before any consumer has it.
const (
	AdminPasswordKey = "admin-password"
	StateUsernameKey = "username"
	StatePasswordKey = "password"
)

// StateSecretName is the Secret only keyroll reads.
func StateSecretName(rc *v1beta1.RedisCluster) string { return rc.Name + "-keyroll" }

// StateSecret holds the admin password and, when cred is set, the current credential.
func StateSecret(rc *v1beta1.RedisCluster, adminPassword string, cred *Credential) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: objectMeta(rc, StateSecretName(rc)),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{AdminPasswordKey: []byte(adminPassword)},
	}
	if cred != nil {
		s.Data[StateUsernameKey], s.Data[StatePasswordKey] = []byte(cred.Username), []byte(cred.Password)
	}
	return s
}

// VaultPluginSecretName is the Secret keyroll generates the Vault plugin user's password into,
// when spec.vaultPlugin names no Secret of the administrator's.
func VaultPluginSecretName(rc *v1beta1.RedisCluster) string { return rc.Name + "-vault-plugin" }

// VaultPluginSecret holds the Vault plugin user's name and password, for the Vault administrator.
func VaultPluginSecret(rc *v1beta1.RedisCluster, username, password string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: objectMeta(rc, VaultPluginSecretName(rc)),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"username": []byte(username), "password": []byte(password)},
	}
}

// RestartsPods says whether a rotation restarts the Redis pods (rollout.redisPods Restart).
func RestartsPods(rc *v1beta1.RedisCluster) bool {
	return rc.Spec.Rollout.RedisPods == v1beta1.RedisPodsRestart
}

// CredentialsSecret is the Secret consumers read; its annotation names the credential version.
// With TLS it also holds the CA bundle (CAKey) the consumers check the nodes against.
func CredentialsSecret(rc *v1beta1.RedisCluster, username, password, version string, ca []byte) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: objectMeta(rc, CredentialsSecretName(rc)),
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			rc.Spec.Credentials.UsernameKey: []byte(username),
			rc.Spec.Credentials.PasswordKey: []byte(password),
		},
	}
	if len(ca) > 0 {
		s.Data[CAKey] = ca
	}
	s.Annotations = map[string]string{v1beta1.AnnotationCredentialVersion: version}
	return s
}

// StatefulSet runs the Redis pods, with the probe sidecar from probeImage. Its update strategy is
// OnDelete: keyroll itself restarts pods, one at a time. With rollout.redisPods Restart, a
// rotation restarts them, and new pods start with the credential version in their annotations;
// with Live (the default) a rotation restarts none, and the template does not change with the
// credential.
func StatefulSet(rc *v1beta1.RedisCluster, version, probeImage string) *appsv1.StatefulSet {
	labels := SelectorLabels(rc)
	podLabels := maps.Clone(labels)
	sts := &appsv1.StatefulSet{
		ObjectMeta: objectMeta(rc, rc.Name),
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(statefulSetReplicas(rc)),
			ServiceName:         HeadlessServiceName(rc),
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			PodManagementPolicy: appsv1.OrderedReadyPodManagement,
			UpdateStrategy:      appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec:       redisPodSpec(rc, probeImage),
			},
		},
	}
	sts.Spec.Template.Annotations = map[string]string{
		v1beta1.AnnotationPodTemplate: PodTemplateHash(sts.Spec.Template),
		v1beta1.AnnotationDataPlane:   strconv.Itoa(DataPlaneVersion),
		// kubectl exec and logs pick the Redis container, not the probe sidecar.
		"kubectl.kubernetes.io/default-container": "redis",
	}
	if RestartsPods(rc) {
		sts.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion] = version
	}
	if st := rc.Spec.Storage; st != nil {
		// The list is atomic, so keyroll owns the defaults the API server fills in its items (the
		// volume mode, the status phase): they are written as the API server has them, or every
		// reconcile would find the StatefulSet changed and apply it again.
		sts.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{
			ObjectMeta: metav1.ObjectMeta{Name: "data", Labels: labels},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: st.StorageClassName,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: st.Size}},
				VolumeMode:       ptr.To(corev1.PersistentVolumeFilesystem),
			},
			Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
		}}
	}
	return sts
}

// statefulSetReplicas is how many pods the StatefulSet keeps: spec.replicas, and the primary
// while a scale-down waits for it to hand its role over to a pod that stays.
func statefulSetReplicas(rc *v1beta1.RedisCluster) int32 {
	p := rc.Status.Primary
	if p == "" {
		return rc.Spec.Replicas
	}
	n, _ := strconv.Atoi(p[strings.LastIndexByte(p, '-')+1:])
	return max(rc.Spec.Replicas, int32(n)+1)
}

func redisPodSpec(rc *v1beta1.RedisCluster, probeImage string) corev1.PodSpec {
	spec := corev1.PodSpec{
		AutomountServiceAccountToken: ptr.To(false),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](redisUID), RunAsGroup: ptr.To[int64](redisUID),
			FSGroup: ptr.To[int64](redisUID), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		InitContainers: []corev1.Container{probeContainer(rc, probeImage)},
		Containers:     []corev1.Container{redisContainer(rc)},
		Volumes: []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: ConfigMapName(rc)}}}},
			{Name: "acl", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: ACLSecretName(rc), DefaultMode: ptr.To[int32](0o440)}}},
			{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		},
	}
	if TLSEnabled(rc) {
		spec.Volumes = append(spec.Volumes, tlsVolume(rc))
	}
	if rc.Spec.Storage == nil {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	spec.Affinity = podAntiAffinity(rc)
	return spec
}

// podAntiAffinity keeps the cluster's pods on different nodes as spec.podAntiAffinity says
// (Preferred when unset).
func podAntiAffinity(rc *v1beta1.RedisCluster) *corev1.Affinity {
	term := corev1.PodAffinityTerm{
		LabelSelector: &metav1.LabelSelector{MatchLabels: SelectorLabels(rc)},
		TopologyKey:   corev1.LabelHostname,
	}
	switch rc.Spec.PodAntiAffinity {
	case v1beta1.PodAntiAffinityNone:
		return nil
	case v1beta1.PodAntiAffinityRequired:
		return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term}}}
	default:
		return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: term}}}}
	}
}

func redisContainer(rc *v1beta1.RedisCluster) corev1.Container {
	c := corev1.Container{
		Name:    "redis",
		Image:   rc.Spec.Image + ":" + rc.Spec.Version,
		Command: []string{"sh", configMountDir + "/start.sh"},
		Ports:   []corev1.ContainerPort{{Name: "redis", ContainerPort: RedisPort, Protocol: corev1.ProtocolTCP}},
		// apiVersion as the API server defaults it: the selector is applied whole.
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}},
		},
		Resources: rc.Spec.Resources,
		// The kubelet asks the probe sidecar over HTTP (an exec probe would start a process in the
		// container each time). Every probe field the API server would default is set, so that
		// comparing with the stored StatefulSet finds no change where there is none.
		ReadinessProbe: httpProbe("/ready", 5, 2),
		// Until Redis first answers (up to 10 minutes) the liveness probe does not run; then a
		// Redis that answers nothing for a minute (6 probes 10 s apart) is restarted. A long load
		// answers LOADING, at start as in a replica's resync later, and is left alone.
		StartupProbe:  httpProbe("/live", 2, 300),
		LivenessProbe: httpProbe("/live", 10, 6),
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "config", MountPath: configMountDir, ReadOnly: true},
			{Name: "acl", MountPath: aclMountDir, ReadOnly: true},
			{Name: "run", MountPath: runDir},
			{Name: "data", MountPath: "/data"},
		},
	}
	if TLSEnabled(rc) {
		c.VolumeMounts = append(c.VolumeMounts, tlsMount())
	}
	return c
}
