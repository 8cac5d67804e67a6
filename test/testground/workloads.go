package testground

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
)

// NodeName is the fake Node that kwok manages and the binder places pods on when no real node
// runs (or when they select it, see NodeLabel).
const NodeName = "kwok-node-0"

// KwokPodCIDR is the fake node's pod CIDR, from which kwok gives its pods their IPs: a loopback
// range, so that a client that dials a fake pod (keyroll connects to every Redis pod by its IP)
// is refused on this machine. kwok's own default (10.0.0.1/24) would send those packets out of
// the machine, to the default gateway.
const KwokPodCIDR = "127.211.0.0/16"

// Workloads makes pods happen: kube-controller-manager runs the workload controllers
// (StatefulSet, Deployment, ReplicaSet, DaemonSet), the disruption controller and the garbage
// collector; a binder (the ground has no scheduler) places each pending pod on a node; kwok plays
// a fake Node's kubelet and marks its pods Running and Ready. With a real node, the binder places
// pods there by default and kube-controller-manager also runs what real pods need (service
// accounts, the root CA ConfigMap, EndpointSlices, namespace deletion).
type Workloads struct {
	kcm, kwok *Process
	cancel    context.CancelFunc
	done      chan struct{}

	dir, kwokBin string
	kwokArgs     []string
}

// WorkloadsOptions selects the nodes pods go to.
type WorkloadsOptions struct {
	// Kwok runs kwok and its fake node.
	Kwok bool
	// RealNode means a real node (Node) runs; it is the default placement.
	RealNode bool
	// APIQPS is kube-controller-manager's API rate (--kube-api-qps, burst twice that); zero: its
	// default (20/s), which makes it the bottleneck when a benchmark creates a thousand workloads.
	APIQPS int
}

// Controllers that kube-controller-manager runs for the tests. The disruption controller keeps the
// status of PodDisruptionBudgets (keyroll's, for the Redis pods), by which the API server allows or
// refuses an eviction.
var kcmControllers = []string{
	"statefulset-controller", "deployment-controller", "replicaset-controller",
	"daemonset-controller", "garbage-collector-controller", "disruption-controller",
}

// Controllers that kube-controller-manager runs besides kcmControllers when a real node runs.
var realNodeControllers = []string{
	"serviceaccount-controller", "root-ca-certificate-publisher-controller", "endpointslice-controller",
	"namespace-controller",
	// Binds the claims of Redis pods with spec.storage to volumes a test made (the ground has no
	// provisioner).
	"persistentvolume-binder-controller",
}

// StartWorkloads starts kube-controller-manager, the binder and, with opts.Kwok, kwok against cp.
func StartWorkloads(dir string, cp *ControlPlane, opts WorkloadsOptions) (*Workloads, error) {
	kcmBin, err := Binary("kube-controller-manager")
	if err != nil {
		return nil, err
	}
	w := &Workloads{done: make(chan struct{}), dir: dir}
	if opts.Kwok {
		if err := w.prepareKwok(cp); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	if opts.Kwok {
		if err := createFakeNode(ctx, cp); err != nil {
			w.Stop()
			return nil, err
		}
	}
	controllers, args := kcmControllers, []string(nil)
	if opts.APIQPS > 0 {
		args = append(args, fmt.Sprintf("--kube-api-qps=%d", opts.APIQPS), fmt.Sprintf("--kube-api-burst=%d", 2*opts.APIQPS),
			"--concurrent-statefulset-syncs=20")
	}
	if opts.RealNode {
		controllers = append(slices.Clone(kcmControllers), realNodeControllers...)
		args = append(args, "--root-ca-file="+cp.CAFile)
	}
	w.kcm, err = StartProcess(dir, "kube-controller-manager", kcmBin, append([]string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false", "--secure-port=0",
		"--concurrent-statefulset-syncs=5", "--concurrent-deployment-syncs=5",
	}, args...), nil)
	if err != nil {
		w.Stop()
		return nil, err
	}
	placement := []string{NodeName}
	if opts.RealNode {
		placement = []string{RealNodeName, NodeName}
	}
	go func() {
		defer close(w.done)
		runBinder(ctx, cp, placement)
	}()
	if opts.Kwok {
		if err := w.startKwok(func() error { return nodeReady(ctx, cp) }); err != nil {
			w.Stop()
			return nil, fmt.Errorf("kwok did not make node %s Ready: %w", NodeName, err)
		}
	}
	return w, nil
}

// prepareKwok finds kwok and its stages and sets its arguments: it manages only the nodes the
// ground marks as fake, so that it never takes over a real node.
func (w *Workloads) prepareKwok(cp *ControlPlane) error {
	kwokBin, err := Binary("kwok")
	if err != nil {
		return err
	}
	stages, err := filepath.Glob(filepath.Join(BinDir(), "kwok-stages", "*.yaml"))
	if err != nil || len(stages) == 0 {
		return fmt.Errorf("kwok stages not found in %s: run `make testground`", filepath.Join(BinDir(), "kwok-stages"))
	}
	kwokPort, err := FreePort()
	if err != nil {
		return err
	}
	args := []string{"--kubeconfig=" + cp.Kubeconfig, "--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--server-address=127.0.0.1:" + strconv.Itoa(kwokPort), "--node-ip=127.0.0.1"}
	for _, s := range stages {
		args = append(args, "--config="+s)
	}
	w.kwokBin, w.kwokArgs = kwokBin, args
	return nil
}

