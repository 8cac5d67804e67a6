package render

import (
	"fmt"
	"maps"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// Builders of the objects a RedisCluster owns: plain functions from the spec to the object,
// without owner references (the reconciler sets those) and without a cluster.

const (
	redisPort      = 6379
	redisUID       = 999 // the redis user of the official image
	configMountDir = "/etc/keyroll/config"
	aclMountDir    = "/etc/keyroll/acl"
	credsMountDir  = "/etc/keyroll/credentials"
	runDir         = "/run/keyroll"
)

// Names of the owned objects.
func HeadlessServiceName(rc *v1alpha1.RedisCluster) string { return rc.Name + "-headless" }
func ConfigMapName(rc *v1alpha1.RedisCluster) string       { return rc.Name + "-config" }
func ACLSecretName(rc *v1alpha1.RedisCluster) string       { return rc.Name + "-acl" }

// credentialsSecretName is spec.credentials.secretName, or <name>-credentials.
func CredentialsSecretName(rc *v1alpha1.RedisCluster) string {
	if rc.Spec.Credentials.SecretName != "" {
		return rc.Spec.Credentials.SecretName
	}
	return rc.Name + "-credentials"
}

// selectorLabels select the Redis pods of a cluster.
func SelectorLabels(rc *v1alpha1.RedisCluster) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":     "redis",
		"app.kubernetes.io/instance": rc.Name,
		v1alpha1.LabelCluster:        rc.Name,
	}
}

// ownedLabels are set on every object keyroll creates for a cluster; the operator's Secret cache
// sees only Secrets that carry them.
func OwnedLabels(rc *v1alpha1.RedisCluster) map[string]string {
	l := SelectorLabels(rc)
	l[v1alpha1.LabelManagedBy] = v1alpha1.ManagedByValue
	return l
}

func objectMeta(rc *v1alpha1.RedisCluster, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: rc.Namespace, Labels: OwnedLabels(rc)}
}

// buildHeadlessService gives every Redis pod a stable DNS name, Ready or not.
func HeadlessService(rc *v1alpha1.RedisCluster) *corev1.Service {
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

// buildClientService is what clients connect to: the primary (pod 0).
func ClientService(rc *v1alpha1.RedisCluster) *corev1.Service {
	sel := SelectorLabels(rc)
	sel[appsv1.StatefulSetPodNameLabel] = rc.Name + "-0"
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
	return corev1.ServicePort{Name: "redis", Port: redisPort, TargetPort: intstr.FromString("redis"), Protocol: corev1.ProtocolTCP}
}

// buildConfigMap holds redis.conf (which loads the aclfile) and the start script.
func ConfigMap(rc *v1alpha1.RedisCluster) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: objectMeta(rc, ConfigMapName(rc))}
	cm.Data = map[string]string{
		"redis.conf": fmt.Sprintf(`# Written by keyroll for RedisCluster %s/%s.
port %d
dir /data
aclfile %s/%s
protected-mode no
appendonly no
include %s/runtime.conf
`, rc.Namespace, rc.Name, redisPort, aclMountDir, ACLFileKey, runDir),
		"start.sh": startScript(rc),
	}
	return cm
}

// startScript copies the credential the pod starts with into a pod-local directory (the readiness
// probe and replication use that copy, not the mounted Secret, which may change under a running
// pod), and makes every pod but pod 0 a replica of pod 0. The password reaches redis.conf only as
// \xHH escapes, so no character of it needs care. While Redis runs, the script reloads the aclfile
// (ACL LOAD, as the reload user) whenever the mounted Secret changes: a user keyroll drops after
// its lease is revoked is forgotten by every pod within about a minute (the kubelet's Secret
// refresh), without a restart. It passes SIGTERM on to Redis.
func startScript(rc *v1alpha1.RedisCluster) string {
	return fmt.Sprintf(`#!/bin/sh
set -eu
mkdir -p %[1]s/credentials
cp %[2]s/username %[2]s/password %[1]s/credentials/
chmod 0400 %[1]s/credentials/username %[1]s/credentials/password
: > %[1]s/runtime.conf
ordinal="${POD_NAME##*-}"
if [ "$ordinal" != "0" ]; then
  user="$(cat %[1]s/credentials/username)"
  pass="$(od -An -v -tx1 %[1]s/credentials/password | tr -d ' \n' | sed 's/../\\x&/g')"
  {
    echo "replicaof %[3]s-0.%[4]s %[5]d"
    echo "masteruser $user"
    echo "masterauth \"$pass\""
  } > %[1]s/runtime.conf
  chmod 0400 %[1]s/runtime.conf
fi
redis-server %[6]s/redis.conf &
redis=$!
trap 'kill -TERM "$redis" 2>/dev/null || true' TERM INT
(
  loaded="$(cksum < %[7]s/%[8]s)"
  while sleep "${KEYROLL_ACL_RELOAD_SECONDS:-10}"; do
    now="$(cksum < %[7]s/%[8]s)"
    [ "$now" = "$loaded" ] && continue
    if REDISCLI_AUTH="$(cat %[7]s/%[9]s)" redis-cli --no-auth-warning --user %[10]s -h 127.0.0.1 -p %[5]d ACL LOAD > /dev/null; then
      loaded="$now"
    fi
  done
) &
reloader=$!
status=0
wait "$redis" || status=$?
if [ "$status" -gt 128 ]; then
  # wait was interrupted by the signal passed on to Redis: wait for Redis itself, whose status is
  # the pod's (0 after a clean shutdown).
  status=0
  wait "$redis" || status=$?
fi
kill "$reloader" 2>/dev/null || true
exit "$status"
`, runDir, credsMountDir, rc.Name, HeadlessServiceName(rc), redisPort, configMountDir, aclMountDir, ACLFileKey, ReloadPasswordKey, reloadUser)
}

