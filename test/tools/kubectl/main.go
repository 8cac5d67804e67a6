// Command kubectl is Kubernetes' kubectl, built from the k8s.io/kubectl module for the keyroll
// playground and the tests that run the commands of keyroll's docs. It is a separate module so
// that kubectl's dependencies never enter the operator's go.mod.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
