package testground

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// startContainerd writes containerd's configuration (everything under the node's directory, the
// CRI plugin as TESTGROUND.md found working here) and starts it. containerd runs with a proxy
// that refuses every connection, so that even a mistaken image pull cannot leave the machine.
func (n *Node) startContainerd(ctx context.Context) error {
	bin, _ := SystemBinary("containerd", "containerd")
	d := filepath.Join(n.Dir, "containerd")
	cniConf := filepath.Join(n.Dir, "cni", "net.d")
	for _, dir := range []string{d, cniConf} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	conf, err := cniConfig(filepath.Join(n.Dir, "cni", "ipam"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cniConf, "10-keyroll-testground.conflist"), conf, 0o644); err != nil {
		return err
	}
	n.ContainerdSocket = filepath.Join(d, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.opt"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = %[5]q
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[7]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[8]q
    max_conf_num = 1
`, filepath.Join(d, "root"), filepath.Join(d, "state"), n.ContainerdSocket, filepath.Join(d, "ttrpc.sock"),
		filepath.Join(d, "debug.sock"), PauseImage, filepath.Join(d, "runc"), cniConf)
	confPath := filepath.Join(d, "config.toml")
	if err := os.WriteFile(confPath, []byte(config), 0o644); err != nil {
		return err
	}
	n.containerd, err = StartProcess(n.Dir, "containerd", bin, []string{"--config", confPath}, noPullEnv())
	if err != nil {
		return err
	}
	if err := waitFor(n.containerd, 30*time.Second, func() error { return n.ctr("version") }); err != nil {
		return err
	}
	for _, archive := range n.pendingImages {
		if err := n.ImportImage(archive); err != nil {
			return err
		}
	}
	return nil
}

// noPullEnv points every HTTP(S) client of a process at a proxy address where nothing listens.
func noPullEnv() []string {
	return []string{"HTTP_PROXY=http://127.0.0.1:9", "HTTPS_PROXY=http://127.0.0.1:9", "NO_PROXY=", "http_proxy=", "https_proxy=", "no_proxy="}
}

// ctr runs containerd's client against the node's containerd, in the CRI's namespace.
func (n *Node) ctr(args ...string) error {
	return run("ctr", append([]string{"-a", n.ContainerdSocket, "-n", "k8s.io"}, args...)...)
}

// ImportImage imports an OCI archive into the node's containerd (the kubelet then finds the image
// by its name; nothing is pulled).
func (n *Node) ImportImage(archive string) error {
	if err := n.ctr("images", "import", archive); err != nil {
		return fmt.Errorf("importing %s: %w", filepath.Base(archive), err)
	}
	return nil
}

// TagImage gives an image of the node's containerd a second name, as a registry would hold one
// image under two tags: a pod that names either runs the same content.
func (n *Node) TagImage(from, to string) error {
	if err := n.ctr("images", "tag", "--force", from, to); err != nil {
		return fmt.Errorf("tagging %s as %s: %w", from, to, err)
	}
	return nil
}

// KubeletSyncFrequency is how often the kubelet syncs each pod, and so refreshes its Secret and
// ConfigMap volumes (the default, a minute, is too long for tests).
const KubeletSyncFrequency = 10 * time.Second

// startKubelet starts the kubelet with a configuration that works on this machine (TESTGROUND.md,
// "A real node") and waits until its Node is Ready.
func (n *Node) startKubelet(ctx context.Context) error {
	bin, _ := Binary("kubelet")
	kubeconfig, err := n.addUser("system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	port, err := freePortOn(n.IP.String())
	if err != nil {
		return err
	}
	healthz, err := FreePort()
	if err != nil {
		return err
	}
	resolv := filepath.Join(n.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+n.IP.String()+"\n"), 0o644); err != nil {
		return err
	}
	configPath := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(n.kubeletConfig(port, healthz, resolv)), 0o644); err != nil {
		return err
	}
	root := filepath.Join(n.Dir, "kubelet")
	n.kubelet, err = StartProcess(n.Dir, "kubelet", bin, []string{
		"--config=" + configPath, "--kubeconfig=" + kubeconfig,
		"--root-dir=" + root, "--cert-dir=" + filepath.Join(root, "pki"),
		"--hostname-override=" + n.Name, "--node-ip=" + n.IP.String(),
		"--node-labels=" + NodeLabel + "=real",
		"--v=1",
	}, noPullEnv())
	if err != nil {
		return err
	}
	return waitFor(n.kubelet, 2*time.Minute, func() error { return nodeIsReady(ctx, n.cp, n.Name) })
}

// kubeletConfig is the KubeletConfiguration: cgroup v1 allowed, cgroupfs, no OOM score below 0
// (root here may not lower it), Secrets refreshed every 10 s, the cluster DNS as the pods' only
// resolver, listening on the node's address and loopback only, and no eviction or image garbage
// collection when the disk is fuller than a real node would like.
func (n *Node) kubeletConfig(port, healthzPort int, resolvConf string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
address: %[2]s
port: %[3]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[5]q}
authorization:
  mode: AlwaysAllow
podLogsDir: %[6]q
makeIPTablesUtilChains: false
maxOpenFiles: 20000
oomScoreAdj: 0
failSwapOn: false
syncFrequency: %[9]s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1Mi"
  nodefs.inodesFree: "1"
  imagefs.available: "1Mi"
clusterDNS: [%[2]s]
clusterDomain: %[7]s
resolvConf: %[8]q
serializeImagePulls: false
`, n.ContainerdSocket, n.IP, port, healthzPort, n.kubeletClientCA, filepath.Join(n.Dir, "pod-logs"), ClusterDomain, resolvConf, KubeletSyncFrequency)
}

