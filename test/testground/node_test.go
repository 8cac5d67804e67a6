package testground

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The real node and kwok's fake node side by side: a pod without a nodeSelector runs on the real
// node, in containerd, with its command really running; a pod that selects the kwok node, and a
// pod without a nodeSelector in a namespace labelled for kwok, are made Ready there by kwok; and
// kwok leaves the real node to its kubelet.
func TestRealNodeAndKwokSideBySide(t *testing.T) {
	start := time.Now()
	g := StartT(t, Options{Node: true, Workloads: true})
	t.Logf("test ground with the real node and kwok up in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := g.CP.Clientset
	real, err := cs.CoreV1().Nodes().Get(ctx, RealNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if info := real.Status.NodeInfo; info.KubeletVersion != "v1.37.2" || !strings.HasPrefix(info.ContainerRuntimeVersion, "containerd://") {
		t.Errorf("the real node reports kubelet %q and runtime %q; want v1.37.2 and containerd", info.KubeletVersion, info.ContainerRuntimeVersion)
	}
	if _, managed := real.Annotations["kwok.x-k8s.io/node"]; managed {
		t.Errorf("the real node carries kwok's annotation: %v", real.Annotations)
	}
	kwokNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "to-kwok", Labels: map[string]string{NodeLabel: "kwok"}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, kwokNS, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNamespaceReady(t, ctx, g, "default")
	waitNamespaceReady(t, ctx, g, "to-kwok")
	onReal := sleeperPod("on-real", nil)
	onKwok := sleeperPod("on-kwok", map[string]string{NodeLabel: "kwok"})
	inKwokNS := sleeperPod("in-kwok-namespace", nil)
	inKwokNS.Namespace = "to-kwok"
	for _, p := range []*corev1.Pod{onReal, onKwok, inKwokNS} {
		if _, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	created := time.Now()
	got := map[string]*corev1.Pod{}
	for _, p := range []*corev1.Pod{onReal, onKwok, inKwokNS} {
		got[p.Name] = waitPodReady(t, ctx, g, p.Namespace, p.Name)
	}
	t.Logf("the pods Ready %s after they were created", time.Since(created).Round(time.Millisecond))
	if n := got["on-real"].Spec.NodeName; n != RealNodeName {
		t.Errorf("the pod without a nodeSelector went to %q, want %s", n, RealNodeName)
	}
	if n := got["on-kwok"].Spec.NodeName; n != NodeName {
		t.Errorf("the pod selecting kwok went to %q, want %s", n, NodeName)
	}
	if n := got["in-kwok-namespace"].Spec.NodeName; n != NodeName {
		t.Errorf("the pod in a namespace labelled for kwok went to %q, want %s", n, NodeName)
	}
	if id := got["on-real"].Status.ContainerStatuses[0].ContainerID; !strings.HasPrefix(id, "containerd://") {
		t.Errorf("the real node's pod has container id %q, want a containerd one", id)
	}
	out, _, err := g.Node.Exec(ctx, "default", "on-real", "c", "cat", "/proc/1/cmdline")
	if err != nil || !strings.Contains(out, "sleep") {
		t.Errorf("exec in the real pod: %q, %v; want its sleep command as pid 1", out, err)
	}
	checkPausedKubeletHoldsThePod(t, ctx, g, "on-real")
}

// checkPausedKubeletHoldsThePod deletes a pod of the real node while its kubelet is held: the pod
// stays (Terminating) for several of its grace periods, and goes once the kubelet resumes.
func checkPausedKubeletHoldsThePod(t *testing.T, ctx context.Context, g *Ground, name string) {
	t.Helper()
	cs := g.CP.Clientset
	if err := g.Node.PauseKubelet(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = g.Node.ResumeKubelet()
		}
	}()
	if st := ProcessState(g.Node.kubelet.PID()); st != "T" {
		t.Errorf("the held kubelet is in state %q, want T (stopped)", st)
	}
	if err := cs.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The pod's grace period is 1 s: a running kubelet removes it within about two.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if _, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Fatalf("the pod went while the kubelet was held: %v", err)
		}
	}
	if err := g.Node.ResumeKubelet(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	since := time.Now()
	for {
		_, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			t.Logf("the pod went %s after the kubelet resumed", time.Since(since).Round(time.Millisecond))
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the pod is still there after the kubelet resumed (%v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func sleeperPod(name string, selector map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeSelector:                  selector,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "c", Image: RedisImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"}}},
		},
	}
}

// waitNamespaceReady waits for the namespace's default ServiceAccount (pods need it with the
// ServiceAccount admission plugin on).
func waitNamespaceReady(t *testing.T, ctx context.Context, g *Ground, ns string) {
	t.Helper()
	for {
		if _, err := g.CP.Clientset.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no default ServiceAccount in %s", ns)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitPodReady(t *testing.T, ctx context.Context, g *Ground, ns, name string) *corev1.Pod {
	t.Helper()
	for {
		p, err := g.CP.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return p
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s/%s not Ready: %v %s", ns, name, err, describePod(p))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func describePod(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf("node %q phase %s conditions %+v containers %+v", p.Spec.NodeName, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
}
