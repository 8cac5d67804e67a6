// Command sharedground starts one test ground (the control plane, the real node, kwok's fake node,
// Vault, Redis and External Secrets Operator), runs a command with testground.SharedEnv naming the
// ground's descriptor, and stops the ground when the command ends; it exits with the command's
// status. make test runs `go test` under it, so that every test package that finds the ground
// sufficient works on it at once (test/framework attaches to it) instead of each starting its own
// and waiting for the machine's one real node.
//
// Usage: go run ./test/sharedground -- COMMAND [ARG...]
//
// On the shared ground, Vault's database engine has a connection "redis" to the ground's Redis
// that allows every role, and Kubernetes auth pointed at the API server; each package writes roles
// of its own (prefixed with its name), and its operator handles its package's objects alone.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/keyroll/keyroll/test/testground"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: sharedground -- COMMAND [ARG...]")
		return 2
	}
	start := time.Now()
	opts := testground.Options{Node: true, Workloads: true, Redis: true, Vault: true, ExternalSecrets: true}
	g, err := testground.Start(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sharedground: starting the test ground: %v\n", err)
		return 1
	}
	defer g.Stop()
	if err := setUp(context.Background(), g); err != nil {
		fmt.Fprintf(os.Stderr, "sharedground: setting up Vault: %v\n", err)
		return 1
	}
	desc := filepath.Join(g.Dir, "ground.json")
	if err := g.WriteDescriptor(desc); err != nil {
		fmt.Fprintf(os.Stderr, "sharedground: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "sharedground: the shared test ground is up in %s (%s)\n", time.Since(start).Round(time.Millisecond), desc)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), testground.SharedEnv+"="+desc)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "sharedground: %v\n", err)
		return 1
	}
	// Ctrl-C reaches the command by the terminal; a signal sent to this process alone is passed on,
	// and the ground stops once the command has ended.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		for s := range sig {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	signal.Stop(sig)
	fmt.Fprintf(os.Stderr, "sharedground: the command ended after %s; stopping the shared test ground\n", time.Since(start).Round(time.Second))
	if exit, ok := err.(*exec.ExitError); ok {
		return exit.ExitCode()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sharedground: %v\n", err)
		return 1
	}
	return 0
}

// setUp gives the shared Vault what every package needs and none may change under another: the
// database engine's connection to the ground's Redis, allowing every role, and Kubernetes auth
// against the API server.
func setUp(ctx context.Context, g *testground.Ground) error {
	if err := g.Vault.ConfigureRedis(ctx, g.Redis); err != nil {
		return err
	}
	return g.Vault.EnableKubernetesAuth(ctx, g.CP)
}
