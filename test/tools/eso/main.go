// Command external-secrets is the External Secrets Operator controller of the keyroll test ground,
// built from github.com/external-secrets/external-secrets v0.20.4.
package main

import "github.com/external-secrets/external-secrets/cmd/controller"

func main() {
	controller.Execute()
}
