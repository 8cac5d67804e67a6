// Package helm tests keyroll's Helm chart (deploy/helm/keyroll) with the helm CLI and a real
// kube-apiserver, with kube-controller-manager and kwok so that the Deployment's pods are created
// (and admitted by Pod Security admission) and become Ready: helm lint is clean, the chart holds
// the CRDs, RBAC and alerts of deploy/ unchanged, its manager matches deploy/manager, and what it
// renders installs under the restricted Pod Security Standard. The README's helm install runs here.
package helm

import (
	"fmt"
	"os"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/test/harness"
	"github.com/keyroll/keyroll/test/testground"
)

var (
	ground *testground.Ground
	k8s    client.Client
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	if _, err := testground.Binary("helm"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g, c, stop, err := harness.StartPackage(testground.Options{Workloads: true}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	ground, k8s = g, c
	return m.Run()
}
