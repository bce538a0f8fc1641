// Command pause is the real-node cluster's pod sandbox process (the "pause"
// container holding each pod's namespaces) and the init process of each
// node's PID namespace (test/realcluster). It does nothing but wait: it
// reaps the children the kernel hands it (orphans re-parented to a
// namespace's init) so none is left a zombie, and exits 0 on SIGTERM or
// SIGINT. It is built static (CGO_ENABLED=0) so the image needs no libc.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited; one SIGCHLD may stand for
// several.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
