// Command kubectl-keyroll is keyroll's kubectl plugin: on PATH, `kubectl keyroll` shows a
// RedisCluster's credential, lease ledger and rollout (status), asks for a rotation now (rotate),
// pauses and resumes rotations (pause, resume) and lists every lease keyroll holds (leases). It
// talks to the API server only, never to Vault, and never reads a Secret.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

func main() {
	cmd := newRootCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
