// Package api tests keyroll's CRDs and manifests against a real kube-apiserver: invalid objects
// are refused with the field named, the samples are accepted, and the manager Deployment passes the
// restricted Pod Security Standard with least-privilege RBAC.
package api

import (
	"fmt"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/keyroll/keyroll/apis/v1alpha1"
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
	var err error
	ground, err = testground.Start(testground.Options{ExternalSecretsCRDs: true})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the test ground: %v\n", err)
		return 1
	}
	defer ground.Stop()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if k8s, err = client.New(ground.CP.Config, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		return 1
	}
	return m.Run()
}
