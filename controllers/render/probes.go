package render

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// The Redis pods' probes: the kubelet asks the probe sidecar over HTTP, and the sidecar asks Redis.

// probePort is where the probe sidecar (cmd/keyroll-probe) answers the kubelet.
const probePort = 8081

// probeTimeout bounds a probe: the sidecar waits for Redis a second less than the kubelet waits
// for the sidecar, so that a Redis that does not answer gets the sidecar's 503, which says so.
const probeTimeout = 5

// httpProbe asks the probe sidecar's path every period seconds.
func httpProbe(path string, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromInt32(probePort), Scheme: corev1.URISchemeHTTP}},
		PeriodSeconds: period, TimeoutSeconds: probeTimeout, FailureThreshold: failures, SuccessThreshold: 1,
	}
}

// probeContainer is the probe sidecar (cmd/keyroll-probe, in the manager's image): it answers the
// Redis container's probes from Redis's own answers to the probe user, over the pod's loopback
// (readiness: loaded, and a replica linked and synced; liveness: any answer), one check at a time
// and at most 4 connections at once from each address, 256 in all, refusing the others at once:
// a flood of requests from other pods neither takes it past its memory limit (which would restart
// the pod's Redis with it) nor makes the kubelet's probes wait. A sidecar in the
// Kubernetes sense (an init container that restarts always): it starts before Redis and stops
// after it, so that it answers while Redis saves its data at a shutdown.
// ProbeContainerName is the probe sidecar's name in the Redis pods.
const ProbeContainerName = "probe"

func probeContainer(rc *v1beta1.RedisCluster, image string) corev1.Container {
	c := corev1.Container{
		Name:  ProbeContainerName,
		Image: image,
		// It listens on the pod's IP only: the kubelet probes that address; the pod's other
		// containers do not reach it over the loopback.
		Command: []string{"/keyroll-probe", "--listen-ip=$(POD_IP)", fmt.Sprintf("--port=%d", probePort),
			fmt.Sprintf("--redis-address=127.0.0.1:%d", RedisPort), "--user=" + ProbeUser,
			"--password-file=" + aclMountDir + "/" + ProbePasswordKey, fmt.Sprintf("--timeout=%ds", probeTimeout-1)},
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		// About 15 MiB resident after hundreds of probes; Go's soft limit keeps the heap well
		// below the container's.
		Env: []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "24MiB"},
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}}},
		Ports: []corev1.ContainerPort{{Name: "probe", ContainerPort: probePort, Protocol: corev1.ProtocolTCP}},
		Resources: corev1.ResourceRequirements{
			// No CPU limit: throttling could hold an answer past the probe's timeout.
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: "acl", MountPath: aclMountDir, ReadOnly: true}},
	}
	if TLSEnabled(rc) {
		c.Command = append(c.Command, probeTLSArgs(rc)...)
		c.VolumeMounts = append(c.VolumeMounts, tlsMount())
	}
	return c
}
