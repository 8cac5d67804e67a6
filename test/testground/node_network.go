package testground

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The real node's network: a bridge of the ground's own with a subnet nothing on this machine
// uses. The bridge address is the node's InternalIP, the pods' gateway to the Service range and
// their DNS server; nothing is masqueraded and pods have no default route, so no packet of a pod
// can leave the machine.
const (
	NodeBridge    = "krnode0"
	NodeSubnet    = "10.212.0.0/24"
	ServiceCIDR   = "10.212.1.0/24"
	ClusterDomain = "cluster.local"
	// ServiceCIDRWithoutNode is the Service range of a ground without the real node.
	ServiceCIDRWithoutNode = "10.213.0.0/16"
)

var (
	// NodeIP is the bridge's address.
	NodeIP = net.IPv4(10, 212, 0, 1).To4()
	// KubernetesServiceIP is the ClusterIP of the kubernetes Service (first of ServiceCIDR).
	KubernetesServiceIP = net.IPv4(10, 212, 1, 1).To4()
)

// hostSysctls are the kernel settings the node's components change (the CNI bridge plugin turns
// on forwarding; the kubelet sets its kernel tunables; kube-proxy may touch conntrack and
// route_localnet): each is read before the node starts and written back when it stops.
var hostSysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables",
	"net/bridge/bridge-nf-call-ip6tables",
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// readSysctls returns the current values of hostSysctls (those that exist).
func readSysctls() map[string]string {
	out := map[string]string{}
	for _, k := range hostSysctls {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil {
			out[k] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// restoreSysctls writes back every value that differs from the one recorded.
func restoreSysctls(saved map[string]string) error {
	var errs []string
	for k, v := range saved {
		p := filepath.Join("/proc/sys", k)
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) == v {
			continue
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Sprintf("%s=%s: %v", k, v, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("restoring sysctls: %s", strings.Join(errs, "; "))
	}
	return nil
}

// createBridge adds the bridge with the node's address, and routes the Service range onto it so
// that a ClusterIP kube-proxy has not programmed yet goes nowhere rather than out of the machine.
func createBridge() error {
	for _, args := range [][]string{
		{"link", "add", NodeBridge, "type", "bridge"},
		{"addr", "add", NodeIP.String() + "/24", "dev", NodeBridge},
		{"link", "set", NodeBridge, "up"},
		{"route", "add", ServiceCIDR, "dev", NodeBridge, "src", NodeIP.String()},
	} {
		if err := run("ip", args...); err != nil {
			return fmt.Errorf("creating the node's bridge: %w", err)
		}
	}
	return nil
}

// bridgeExists reports whether the node's bridge device is there.
func bridgeExists() bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", NodeBridge))
	return err == nil
}

// deleteBridge removes the bridge (and with it its address and routes) if it exists.
func deleteBridge() error {
	if !bridgeExists() {
		return nil
	}
	return run("ip", "link", "del", NodeBridge)
}

// cniConfig is the network every pod joins: the bridge, host-local addresses from NodeSubnet
// (kept under the ground's directory), and one route, to the Service range through the node.
func cniConfig(ipamDir string) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "keyroll-testground",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": NodeBridge,
			"isGateway": true, "isDefaultGateway": false, "ipMasq": false, "hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"dataDir": ipamDir,
				"ranges": []any{[]any{map[string]any{
					"subnet": NodeSubnet, "gateway": NodeIP.String(), "rangeStart": "10.212.0.10",
				}}},
				"routes": []any{map[string]any{"dst": ServiceCIDR}},
			},
		}},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// run runs a command and returns its output in the error when it fails.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
