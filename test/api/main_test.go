// Package api tests keyroll's CRDs and manifests against a real kube-apiserver: invalid objects
// are refused with the field named, the samples are accepted, and the manager Deployment passes the
// restricted Pod Security Standard with least-privilege RBAC.
package api

import (
	"os"
	"testing"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var fw *framework.Framework

func TestMain(m *testing.M) {
	fw = framework.New(framework.Config{Name: "api", Ground: testground.Options{ExternalSecretsCRDs: true}})
	os.Exit(fw.Run(m))
}
