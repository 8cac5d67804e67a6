package testground

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControlPlane is a real kube-apiserver and etcd (controller-runtime's envtest) with keyroll's CRDs.
type ControlPlane struct {
	Env *envtest.Environment
	// Config is a rest.Config for an admin (system:masters) user.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file for an admin user.
	Kubeconfig string
	Clientset  *kubernetes.Clientset
	// CAFile holds the CA certificate that signed the API server's serving certificate.
	CAFile string

	watchdog *exec.Cmd
	// attached: the control plane runs in another process (Attach).
	attached bool
}

// ControlPlaneOptions selects what is installed besides keyroll's CRDs.
type ControlPlaneOptions struct {
	// ExternalSecretsCRDs installs External Secrets Operator's CRDs from its Go module.
	ExternalSecretsCRDs bool
	// Node readies the API server for a real node (nil: kwok only).
	Node *NodeAPIServer
}

// NodeAPIServer is how the API server must run for a real node: its serving certificate names the
// node's bridge address and the kubernetes Service's ClusterIP (pods check it), it reaches the
// kubelet by the node's InternalIP only (never by a hostname, which the machine's resolver would
// be asked for), with a client certificate the kubelet trusts; Node and RBAC authorization; the
// ServiceAccount admission plugin, so that pods get service-account tokens.
type NodeAPIServer struct {
	AdvertiseIP net.IP
	ServiceCIDR string
	// ServiceIP is the kubernetes Service's ClusterIP (the first address of ServiceCIDR).
	ServiceIP net.IP
	// KubeletClientCert and KubeletClientKey are the files of the API server's client certificate
	// towards the kubelet.
	KubeletClientCert, KubeletClientKey string
}

// StartControlPlane starts etcd and kube-apiserver and installs the CRDs of deploy/crd.
func StartControlPlane(dir string, opts ControlPlaneOptions) (*ControlPlane, error) {
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := Binary(name); err != nil {
			return nil, err
		}
	}
	crdDirs := []string{filepath.Join(RepoRoot(), "deploy", "crd")}
	if opts.ExternalSecretsCRDs {
		d, err := ExternalSecretsCRDDir()
		if err != nil {
			return nil, err
		}
		crdDirs = append(crdDirs, d)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: BinDir(),
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
		// Generous, for a busy two-core machine: kube-apiserver starts in 5 s when idle.
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	var caFile string
	if opts.Node != nil {
		var err error
		if caFile, err = configureForNode(env, dir, opts.Node); err != nil {
			return nil, err
		}
	} else {
		// Room for the Services of a thousand RedisClusters (envtest's default is a /24). Without a
		// node nothing ever connects to a ClusterIP, so the range is only numbers.
		env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", ServiceCIDRWithoutNode)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	cp := &ControlPlane{Env: env, Config: cfg, CAFile: caFile}
	if cp.CAFile == "" {
		cp.CAFile = filepath.Join(dir, "apiserver-ca.crt")
		if err := os.WriteFile(cp.CAFile, cfg.CAData, 0o644); err != nil {
			_ = cp.Stop()
			return nil, err
		}
	}
	cp.watchdog = startWatchdog(childrenNamed("etcd", "kube-apiserver"))
	if err := cp.writeKubeconfig(dir); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	if cp.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	return cp, nil
}

// configureForNode sets the API server's flags for a real node and writes its certificates into a
// directory of the ground's own (envtest uses certificates it finds there). It returns the CA file.
func configureForNode(env *envtest.Environment, dir string, n *NodeAPIServer) (string, error) {
	certDir := filepath.Join(dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return "", err
	}
	ca, err := newCA("keyroll-testground-apiserver-ca")
	if err != nil {
		return "", err
	}
	certPEM, keyPEM, err := ca.issue(certRequest{
		CommonName: "kube-apiserver", Server: true,
		IPs: []net.IP{net.IPv4(127, 0, 0, 1), n.AdvertiseIP, n.ServiceIP},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc." + ClusterDomain},
	})
	if err != nil {
		return "", err
	}
	if err := writeKeyPair(filepath.Join(certDir, "apiserver.crt"), filepath.Join(certDir, "apiserver.key"), certPEM, keyPEM); err != nil {
		return "", err
	}
	saCert, saKey, err := newSigningKey()
	if err != nil {
		return "", err
	}
	// envtest's names for the service-account signing key pair.
	if err := writeKeyPair(filepath.Join(certDir, "sa-signer.crt"), filepath.Join(certDir, "sa-signer.key"), saCert, saKey); err != nil {
		return "", err
	}
	caFile := filepath.Join(dir, "apiserver-ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		return "", err
	}
	api := env.ControlPlane.GetAPIServer()
	api.CertDir = certDir
	api.CA = ca.CertPEM
	api.Configure().
		Set("service-cluster-ip-range", n.ServiceCIDR).
		Set("advertise-address", n.AdvertiseIP.String()).
		Set("endpoint-reconciler-type", "none").
		Set("kubelet-preferred-address-types", "InternalIP").
		Set("kubelet-client-certificate", n.KubeletClientCert).
		Set("kubelet-client-key", n.KubeletClientKey).
		Set("authorization-mode", "Node,RBAC").
		// ServiceAccount admission on; no not-ready taint on new nodes (no node lifecycle controller runs).
		Set("disable-admission-plugins", "TaintNodesByCondition")
	return caFile, nil
}

func (cp *ControlPlane) writeKubeconfig(dir string) error {
	user, err := cp.Env.AddUser(envtest.User{Name: "keyroll-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("adding an admin user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	cp.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	return os.WriteFile(cp.Kubeconfig, kc, 0o600)
}

// Stop ends kube-apiserver and etcd.
func (cp *ControlPlane) Stop() error {
	if cp == nil || cp.Env == nil {
		return nil
	}
	err := cp.Env.Stop()
	if cp.watchdog != nil {
		// Its whole group: the shell's sleep outlived a kill of the shell alone by up to a second.
		_ = syscall.Kill(-cp.watchdog.Process.Pid, syscall.SIGKILL)
		_ = cp.watchdog.Wait()
	}
	return err
}

// startWatchdog starts a small shell process that kills pids once this process is gone. envtest
// starts etcd and kube-apiserver without a parent-death signal, so a test binary that dies (a
// panic, a timeout) would leave them running; the watchdog ends them within a second.
func startWatchdog(pids []int) *exec.Cmd {
	if len(pids) == 0 {
		return nil
	}
	list := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(pids)), " "), "[]")
	script := fmt.Sprintf("while kill -0 %d 2>/dev/null; do sleep 1; done; kill -9 %s 2>/dev/null", os.Getpid(), list)
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil
	}
	return cmd
}

