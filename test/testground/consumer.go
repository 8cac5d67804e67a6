package testground

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/test/consumer/stats"
)

// ConsumerStats are the counters test/consumer serves on /stats; ConsumerFailure is one failed
// command of them.
type (
	ConsumerStats   = stats.Stats
	ConsumerFailure = stats.Failure
)

// ConsumerPort is where a consumer pod serves /stats, on its pod IP.
const ConsumerPort = 8080

// ConsumerOption changes a consumer pod's container.
type ConsumerOption func(*corev1.Container)

// ConsumerTLS makes the consumer connect with TLS, verifying the server certificate against the
// ca.crt of its credentials Secret, for serverName.
func ConsumerTLS(serverName string) ConsumerOption {
	return func(c *corev1.Container) {
		c.Args = append(c.Args, "-tls", "-tls-server-name="+serverName)
	}
}

// ConsumerPod is a pod of ConsumerImage (restricted Pod Security Standard) that runs SET and GET
// against redisAddr (host:port, e.g. a client Service's name and 6379) with the credential of
// the Secret secretName (keys username and password, and ca.crt with ConsumerTLS; mounted, so
// that a change of the Secret reaches it as the kubelet refreshes the volume), and serves its
// counters on ConsumerPort. opts change its container.
func ConsumerPod(namespace, name, redisAddr, secretName string, opts ...ConsumerOption) *corev1.Pod {
	const dir = "/etc/consumer/credentials"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			AutomountServiceAccountToken:  ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "consumer", Image: ConsumerImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"-redis=" + redisAddr, "-credentials=" + dir, fmt.Sprintf("-listen=$(POD_IP):%d", ConsumerPort)},
				Env: []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
				Ports:        []corev1.ContainerPort{{Name: "stats", ContainerPort: ConsumerPort}},
				VolumeMounts: []corev1.VolumeMount{{Name: "credentials", MountPath: dir, ReadOnly: true}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
			Volumes: []corev1.Volume{{Name: "credentials", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: secretName}}}},
		},
	}
	for _, opt := range opts {
		opt(&pod.Spec.Containers[0])
	}
	return pod
}

// ReadConsumerStats asks a consumer pod (by its pod IP) for its counters.
func ReadConsumerStats(podIP string) (ConsumerStats, error) {
	var s ConsumerStats
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://%s/stats", net.JoinHostPort(podIP, fmt.Sprint(ConsumerPort))))
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("consumer stats: %s", resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// ConsumerDeployment is a Deployment of replicas consumer pods (ConsumerPod), labelled app=name.
func ConsumerDeployment(namespace, name string, replicas int32, redisAddr, secretName string, opts ...ConsumerOption) *appsv1.Deployment {
	sel, tmpl := consumerTemplate(namespace, name, redisAddr, secretName, opts...)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Selector: sel, Template: tmpl},
	}
}

// ConsumerStatefulSet is a StatefulSet of replicas consumer pods (ConsumerPod), labelled app=name,
// rolled one pod at a time (RollingUpdate, the default).
func ConsumerStatefulSet(namespace, name string, replicas int32, redisAddr, secretName string, opts ...ConsumerOption) *appsv1.StatefulSet {
	sel, tmpl := consumerTemplate(namespace, name, redisAddr, secretName, opts...)
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       appsv1.StatefulSetSpec{Replicas: ptr.To(replicas), Selector: sel, Template: tmpl},
	}
}

// consumerTemplate is ConsumerPod as a workload's selector and pod template.
func consumerTemplate(namespace, name, redisAddr, secretName string, opts ...ConsumerOption) (*metav1.LabelSelector, corev1.PodTemplateSpec) {
	pod := ConsumerPod(namespace, name, redisAddr, secretName, opts...)
	return &metav1.LabelSelector{MatchLabels: pod.Labels}, corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels}, Spec: pod.Spec}
}

// FinalConsumerStats are the counters a consumer pod wrote when it stopped (its termination
// message), if it has stopped.
func FinalConsumerStats(p *corev1.Pod) (ConsumerStats, bool) {
	var s ConsumerStats
	for _, c := range p.Status.ContainerStatuses {
		if t := c.State.Terminated; c.Name == "consumer" && t != nil && t.Message != "" {
			return s, json.Unmarshal([]byte(t.Message), &s) == nil
		}
	}
	return s, false
}
