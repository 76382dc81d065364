// The pause process of the dev cluster's real nodes: the first process of every pod sandbox.
// It holds the pod's namespaces, reaps children that end up below it and exits on
// SIGINT/SIGTERM. Built by hack/build-realnode.sh and packed as localhost/fluxnetes-pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// reap every exited child (the pod may share its PID namespace)
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
