package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// Nothing the node runs may ask a resolver outside the machine: CoreDNS has no forwarder (not in
// its configuration, not even compiled in) and refuses names outside the cluster, and every pod,
// whatever its dnsPolicy, resolves through CoreDNS only and has no default route.
func TestNodeDNSHasNoForwarderAndPodsResolveOnlyThroughIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, line := range strings.Split(fw.Ground.Node.Corefile, "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "forward" || f[0] == "proxy" || f[0] == "grpc") {
			t.Errorf("the Corefile forwards: %q", line)
		}
	}
	bin, err := testground.Binary("coredns")
	if err != nil {
		t.Fatal(err)
	}
	plugins, err := exec.Command(bin, "-plugins").Output()
	if err != nil || !strings.Contains(string(plugins), "kubernetes") || strings.Contains(string(plugins), "forward") {
		t.Errorf("coredns -plugins (%v) lists:\n%s\nwant kubernetes and no forward", err, plugins)
	}
	if ips, err := fw.Ground.Node.LookupHost(ctx, "example.com"); err == nil {
		t.Errorf("CoreDNS answered a name outside the cluster: %v", ips)
	}
	ns := fw.Namespace(t, "dns")
	for _, policy := range []corev1.DNSPolicy{corev1.DNSClusterFirst, corev1.DNSDefault} {
		name := "dns-" + strings.ToLower(string(policy))
		startSleeper(t, ctx, ns, name, policy)
		resolv, _, err := fw.Ground.Node.Exec(ctx, ns, name, "sleeper", "cat", "/etc/resolv.conf")
		if err != nil {
			t.Fatal(err)
		}
		if servers := nameservers(resolv); len(servers) != 1 || servers[0] != testground.NodeIP.String() {
			t.Errorf("pod with dnsPolicy %s has nameservers %v, want only the cluster DNS %s:\n%s", policy, servers, testground.NodeIP, resolv)
		}
		routes, _, err := fw.Ground.Node.Exec(ctx, ns, name, "sleeper", "ip", "route")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(routes, "default") {
			t.Errorf("pod with dnsPolicy %s has a default route:\n%s", policy, routes)
		}
	}
	name := "kubernetes.default.svc." + testground.ClusterDomain
	out, _, err := fw.Ground.Node.Exec(ctx, ns, "dns-clusterfirst", "sleeper", "nslookup", name)
	if err != nil || !strings.Contains(out, testground.KubernetesServiceIP.String()) {
		t.Errorf("a pod resolves %s to:\n%s(%v), want %s", name, out, err, testground.KubernetesServiceIP)
	}
}

// The API server reaches the kubelet by the node's InternalIP only (a hostname would be looked up
// by the machine's resolver, outside the machine), and the pods' network neither masquerades nor
// routes anywhere but the bridge and the Service range.
func TestNodeTrafficStaysOnTheMachine(t *testing.T) {
	args := apiServerArgs(t)
	if !slices.Contains(args, "--kubelet-preferred-address-types=InternalIP") {
		t.Errorf("the API server runs with %q, want --kubelet-preferred-address-types=InternalIP", args)
	}
	data, err := os.ReadFile(filepath.Join(fw.Ground.Node.Dir, "cni", "net.d", "10-keyroll-testground.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct {
			Type                     string
			IsDefaultGateway, IPMasq bool
			IPAM                     struct{ Routes []struct{ Dst string } }
		}
	}
	if err := json.Unmarshal(data, &conf); err != nil || len(conf.Plugins) != 1 {
		t.Fatalf("the CNI configuration (%v):\n%s", err, data)
	}
	if p := conf.Plugins[0]; p.Type != "bridge" || p.IsDefaultGateway || p.IPMasq || len(p.IPAM.Routes) != 1 || p.IPAM.Routes[0].Dst != testground.ServiceCIDR {
		t.Errorf("the pods' network: %+v, want a bridge without default gateway or masquerade, routed only to %s", p, testground.ServiceCIDR)
	}
	nat, err := exec.Command("iptables", "-t", "nat", "-S").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -t nat -S: %v: %s", err, nat)
	}
	for _, rule := range strings.Split(string(nat), "\n") {
		if strings.Contains(rule, "CNI-") || (strings.Contains(rule, testground.NodeSubnet) && strings.Contains(rule, "MASQUERADE")) {
			t.Errorf("a NAT rule for the pods' network: %s", rule)
		}
	}
}

// apiServerArgs is the command line of the ground's kube-apiserver: the one whose certificate
// directory is the ground's.
func apiServerArgs(t *testing.T) []string {
	t.Helper()
	certDir := "--cert-dir=" + filepath.Join(filepath.Dir(fw.Ground.CP.CAFile), "apiserver")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) == "kube-apiserver" && slices.Contains(args, certDir) {
			return args
		}
	}
	t.Fatalf("no kube-apiserver runs with %s", certDir)
	return nil
}

func nameservers(resolv string) []string {
	var out []string
	for _, line := range strings.Split(resolv, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" {
			out = append(out, f[1])
		}
	}
	return out
}

// startSleeper runs a pod of the Redis image (it has busybox) that sleeps, and waits until it runs.
func startSleeper(t *testing.T, ctx context.Context, ns, name string, policy corev1.DNSPolicy) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			DNSPolicy:                     policy,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "sleeper", Image: testground.RedisImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"},
			}},
		},
	}
	var err error
	framework.Eventually(t, 30*time.Second, func() string { // the namespace's default ServiceAccount comes first
		if _, err = fw.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})
	framework.Eventually(t, time.Minute, func() string {
		p, err := fw.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Sprintf("pod %s is %s: %s", name, p.Status.Phase, fw.PodSummary(ns))
		}
		return ""
	})
}