// kwokStartTries bounds the starts of kwok. kwok v0.8.0 sometimes dies at start with "concurrent
// map writes" (its node and pod controllers initialise a shared CEL type registry at once); a new
// start gets past it.
const kwokStartTries = 3

// startKwok starts kwok and waits until ready passes and kwok has survived its first seconds,
// starting it again when it died at start.
func (w *Workloads) startKwok(ready func() error) error {
	var err error
	for try := 1; try <= kwokStartTries; try++ {
		w.kwok, err = StartProcess(w.dir, fmt.Sprintf("kwok-%d", try), w.kwokBin, w.kwokArgs, []string{"HOME=" + w.dir}) // HOME: no ~/.kwok
		if err != nil {
			return err
		}
		settled := time.Now().Add(3 * time.Second)
		err = waitFor(w.kwok, 30*time.Second, func() error {
			if err := ready(); err != nil {
				return err
			}
			if time.Now().Before(settled) {
				return errors.New("kwok is starting")
			}
			return nil
		})
		if err == nil || !w.kwok.Exited() {
			return err
		}
		fmt.Fprintf(os.Stderr, "testground: kwok died at start (try %d of %d): %v\n", try, kwokStartTries, err)
	}
	return err
}

// PauseKubelets stops kwok: pods are still created and bound, but none on the kwok node becomes
// Ready (or goes away when deleted) until ResumeKubelets.
func (w *Workloads) PauseKubelets() { w.kwok.Stop() }

// ResumeKubelets starts kwok again.
func (w *Workloads) ResumeKubelets() error {
	return w.startKwok(func() error { return nil })
}

// Processes are kube-controller-manager and kwok (when it runs).
func (w *Workloads) Processes() []*Process {
	if w.kwok == nil {
		return []*Process{w.kcm}
	}
	return []*Process{w.kcm, w.kwok}
}

// Stop ends the binder, kwok and kube-controller-manager.
func (w *Workloads) Stop() {
	if w == nil {
		return
	}
	w.cancel()
	w.kwok.Stop()
	w.kcm.Stop()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
	}
}

func createFakeNode(ctx context.Context, cp *ControlPlane) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        NodeName,
		Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		Labels: map[string]string{"type": "kwok", corev1.LabelHostname: NodeName, NodeLabel: "kwok",
			corev1.LabelOSStable: "linux", corev1.LabelArchStable: goruntime.GOARCH},
	}, Spec: corev1.NodeSpec{PodCIDR: KwokPodCIDR, PodCIDRs: []string{KwokPodCIDR}}}
	created, err := cp.Clientset.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating node %s: %w", NodeName, err)
	}
	created.Status.Capacity = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods: resource.MustParse("500"),
	}
	created.Status.Allocatable = created.Status.Capacity
	_, err = cp.Clientset.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

func nodeReady(ctx context.Context, cp *ControlPlane) error {
	n, err := cp.Clientset.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("node %s not Ready yet", NodeName)
}

// runBinder binds every pod without a node, as the test ground has no scheduler: to the first node
// of placement whose labels the pod's nodeSelector matches (the first node when it has none).
func runBinder(ctx context.Context, cp *ControlPlane, placement []string) {
	nodeLabels := map[string]map[string]string{
		NodeName:     {"type": "kwok", corev1.LabelHostname: NodeName, NodeLabel: "kwok"},
		RealNodeName: {corev1.LabelHostname: RealNodeName, NodeLabel: "real"},
	}
	for _, l := range nodeLabels { // as a kubelet labels its node
		l[corev1.LabelOSStable], l[corev1.LabelArchStable] = "linux", goruntime.GOARCH
	}
	lw := cache.NewFilteredListWatchFromClient(cp.Clientset.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "").String()
		})
	bind := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil {
			return
		}
		node := placeFor(nodeSelector(ctx, cp, pod), placement, nodeLabels)
		if node == "" {
			return // no node of the ground matches: the pod stays Pending
		}
		b := &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}
		// A failed bind (the pod is gone, or already bound) needs no retry; a pending pod is seen again on resync.
		_ = cp.Clientset.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{})
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 5*time.Second, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    bind,
		UpdateFunc: func(_, obj any) { bind(obj) },
	})
	inf.Run(ctx.Done())
}

// nodeSelector is the pod's nodeSelector; when it does not name a node of the ground (NodeLabel)
// and the pod's Namespace carries NodeLabel, that label is added: a namespace labelled
// {NodeLabel: "kwok"} sends its pods to kwok's fake node (for objects applied as written, such
// as the manager Deployment of deploy/default, whose image the real node does not have).
func nodeSelector(ctx context.Context, cp *ControlPlane, pod *corev1.Pod) map[string]string {
	if _, ok := pod.Spec.NodeSelector[NodeLabel]; ok {
		return pod.Spec.NodeSelector
	}
	ns, err := cp.Clientset.CoreV1().Namespaces().Get(ctx, pod.Namespace, metav1.GetOptions{})
	if err != nil || ns.Labels[NodeLabel] == "" {
		return pod.Spec.NodeSelector
	}
	sel := maps.Clone(pod.Spec.NodeSelector)
	if sel == nil {
		sel = map[string]string{}
	}
	sel[NodeLabel] = ns.Labels[NodeLabel]
	return sel
}

// placeFor is the first node of placement whose labels hold every entry of selector.
func placeFor(selector map[string]string, placement []string, labels map[string]map[string]string) string {
	for _, node := range placement {
		ok := true
		for k, v := range selector {
			if labels[node][k] != v {
				ok = false
				break
			}
		}
		if ok {
			return node
		}
	}
	return ""
}
