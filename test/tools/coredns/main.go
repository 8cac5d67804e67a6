// Command coredns is CoreDNS for the keyroll test ground's real node: it answers for cluster.local
// (and the reverse zones) from the API server, and nothing else. Only the plugins the ground's
// Corefile uses are compiled in; in particular there is no forward plugin, so this CoreDNS cannot
// ask any resolver outside the machine, whatever its Corefile says.
package main

import (
	"fmt"
	"os"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives are the plugins this build knows, in CoreDNS's execution order (plugin.cfg).
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}

func main() {
	if err := dnsserver.SetDirectives(directives); err != nil {
		fmt.Fprintf(os.Stderr, "coredns: %v\n", err)
		os.Exit(1)
	}
	coremain.Run()
}