// childrenNamed lists this process's children whose executable has one of the given names.
func childrenNamed(names ...string) []int {
	var out []int
	for _, pid := range ChildPIDs() {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err == nil && slices.Contains(names, filepath.Base(exe)) {
			out = append(out, pid)
		}
	}
	return out
}

// EnsureServiceAccount creates a namespace (if needed) and a ServiceAccount in it. envtest runs
// without the ServiceAccount admission plugin, so nothing creates them implicitly.
func (cp *ControlPlane) EnsureServiceAccount(ctx context.Context, namespace, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cp.Clientset.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := cp.Clientset.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// ServiceAccountToken asks the TokenRequest API for a token of a ServiceAccount. With no audiences
// the token carries the API server's own audience.
func (cp *ControlPlane) ServiceAccountToken(ctx context.Context, namespace, name string, ttl time.Duration, audiences ...string) (string, error) {
	secs := int64(ttl / time.Second)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &secs}}
	out, err := cp.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for %s/%s: %w", namespace, name, err)
	}
	return out.Status.Token, nil
}

// BindClusterRole binds a ClusterRole to a ServiceAccount.
func (cp *ControlPlane) BindClusterRole(ctx context.Context, clusterRole, namespace, serviceAccount string) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%s", clusterRole, namespace, serviceAccount)},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: serviceAccount}},
	}
	crb.Name = strings.ReplaceAll(crb.Name, ":", "-")
	_, err := cp.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// ExternalSecretsCRDDir is the directory of External Secrets Operator's CRDs in the Go module cache:
// those of the release the test ground's controller is built from (the tool module test/tools/eso;
// keyroll's own module does not require ESO's).
func ExternalSecretsCRDDir() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/external-secrets/external-secrets")
	cmd.Dir = filepath.Join(RepoRoot(), "test", "tools", "eso")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating the external-secrets module of test/tools/eso (cd test/tools/eso && go mod download): %w", err)
	}
	d := filepath.Join(strings.TrimSpace(string(out)), "config", "crds", "bases")
	if _, err := os.Stat(d); err != nil {
		return "", fmt.Errorf("external-secrets CRDs not found: %w", err)
	}
	return d, nil
}
