package testground

import (
	"encoding/json"
	"fmt"
	"net"
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// SharedEnv names the file of a running ground's Descriptor: test packages that find it set work
// on that ground (Attach) instead of starting their own, so that one ground, and the machine's
// one real node, serves them all at once.
const SharedEnv = "KEYROLL_GROUND"

// Descriptor is what another process needs to work on a running ground: where its components
// listen and how to log in to them. It holds the Vault root token and the Redis admin password of
// a throwaway local ground, in a file only root may read.
type Descriptor struct {
	Options    Options `json:"options"`
	Kubeconfig string  `json:"kubeconfig"`
	CAFile     string  `json:"caFile"`
	Vault      *struct {
		Addr, PodAddr, RootToken, LogPath string
		Port                              int
	} `json:"vault,omitempty"`
	Redis *struct {
		Port                     int
		AdminUser, AdminPassword string
	} `json:"redis,omitempty"`
	Node *struct {
		Name, IP, Dir, ContainerdSocket, Corefile string
		KubeletPID                                int
	} `json:"node,omitempty"`
}

// WriteDescriptor writes the ground's Descriptor to path (mode 0600).
func (g *Ground) WriteDescriptor(path string) error {
	d := Descriptor{Options: g.Options, Kubeconfig: g.CP.Kubeconfig, CAFile: g.CP.CAFile}
	if v := g.Vault; v != nil {
		d.Vault = &struct {
			Addr, PodAddr, RootToken, LogPath string
			Port                              int
		}{v.Addr, v.PodAddr, v.RootToken, v.proc.LogPath, v.Port}
	}
	if r := g.Redis; r != nil {
		d.Redis = &struct {
			Port                     int
			AdminUser, AdminPassword string
		}{r.Port, r.AdminUser, r.AdminPassword}
	}
	if n := g.Node; n != nil {
		d.Node = &struct {
			Name, IP, Dir, ContainerdSocket, Corefile string
			KubeletPID                                int
		}{n.Name, n.IP.String(), n.Dir, n.ContainerdSocket, n.Corefile, n.kubelet.PID()}
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// Attach works on the running ground that the Descriptor at path describes. The Ground it returns
// has a directory of its own for the files of this process; its Stop removes that directory and
// stops what this process started on it (proxies), never the ground's components.
func Attach(path string) (g *Ground, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the shared ground's descriptor (%s): %w", SharedEnv, err)
	}
	var d Descriptor
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dir, err := os.MkdirTemp("", "keyroll-attached-")
	if err != nil {
		return nil, err
	}
	g = &Ground{Dir: dir, ownDir: true, attached: true, Options: d.Options}
	defer func() {
		if err != nil {
			g.Stop()
			g = nil
		}
	}()
	cfg, err := clientcmd.BuildConfigFromFlags("", d.Kubeconfig)
	if err != nil {
		return g, fmt.Errorf("the shared ground's kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000 // as envtest's own
	g.CP = &ControlPlane{Config: cfg, Kubeconfig: d.Kubeconfig, CAFile: d.CAFile, attached: true}
	if g.CP.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		return g, err
	}
	if dv := d.Vault; dv != nil {
		g.Vault = &Vault{Addr: dv.Addr, PodAddr: dv.PodAddr, Port: dv.Port, RootToken: dv.RootToken, logPath: dv.LogPath, dir: dir}
		if g.Vault.Root, err = g.Vault.NewClient(dv.RootToken); err != nil {
			return g, err
		}
	}
	if dr := d.Redis; dr != nil {
		g.Redis = &Redis{Port: dr.Port, AdminUser: dr.AdminUser, AdminPassword: dr.AdminPassword}
	}
	if dn := d.Node; dn != nil {
		g.Node = &Node{Name: dn.Name, IP: net.ParseIP(dn.IP), Dir: dn.Dir, ContainerdSocket: dn.ContainerdSocket,
			Corefile: dn.Corefile, cp: g.CP, attached: true, kubeletPID: dn.KubeletPID}
	}
	return g, nil
}

// Attached says whether the ground runs in another process (Attach).
func (g *Ground) Attached() bool { return g.attached }

// Covers says whether a ground started with these options runs every component want asks for.
func (o Options) Covers(want Options) bool {
	return (o.ExternalSecretsCRDs || o.ExternalSecrets || !want.ExternalSecretsCRDs) &&
		(o.ExternalSecrets || !want.ExternalSecrets) && (o.Workloads || !want.Workloads) &&
		(o.Node || !want.Node) && (o.Redis || !want.Redis) && (o.Vault || !want.Vault) &&
		want.ControllerManagerQPS == 0
}