// startKubeProxy runs kube-proxy in iptables mode for the node: ClusterIP Services route to pods;
// no NodePort on any address but the bridge's; conntrack settings left as they are.
func (n *Node) startKubeProxy(ctx context.Context) error {
	bin, _ := Binary("kube-proxy")
	kubeconfig, err := n.addUser("system:kube-proxy")
	if err != nil {
		return err
	}
	healthz, err := FreePort()
	if err != nil {
		return err
	}
	metrics, err := FreePort()
	if err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %[1]q
mode: iptables
hostnameOverride: %[2]s
clusterCIDR: %[3]s
healthzBindAddress: 127.0.0.1:%[4]d
metricsBindAddress: 127.0.0.1:%[5]d
nodePortAddresses: [%[3]s]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
  syncPeriod: 30s
  minSyncPeriod: 0s
`, kubeconfig, n.Name, NodeSubnet, healthz, metrics)
	configPath := filepath.Join(n.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	n.kubeProxy, err = StartProcess(n.Dir, "kube-proxy", bin, []string{"--config=" + configPath, "--v=1"}, nil)
	if err != nil {
		return err
	}
	return waitFor(n.kubeProxy, time.Minute, func() error { return httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthz", healthz)) })
}

// startCoreDNS runs CoreDNS on the node's address, port 53, for cluster.local and the reverse
// zones, from the API server; with no forwarder (the binary has no forward plugin), a name
// outside the cluster gets REFUSED instead of being asked of any other resolver.
func (n *Node) startCoreDNS(ctx context.Context) error {
	bin, _ := Binary("coredns")
	kubeconfig, err := n.addUser("system:coredns")
	if err != nil {
		return err
	}
	err = n.bindClusterRole(ctx, "keyroll-testground:coredns", "system:coredns", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	})
	if err != nil {
		return err
	}
	ready, err := FreePort()
	if err != nil {
		return err
	}
	health, err := FreePort()
	if err != nil {
		return err
	}
	n.Corefile = fmt.Sprintf(`%[1]s:53 in-addr.arpa:53 ip6.arpa:53 {
    bind %[2]s
    ready 127.0.0.1:%[3]d
    health 127.0.0.1:%[4]d
    errors
    log
    cache 5
    kubernetes %[1]s in-addr.arpa ip6.arpa {
        kubeconfig %[5]s
        pods insecure
        ttl 5
    }
}
`, ClusterDomain, n.IP, ready, health, kubeconfig)
	corefile := filepath.Join(n.Dir, "Corefile")
	if err := os.WriteFile(corefile, []byte(n.Corefile), 0o644); err != nil {
		return err
	}
	n.coreDNS, err = StartProcess(n.Dir, "coredns", bin, []string{"-conf", corefile}, nil)
	if err != nil {
		return err
	}
	want := KubernetesServiceIP.String()
	return waitFor(n.coreDNS, time.Minute, func() error {
		if err := httpOK(fmt.Sprintf("http://127.0.0.1:%d/ready", ready)); err != nil {
			return err
		}
		ips, err := n.LookupHost(ctx, "kubernetes.default.svc."+ClusterDomain)
		if err != nil {
			return err
		}
		if len(ips) != 1 || ips[0] != want {
			return fmt.Errorf("kubernetes.default.svc resolves to %v, want %s", ips, want)
		}
		return nil
	})
}

// LookupHost asks the node's CoreDNS (and only it) for the addresses of a name.
func (n *Node) LookupHost(ctx context.Context, name string) ([]string, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(n.IP.String(), "53"))
	}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return r.LookupHost(ctx, strings.TrimSuffix(name, ".")+".")
}

// nodeIsReady reports whether a Node has the condition Ready.
func nodeIsReady(ctx context.Context, cp *ControlPlane, name string) error {
	node, err := cp.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("node %s not Ready yet", name)
}

func httpOK(u string) error {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	return nil
}

// freePortOn returns a TCP port free on host at the time of the call.
func freePortOn(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
