// Command playground runs keyroll on this machine without a cluster: a real kube-apiserver and
// etcd, kube-controller-manager, a real node (containerd, the kubelet, kube-proxy and CoreDNS on a
// bridge network of its own, so that the Redis pods really run), External Secrets Operator's
// controller, a Vault dev server with the database secrets engine and Kubernetes auth, and
// redis-server, on loopback ports and the node's bridge. It applies the CRDs and the samples of
// deploy/, runs the operator in the foreground, and prints how to watch it work. It writes the admin kubeconfig and
// an environment file (playground.env: KUBECONFIG, VAULT_ADDR, VAULT_TOKEN, and PATH with the
// test ground's kubectl and vault and the kubectl plugin, built into bin/ as make plugin does)
// beside it. Ctrl-C stops everything it started and removes its
// files.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

func main() {
	out := flag.String("kubeconfig-out", "playground.kubeconfig", "Where to write the admin kubeconfig of the playground's API server.")
	stateFile := flag.String("state-file", "", "If set, where to write the playground's addresses as JSON once it runs (for scripts and tests); removed on exit.")
	flag.Parse()
	if err := run(*out, *stateFile); err != nil {
		fmt.Fprintf(os.Stderr, "playground: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Printf("[playground %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// State is what --state-file holds.
type State struct {
	Kubeconfig string `json:"kubeconfig"`
	VaultAddr  string `json:"vaultAddr"`
	RedisAddr  string `json:"redisAddr"`
	// NodeDir is the real node's directory.
	NodeDir string `json:"nodeDir"`
	// GroundDir is the test ground's directory (its logs, the built manager), removed at the end.
	GroundDir string `json:"groundDir"`
}

func run(kubeconfigOut, stateFile string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Piped (make playground | tee pg.log), Ctrl-C ends the reader too: the clean-up's lines then
	// meet a closed pipe, and without this the first of them would end the process there, with the
	// ground, its directory and the files below left behind.
	signal.Ignore(syscall.SIGPIPE)
	say("starting kube-apiserver, etcd, kube-controller-manager, a real node (containerd, kubelet, kube-proxy, CoreDNS), External Secrets Operator, Vault and Redis")
	g, err := testground.Start(testground.Options{Node: true, Redis: true, Vault: true, ExternalSecrets: true})
	if err != nil {
		return err
	}
	envFile := filepath.Join(filepath.Dir(kubeconfigOut), "playground.env")
	defer func() {
		say("stopping everything the playground started")
		g.Stop()
		_ = os.Remove(kubeconfigOut)
		_ = os.Remove(envFile)
	}()
	// The samples' names are fixed (namespace default, VaultConnection vault, roles orders and
	// payments, the operator's keyroll-system and role keyroll): nothing is prefixed.
	f := framework.New(framework.Config{})
	if err := f.Use(g); err != nil {
		return err
	}
	if err := setupVault(ctx, f); err != nil {
		return fmt.Errorf("setting up Vault: %w", err)
	}
	kc, err := os.ReadFile(g.CP.Kubeconfig)
	if err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfigOut, kc, 0o600); err != nil {
		return err
	}
	if err := buildPlugin(ctx); err != nil {
		return err
	}
	if err := writeEnv(envFile, kubeconfigOut, g); err != nil {
		return err
	}
	objs, err := framework.ApplySamples(ctx, f.Client, g.Vault.Addr, "playground")
	if err != nil {
		return fmt.Errorf("applying the samples: %w", err)
	}
	for _, o := range objs {
		say("applied %s %s", o.GetKind(), o.GetName())
	}
	op, err := startOperator(f)
	if err != nil {
		return err
	}
	defer op.stop()
	if err := pointVaultAtOrders(ctx, f); err != nil {
		return fmt.Errorf("pointing Vault's database engine at RedisCluster orders: %w", err)
	}
	printTour(envFile)
	if stateFile != "" {
		st := State{Kubeconfig: kubeconfigOut, VaultAddr: g.Vault.Addr, RedisAddr: g.Redis.Addr(), GroundDir: g.Dir}
		if g.Node != nil {
			st.NodeDir = g.Node.Dir
		}
		b, _ := json.Marshal(st)
		if err := os.WriteFile(stateFile, b, 0o600); err != nil {
			return err
		}
		defer os.Remove(stateFile)
	}
	select {
	case <-ctx.Done():
		return nil
	case <-op.done:
		return errors.New("the operator stopped")
	}
}

// ordersRole is the Vault role of the sample orders, which issues users on orders itself.
var ordersRole = testground.RedisRole{Name: "orders", DefaultTTL: 2 * time.Minute, MaxTTL: time.Hour}

// setupVault does what docs/vault-administrators.md describes: the Redis connection and roles, the
// operator's policy and Kubernetes auth role, and External Secrets Operator's (for the payments
// sample, whose generator logs in as the service account external-secrets of namespace default).
// The role orders comes once orders runs (pointVaultAtOrders).
func setupVault(ctx context.Context, f *framework.Framework) error {
	if err := f.SetupVault(ctx, testground.RedisRole{Name: "payments", DefaultTTL: 2 * time.Minute, MaxTTL: time.Hour}); err != nil {
		return err
	}
	if err := f.WriteExternalSecretsPolicy(ctx, "external-secrets"); err != nil {
		return err
	}
	return f.ExternalSecretsAuth(ctx, "default", "external-secrets", "external-secrets", time.Hour)
}

// buildPlugin builds the kubectl plugin into bin/kubectl-keyroll, as make plugin does.
func buildPlugin(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(pluginDir(), "kubectl-keyroll"), "./cmd/kubectl-keyroll")
	cmd.Dir = testground.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the kubectl plugin: %w\n%s", err, out)
	}
	return nil
}

// pluginDir is where make plugin puts the kubectl plugin.
func pluginDir() string { return filepath.Join(testground.RepoRoot(), "bin") }

// writeEnv writes the environment file the README's tour sources.
func writeEnv(path, kubeconfig string, g *testground.Ground) error {
	abs, err := filepath.Abs(kubeconfig)
	if err != nil {
		return err
	}
	env := fmt.Sprintf("# Written by the keyroll playground; removed when it stops.\n"+
		"export KUBECONFIG=%q\nexport VAULT_ADDR=%q\nexport VAULT_TOKEN=%q\nexport REDIS_PORT=%d\nexport PATH=%q:%q:\"$PATH\"\n",
		abs, g.Vault.Addr, g.Vault.RootToken, g.Redis.Port, testground.BinDir(), pluginDir())
	return os.WriteFile(path, []byte(env), 0o600)
}

// pointVaultAtOrders does what the Vault administrators' guide describes for a RedisCluster's own
// primary: once the pods of orders run (they come before its credential, which Vault refuses
// until then), a connection of the database engine to its client Service as the plugin user
// keyroll keeps on every node (spec.vaultPlugin, its password generated by keyroll), and the
// role orders on it. Then orders is nudged to ask again at once.
func pointVaultAtOrders(ctx context.Context, f *framework.Framework) error {
	c := f.Client
	orders := &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "orders"}}
	key := client.ObjectKeyFromObject(orders)
	say("waiting for the Redis pods of orders, to point Vault's database engine at them")
	var host, user, password string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := f.ListRedisPods(orders)
		if err != nil {
			return false, nil //nolint:nilerr // the API server may be busy; ask again
		}
		ready := 0
		for i := range pods {
			if framework.PodReady(&pods[i]) {
				ready++
			}
		}
		svc, sec := &corev1.Service{}, &corev1.Secret{}
		if ready < 3 || c.Get(ctx, key, svc) != nil || c.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name + "-vault-plugin"}, sec) != nil {
			return false, nil
		}
		host, user, password = svc.Spec.ClusterIP, string(sec.Data["username"]), string(sec.Data["password"])
		return host != "" && user != "" && password != "", nil
	})
	if err != nil {
		return err
	}
	if err := f.Ground.Vault.ConnectRedis(ctx, "default-orders", host, 6379, user, password, ordersRole); err != nil {
		return err
	}
	say("Vault's database engine issues the users of orders on orders itself (its Service %s)", host)
	rc := &v1beta1.RedisCluster{}
	if err := c.Get(ctx, key, rc); err != nil {
		return err
	}
	patch := client.MergeFrom(rc.DeepCopy())
	metav1.SetMetaDataAnnotation(&rc.ObjectMeta, "playground.keyroll.dev/vault-configured", time.Now().UTC().Format(time.RFC3339))
	return c.Patch(ctx, rc, patch)
}

