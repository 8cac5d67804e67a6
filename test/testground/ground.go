package testground

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
)

// Options selects the components of a Ground. The control plane always runs.
type Options struct {
	// ExternalSecretsCRDs installs External Secrets Operator's CRDs.
	ExternalSecretsCRDs bool
	// ExternalSecrets runs External Secrets Operator's controller (and installs its CRDs).
	ExternalSecrets bool
	// Workloads starts kube-controller-manager, kwok and the pod binder, so that pods become Ready.
	Workloads bool
	// Node runs a real node (containerd, the kubelet, kube-proxy, CoreDNS; see Node) with
	// kube-controller-manager and the pod binder. Pods go to the real node; with Workloads too,
	// kwok's fake node runs beside it and takes the pods that select it (NodeLabel).
	Node bool
	// Redis starts a redis-server with an admin user.
	Redis bool
	// Vault starts a Vault dev server; with Redis it also enables the database secrets engine
	// connected to that Redis, and Kubernetes auth pointed at the control plane.
	Vault bool
	// ControllerManagerQPS is kube-controller-manager's API rate (WorkloadsOptions.APIQPS).
	ControllerManagerQPS int
}

// Ground is a set of running components. Stop ends every one of them.
type Ground struct {
	Dir       string
	CP        *ControlPlane
	Workloads *Workloads
	// Node is the real node, when asked for.
	Node  *Node
	Redis *Redis
	Vault *Vault
	// ExternalSecrets is External Secrets Operator's controller, when asked for.
	ExternalSecrets *Process
	// Options are the components it runs.
	Options Options

	ownDir   bool
	attached bool
}

// Start starts the components opts asks for, with their logs and files in a new temporary
// directory. On error, whatever was started is stopped again.
func Start(opts Options) (g *Ground, err error) {
	dir, err := os.MkdirTemp("", "keyroll-testground-")
	if err != nil {
		return nil, err
	}
	g = &Ground{Dir: dir, ownDir: true, Options: opts}
	defer func() {
		if err != nil {
			g.Stop()
			g = nil
		}
	}()
	cpOpts := ControlPlaneOptions{ExternalSecretsCRDs: opts.ExternalSecretsCRDs || opts.ExternalSecrets}
	if opts.Node {
		if g.Node, err = PrepareNode(dir); err != nil {
			return g, err
		}
		cpOpts.Node = g.Node.APIServerSettings()
	}
	if g.CP, err = StartControlPlane(dir, cpOpts); err != nil {
		return g, err
	}
	if opts.ExternalSecrets {
		if g.ExternalSecrets, err = StartExternalSecrets(dir, g.CP); err != nil {
			return g, err
		}
	}
	if opts.Workloads || opts.Node {
		if g.Workloads, err = StartWorkloads(dir, g.CP, WorkloadsOptions{Kwok: opts.Workloads, RealNode: opts.Node, APIQPS: opts.ControllerManagerQPS}); err != nil {
			return g, err
		}
	}
	if opts.Node {
		if err = g.Node.Start(context.Background(), g.CP); err != nil {
			return g, err
		}
	}
	if opts.Redis {
		if g.Redis, err = StartRedis(dir); err != nil {
			return g, err
		}
	}
	if opts.Vault {
		if g.Vault, err = StartVault(dir); err != nil {
			return g, err
		}
		if g.Node != nil {
			addr, err := g.Node.Expose(fmt.Sprintf("127.0.0.1:%d", g.Vault.Port))
			if err != nil {
				return g, err
			}
			g.Vault.PodAddr = "http://" + addr
		}
	}
	return g, nil
}

// StartT starts a Ground for one test and stops it when the test ends, failed or not.
func StartT(t testing.TB, opts Options) *Ground {
	t.Helper()
	g, err := Start(opts)
	if err != nil {
		t.Fatalf("starting the test ground: %v", err)
	}
	t.Cleanup(g.Stop)
	return g
}

// Stop ends every component, the last started first, and removes the temporary directory unless
// KEYROLL_KEEP_TESTGROUND is set (its logs help to debug a failure).
func (g *Ground) Stop() {
	if g == nil {
		return
	}
	if g.attached {
		g.Node.Stop() // the proxies this process started on the node's bridge
		if g.ownDir && os.Getenv("KEYROLL_KEEP_TESTGROUND") == "" {
			_ = os.RemoveAll(g.Dir)
		}
		return
	}
	if g.ExternalSecrets != nil {
		g.ExternalSecrets.Stop()
	}
	if g.Vault != nil {
		g.Vault.Stop()
	}
	if g.Redis != nil {
		g.Redis.Stop()
	}
	g.Node.Stop()
	g.Workloads.Stop()
	var errs []error
	if err := g.CP.Stop(); err != nil {
		errs = append(errs, err)
	}
	if g.ownDir && os.Getenv("KEYROLL_KEEP_TESTGROUND") == "" {
		errs = append(errs, os.RemoveAll(g.Dir))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "testground: stopping: %v\n", err)
	}
}
