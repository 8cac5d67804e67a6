// Package api tests keyroll's CRDs and manifests against a real kube-apiserver: invalid objects
// are refused with the field named, the samples are accepted, and the manager Deployment passes the
// restricted Pod Security Standard with least-privilege RBAC.
package api

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
	g, c, stop, err := harness.StartPackage(testground.Options{ExternalSecretsCRDs: true}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	ground, k8s = g, c
	return m.Run()
}
