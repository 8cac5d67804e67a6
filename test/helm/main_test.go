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

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

func TestMain(m *testing.M) {
	if _, err := testground.Binary("helm"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fw = framework.New(framework.Config{Name: "helm", Ground: testground.Options{Workloads: true}})
	os.Exit(fw.Run(m))
}
