package testground

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RealNodeName is the real node's name. Pods go to it unless they ask for the kwok node (see
// NodeLabel).
const RealNodeName = "keyroll-node-0"

// NodeLabel tells the ground's nodes apart: "real" on the real node, "kwok" on kwok's fake node.
// A pod with the nodeSelector {NodeLabel: "kwok"} goes to the kwok node when both run, and so does
// a pod without NodeLabel in its nodeSelector in a Namespace labelled {NodeLabel: "kwok"}.
const NodeLabel = "testground.keyroll.dev/node"

// Node is a real Kubernetes node on this machine: containerd (Debian's) with runc, its own
// configuration, state, root and sockets under the ground's directory; a CNI bridge network of
// its own (see NodeBridge); the kubelet; kube-proxy in iptables mode, so that ClusterIP Services
// route; and CoreDNS for cluster.local with no forwarder. Its images are built on this machine
// (see images.go) and imported into containerd: nothing is pulled. Stop (or, if the test process
// dies, the node's janitor) ends its processes and containers and undoes every change it made to
// the machine: mounts, the bridge, iptables chains, cgroups, sysctls, fixed host paths.
type Node struct {
	Name string
	// IP is the node's InternalIP, on its bridge: pods reach the host there.
	IP  net.IP
	Dir string
	// ContainerdSocket is containerd's gRPC socket (for ctr -a).
	ContainerdSocket string
	// Corefile is CoreDNS's configuration.
	Corefile string

	cp                                                   *ControlPlane
	lock                                                 *os.File
	state                                                *nodeState
	janitor                                              *janitor
	kubeletClientCert, kubeletClientKey, kubeletClientCA string
	containerd, kubelet, kubeProxy, coreDNS              *Process
	proxies                                              []*Proxy
	pendingImages                                        []string
	// attached: the node runs in another process (Attach); kubeletPID is its kubelet's.
	attached   bool
	kubeletPID int
	// managerImage says whether LoadManagerImage loaded the manager's image already.
	managerImage struct {
		sync.Mutex
		loaded bool
	}
}

// PrepareNode readies the machine for a real node before the control plane starts: it takes the
// machine's node lock (waiting while another real node runs), cleans up what a previous node may
// have left, records the settings it will change, starts the janitor, creates the bridge and the
// certificates the API server needs for the kubelet (APIServerSettings).
func PrepareNode(dir string) (n *Node, err error) {
	if err := checkNodeTools(); err != nil {
		return nil, err
	}
	n = &Node{Name: RealNodeName, IP: NodeIP, Dir: filepath.Join(dir, "node")}
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return nil, err
	}
	if n.lock, err = lockNode(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.Stop()
			n = nil
		}
	}()
	if err := cleanStaleNode(); err != nil {
		return n, fmt.Errorf("cleaning up after an earlier node: %w", err)
	}
	n.state = &nodeState{Dir: n.Dir, Sysctls: readSysctls()}
	for _, p := range fixedHostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			n.state.CreatedPaths = append(n.state.CreatedPaths, p)
		}
	}
	if err := n.state.save(); err != nil {
		return n, err
	}
	if n.janitor, err = startJanitor(filepath.Join(n.Dir, "janitor.log"), n.lock); err != nil {
		return n, err
	}
	if err := createBridge(); err != nil {
		return n, err
	}
	return n, n.writeKubeletClientCert()
}