type operator struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startOperator builds keyroll and runs it against the playground, its logs on this terminal. Not
// framework.StartProcess: the playground's operator runs as a user would run it (the manager's
// own leader-election timings, its logs as they come), and stops gracefully (stop).
func startOperator(f *framework.Framework) (*operator, error) {
	g := f.Ground
	say("building the operator")
	bin, err := framework.BuildOperator(g.Dir)
	if err != nil {
		return nil, err
	}
	// The conversion webhook on loopback, where the playground's API server reaches it by URL.
	port, err := testground.FreePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--kubeconfig="+g.CP.Kubeconfig, "--zap-devel",
		"--metrics-bind-address=127.0.0.1:0", "--metrics-secure=false", "--health-probe-bind-address=127.0.0.1:0",
		"--redis-probe-image="+testground.ProbeImage, "--leader-election-namespace="+f.OperatorNS, "--service-account-namespace="+f.OperatorNS,
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", port), fmt.Sprintf("--webhook-url=https://127.0.0.1:%d/convert", port))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	op := &operator{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(op.done) }()
	return op, nil
}

// stop asks the operator to shut down (it releases its leader-election Lease) and waits.
func (o *operator) stop() {
	_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-o.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGKILL)
		<-o.done
	}
}

func printTour(envFile string) {
	fmt.Printf(`
keyroll is running against the playground, with the samples applied: RedisCluster "orders"
(credentials straight from Vault) and "payments" (through External Secrets Operator).
In another terminal, in this directory:

  source %[1]s      # KUBECONFIG, VAULT_ADDR, VAULT_TOKEN; kubectl, kubectl keyroll and vault on PATH
  kubectl get redisclusters -w                     # phase, ready pods, credential expiry, next rotation
  kubectl get rediscluster orders -o yaml          # conditions, the current credential, the lease ledger
  vault lease lookup "$(kubectl get rediscluster orders -o jsonpath='{.status.credential.lease.leaseID}')"

The Redis pods are real, and mount no credential: keyroll put the issued user on each of them.
Log in inside one as that user (its password goes on stdin, never on a command line):
  user="$(kubectl get secret orders-credentials -o jsonpath='{.data.username}' | base64 -d)"
  pass="$(kubectl get secret orders-credentials -o jsonpath='{.data.password}' | base64 -d)"
  kubectl exec -i orders-0 -- sh -c 'read -r REDISCLI_AUTH; export REDISCLI_AUTH; exec redis-cli --no-auth-warning --user "$1" SET playground:hello "$1"' sh "$user" <<<"$pass"
and look at a replica's replication as keyroll's probe user, whose password the pod mounts:
  kubectl exec orders-1 -- sh -c 'REDISCLI_AUTH="$(cat /etc/keyroll/acl/probe-password)" redis-cli --no-auth-warning --user keyroll-probe INFO replication'

Rotate now, and look at the ledger and the rollout, with the kubectl plugin (on PATH there):
  kubectl keyroll rotate orders --wait
  kubectl keyroll status orders

The README's five-minute tour goes on from here. Ctrl-C stops everything.
`, filepath.Base(envFile))
}
