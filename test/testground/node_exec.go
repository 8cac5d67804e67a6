package testground

import (
	"bytes"
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// Exec runs a command in a container of a pod on the real node through the API server (as
// `kubectl exec` does: the API server asks the kubelet by the node's InternalIP) and returns its
// standard output and error. A command that exits non-zero is an error that carries its stderr.
func (n *Node) Exec(ctx context.Context, namespace, pod, container string, command ...string) (stdout, stderr string, err error) {
	req := n.cp.Clientset.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container, Command: command, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	exec, err := remotecommand.NewSPDYExecutor(n.cp.Config, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	var out, errOut bytes.Buffer
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	if err != nil {
		return out.String(), errOut.String(), fmt.Errorf("exec %v in %s/%s: %w (stderr: %s)", command, namespace, pod, err, errOut.String())
	}
	return out.String(), errOut.String(), nil
}