// checkNodeTools fails with a message saying how to get the first missing program.
func checkNodeTools() error {
	for _, name := range []string{"kubelet", "kube-proxy", "coredns", "ociimage"} {
		if _, err := Binary(name); err != nil {
			return err
		}
	}
	for name, pkg := range map[string]string{
		"containerd": "containerd", "ctr": "containerd", "runc": "runc", "ip": "iproute2",
		"iptables": "iptables", "conntrack": "conntrack", "gcc": "gcc", "busybox": "busybox-static",
		"redis-check-rdb": "redis-server", "redis-cli": "redis-tools", "curl": "curl",
	} {
		if _, err := SystemBinary(name, pkg); err != nil {
			return err
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return errors.New("CNI plugins not found in /usr/lib/cni: install the Debian package containernetworking-plugins (test/tools/install-deps.sh)")
	}
	if os.Geteuid() != 0 {
		return errors.New("a real node needs root (containerd, the kubelet, a bridge, iptables)")
	}
	return nil
}

// NodeLockTaken is what a ground that had to wait for the node lock prints once it has it (the
// playground's test reads its log to time its start from there).
const NodeLockTaken = "testground: the real node's lock is ours; starting the node"

// inheritedLockEnv names the descriptor of a node lock that the process's parent took and handed
// down (a test that must see the machine before the node and after its cleanup, with no other
// node in between); lockNode then uses it as it is.
const inheritedLockEnv = "KEYROLL_TESTGROUND_NODE_LOCK_FD"

// lockNode takes the machine's node lock, waiting up to half an hour for another node to stop
// (test packages run in parallel; only one real node can run at a time).
func lockNode() (*os.File, error) {
	if fd := os.Getenv(inheritedLockEnv); fd != "" {
		n, err := strconv.Atoi(fd)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", inheritedLockEnv, fd, err)
		}
		return os.NewFile(uintptr(n), nodeLockFile), nil
	}
	f, err := os.OpenFile(nodeLockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline, said := time.Now().Add(30*time.Minute), false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			if said {
				fmt.Fprintln(os.Stderr, NodeLockTaken)
			}
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("taking the real node's lock %s: %w", nodeLockFile, err)
		}
		if !said {
			fmt.Fprintln(os.Stderr, "testground: another real node runs on this machine; waiting for it to stop")
			said = true
		}
		time.Sleep(time.Second)
	}
}

// cleanStaleNode undoes what a node that could not clean up left: from its record if there is
// one, and in any case its bridge, iptables chains and cgroups.
func cleanStaleNode() error {
	s, err := loadNodeState()
	if errors.Is(err, os.ErrNotExist) {
		s = &nodeState{}
	} else if err != nil {
		return err
	}
	if s.Dir == "" && !bridgeExists() && len(NodeIPTablesChains()) == 0 && len(cgroupDirs()) == 0 {
		return nil
	}
	fmt.Fprintln(os.Stderr, "testground: cleaning up what an earlier real node left")
	return cleanupNode(s)
}

// writeKubeletClientCert makes the CA the kubelet trusts and the client certificate the API
// server shows it (exec, logs, port-forward).
func (n *Node) writeKubeletClientCert() error {
	ca, err := newCA("keyroll-testground-kubelet-client-ca")
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := ca.issue(certRequest{CommonName: "kube-apiserver-kubelet-client", Organizations: []string{"system:masters"}})
	if err != nil {
		return err
	}
	n.kubeletClientCA = filepath.Join(n.Dir, "kubelet-client-ca.crt")
	n.kubeletClientCert = filepath.Join(n.Dir, "apiserver-kubelet-client.crt")
	n.kubeletClientKey = filepath.Join(n.Dir, "apiserver-kubelet-client.key")
	if err := os.WriteFile(n.kubeletClientCA, ca.CertPEM, 0o644); err != nil {
		return err
	}
	return writeKeyPair(n.kubeletClientCert, n.kubeletClientKey, certPEM, keyPEM)
}

// APIServerSettings is how the control plane must start for this node.
func (n *Node) APIServerSettings() *NodeAPIServer {
	return &NodeAPIServer{
		AdvertiseIP: n.IP, ServiceCIDR: ServiceCIDR, ServiceIP: KubernetesServiceIP,
		KubeletClientCert: n.kubeletClientCert, KubeletClientKey: n.kubeletClientKey,
	}
}

// Start runs the node against cp: the API server exposed on the bridge (with the kubernetes
// Service's endpoint there), the images, containerd, the kubelet, kube-proxy and CoreDNS. It
// returns once the node is Ready and CoreDNS answers.
func (n *Node) Start(ctx context.Context, cp *ControlPlane) error {
	n.cp = cp
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"exposing the API server on the bridge", n.exposeAPIServer},
		{"building the node's images", n.buildImages},
		{"starting containerd", n.startContainerd},
		{"starting the kubelet", n.startKubelet},
		{"starting kube-proxy", n.startKubeProxy},
		{"starting CoreDNS", n.startCoreDNS},
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("real node: %s: %w", s.name, err)
		}
	}
	return nil
}

// Expose forwards an address on the node's bridge to target (a loopback host:port), so that pods
// reach a server of the host that listens on loopback only; it returns host:port on the bridge.
// The proxy stops with the node.
func (n *Node) Expose(target string) (string, error) {
	p, err := StartProxyOn(n.IP.String(), target)
	if err != nil {
		return "", err
	}
	n.proxies = append(n.proxies, p)
	return net.JoinHostPort(n.IP.String(), strconv.Itoa(p.Port)), nil
}

