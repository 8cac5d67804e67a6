// Command olm-validate runs the operator-framework validators on an OLM bundle directory: the
// default bundle suite (the ClusterServiceVersion, the CRDs and the bundle as a whole) and the
// OperatorHub one. It prints every error and warning, and exits 1 when there is an error.
//
//	olm-validate BUNDLE_DIR [KUBERNETES_VERSION]
package main

import (
	"fmt"
	"os"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: olm-validate BUNDLE_DIR [KUBERNETES_VERSION]")
		os.Exit(2)
	}
	bundle, err := manifests.GetBundleFromDir(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "olm-validate: loading the bundle:", err)
		os.Exit(1)
	}
	objs := []interface{}{bundle, bundle.CSV}
	for _, crd := range bundle.V1CRDs {
		objs = append(objs, crd)
	}
	if len(os.Args) > 2 {
		objs = append(objs, map[string]string{"k8s-version": os.Args[2]})
	}
	validators := append(validation.DefaultBundleValidators, validation.OperatorHubValidator)
	failed := false
	for _, r := range validators.Validate(objs...) {
		for _, e := range r.Errors {
			failed = true
			fmt.Printf("ERROR %s: %s\n", r.Name, describe(e))
		}
		for _, w := range r.Warnings {
			fmt.Printf("WARN %s: %s\n", r.Name, describe(w))
		}
	}
	fmt.Printf("bundle %s: %d CRDs, CSV %s\n", bundle.Name, len(bundle.V1CRDs), bundle.CSV.GetName())
	if failed {
		os.Exit(1)
	}
}

func describe(e errors.Error) string {
	if e.Field != "" {
		return e.Field + ": " + e.Error()
	}
	return e.Error()
}