// readinessCommand authenticates with the credential the pod started with: a pod is Ready only
// when its Redis knows that credential.
func readinessCommand() []string {
	return []string{"sh", "-c", fmt.Sprintf(
		`REDISCLI_AUTH="$(cat %[1]s/credentials/password)" redis-cli --no-auth-warning --user "$(cat %[1]s/credentials/username)" -h 127.0.0.1 -p %[2]d ping | grep -q PONG`,
		runDir, redisPort)}
}

// buildACLSecret holds the aclfile that every Redis pod loads at start and reloads when it
// changes, and the password of the reload user that reloads it.
func ACLSecret(rc *v1alpha1.RedisCluster, aclFile, reloadPassword string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: objectMeta(rc, ACLSecretName(rc)),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{ACLFileKey: []byte(aclFile), ReloadPasswordKey: []byte(reloadPassword)},
	}
}

// buildCredentialsSecret is the Secret consumers read; its annotation names the credential version.
func CredentialsSecret(rc *v1alpha1.RedisCluster, username, password, version string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: objectMeta(rc, CredentialsSecretName(rc)),
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			rc.Spec.Credentials.UsernameKey: []byte(username),
			rc.Spec.Credentials.PasswordKey: []byte(password),
		},
	}
	s.Annotations = map[string]string{v1alpha1.AnnotationCredentialVersion: version}
	return s
}

// buildStatefulSet runs the Redis pods. Its update strategy is OnDelete: keyroll itself restarts
// pods, one at a time, when the credential changes. New pods start with the credential version in
// their annotations.
func StatefulSet(rc *v1alpha1.RedisCluster, version string) *appsv1.StatefulSet {
	labels := SelectorLabels(rc)
	podLabels := maps.Clone(labels)
	sts := &appsv1.StatefulSet{
		ObjectMeta: objectMeta(rc, rc.Name),
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(rc.Spec.Replicas),
			ServiceName:         HeadlessServiceName(rc),
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			PodManagementPolicy: appsv1.OrderedReadyPodManagement,
			UpdateStrategy:      appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      podLabels,
					Annotations: map[string]string{v1alpha1.AnnotationCredentialVersion: version},
				},
				Spec: redisPodSpec(rc),
			},
		},
	}
	if st := rc.Spec.Storage; st != nil {
		sts.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{
			ObjectMeta: metav1.ObjectMeta{Name: "data", Labels: labels},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: st.StorageClassName,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: st.Size}},
			},
		}}
	}
	return sts
}

func redisPodSpec(rc *v1alpha1.RedisCluster) corev1.PodSpec {
	spec := corev1.PodSpec{
		AutomountServiceAccountToken: ptr.To(false),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](redisUID), RunAsGroup: ptr.To[int64](redisUID),
			FSGroup: ptr.To[int64](redisUID), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{redisContainer(rc)},
		Volumes: []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: ConfigMapName(rc)}}}},
			{Name: "acl", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: ACLSecretName(rc), DefaultMode: ptr.To[int32](0o440)}}},
			{Name: "credentials", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: CredentialsSecretName(rc), DefaultMode: ptr.To[int32](0o440),
				Items: []corev1.KeyToPath{
					{Key: rc.Spec.Credentials.UsernameKey, Path: "username"},
					{Key: rc.Spec.Credentials.PasswordKey, Path: "password"},
				}}}},
			{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		},
	}
	if rc.Spec.Storage == nil {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return spec
}

func redisContainer(rc *v1alpha1.RedisCluster) corev1.Container {
	return corev1.Container{
		Name:      "redis",
		Image:     rc.Spec.Image + ":" + rc.Spec.Version,
		Command:   []string{"sh", configMountDir + "/start.sh"},
		Ports:     []corev1.ContainerPort{{Name: "redis", ContainerPort: redisPort, Protocol: corev1.ProtocolTCP}},
		Env:       []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}}, // apiVersion as the API server defaults it: the selector is applied whole
		Resources: rc.Spec.Resources,
		// Every probe field the API server would default is set, so that comparing with the stored
		// StatefulSet finds no change where there is none.
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: readinessCommand()}},
			PeriodSeconds: 5, TimeoutSeconds: 3, FailureThreshold: 2, SuccessThreshold: 1,
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "config", MountPath: configMountDir, ReadOnly: true},
			{Name: "acl", MountPath: aclMountDir, ReadOnly: true},
			{Name: "credentials", MountPath: credsMountDir, ReadOnly: true},
			{Name: "run", MountPath: runDir},
			{Name: "data", MountPath: "/data"},
		},
	}
}
