// A CoreDNS for the dev cluster's real nodes (docs/real-nodes.md): the release's server with
// only the plugins its Corefile uses (fluxnetes.devcluster.dns), so the build leaves out the
// cloud providers' SDKs. No forward plugin: it answers cluster.local and nothing else.
package main

import (
	"log"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func main() {
	// execution order, as in the release's plugin.cfg
	if err := dnsserver.SetDirectives([]string{"bind", "errors", "log", "kubernetes"}); err != nil {
		log.Fatal(err)
	}
	coremain.Run()
}