// exposeAPIServer makes the API server reachable from pods: a proxy on the bridge, and that
// address as the endpoint of the kubernetes Service (the API server's endpoint reconciler is off,
// since it will not advertise a loopback address).
func (n *Node) exposeAPIServer(ctx context.Context) error {
	u, err := url.Parse(n.cp.Config.Host)
	if err != nil {
		return err
	}
	addr, err := n.Expose(u.Host)
	if err != nil {
		return err
	}
	_, portStr, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portStr)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "keyroll-testground"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{n.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	_, err = n.cp.Clientset.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, slice, metav1.CreateOptions{})
	return err
}

// addUser writes a kubeconfig for a user of the API server and returns its path.
func (n *Node) addUser(name string, groups ...string) (string, error) {
	user, err := n.cp.Env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return "", fmt.Errorf("adding user %s: %w", name, err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.Dir, filepath.Base(name)+".kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// bindClusterRole creates a ClusterRole with rules and binds it to a user.
func (n *Node) bindClusterRole(ctx context.Context, name, user string, rules []rbacv1.PolicyRule) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := n.cp.Clientset.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if _, err := n.cp.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// Processes are the node's processes: containerd, the kubelet, kube-proxy and CoreDNS.
func (n *Node) Processes() []*Process {
	var out []*Process
	for _, p := range []*Process{n.containerd, n.kubelet, n.kubeProxy, n.coreDNS} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// PauseKubelet holds the kubelet: it stops the kubelet process the node started (SIGSTOP, by its
// PID). The containers run on, but nothing on the node changes in the API until ResumeKubelet: no
// pod starts or stops, no status changes (a deleted pod stays Terminating, a pod keeps the
// readiness last reported). The Node object stays Ready, as the ground runs no node lifecycle
// controller. It returns once the process is stopped. Stop resumes a held kubelet before it ends
// it.
func (n *Node) PauseKubelet() error {
	pid, err := n.kubeletProcess()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	return waitFor(n.kubelet, 5*time.Second, func() error {
		if st := ProcessState(pid); st != "T" {
			return fmt.Errorf("the kubelet (pid %d) is in state %q, not stopped yet", pid, st)
		}
		return nil
	})
}

// ResumeKubelet lets a kubelet held by PauseKubelet go on (SIGCONT, by its PID); it catches up
// on what changed meanwhile.
func (n *Node) ResumeKubelet() error {
	pid, err := n.kubeletProcess()
	if err != nil {
		return err
	}
	return syscall.Kill(pid, syscall.SIGCONT)
}

// kubeletProcess is the PID of the node's kubelet, this process's or, on an attached node, the
// ground's.
func (n *Node) kubeletProcess() (int, error) {
	switch {
	case n.attached && Alive(n.kubeletPID):
		return n.kubeletPID, nil
	case n.attached, n.kubelet == nil || n.kubelet.Exited():
		return 0, errors.New("the kubelet does not run")
	}
	return n.kubelet.PID(), nil
}

// Stop ends the node and undoes its changes to the machine (see cleanupNode), then lets the
// janitor go and releases the node lock.
func (n *Node) Stop() {
	if n == nil {
		return
	}
	if n.attached {
		for _, p := range n.proxies {
			p.Stop()
		}
		return
	}
	if n.kubelet != nil && !n.kubelet.Exited() {
		_ = n.ResumeKubelet() // a held kubelet would leave the SIGTERM of its Stop pending
	}
	for _, p := range []*Process{n.kubelet, n.kubeProxy, n.coreDNS} {
		p.Stop()
	}
	for _, p := range n.proxies {
		p.Stop()
	}
	// The containers first, so that containerd's shims have nothing left to wait for.
	_ = killCgroupProcesses()
	n.containerd.Stop()
	if n.state != nil {
		// A mount or the bridge can be busy for a moment while the last killed processes go:
		// the clean-up, which is idempotent, is tried again a few times.
		for attempt := 1; ; attempt++ {
			err := cleanupNode(n.state)
			if err == nil {
				break
			}
			if attempt == 5 {
				fmt.Fprintf(os.Stderr, "testground: cleaning up the real node: %v\n", err)
				break
			}
			fmt.Fprintf(os.Stderr, "testground: cleaning up the real node (attempt %d, trying again): %v\n", attempt, err)
			time.Sleep(500 * time.Millisecond)
		}
	}
	n.janitor.release()
	if n.lock != nil {
		n.lock.Close()
	}
}
