// Command vault is the Vault server of the keyroll test ground (dev mode, loopback only).
// It is built from github.com/hashicorp/vault, licensed BUSL-1.1: a local test server, never shipped.
package main

import (
	"os"

	"github.com/hashicorp/vault/command"
)

func main() {
	os.Exit(command.Run(os.Args[1:]))
}
