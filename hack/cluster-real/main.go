// Command cluster-real runs the real-node cluster (test/realcluster) on
// this machine until Ctrl-C: etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler, N nodes each running a real containerd and kubelet
// v1.37.2, kube-proxy v1.37.2 as a DaemonSet in iptables mode, and a
// Deployment behind a ClusterIP and a NodePort Service, all inside
// network namespaces with addresses from 198.18.0.0/15. It prints a
// kubeconfig for kubectl in another terminal. Everything is removed on
// exit (Ctrl-C, SIGTERM or a failed start).
//
//	sudo go run ./hack/cluster-real [-nodes 3] [-no-kube-proxy]
//
// See docs/local-cluster.md.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"time"

	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/harness"
	"github.com/proxyshift/proxyshift/test/realcluster"
)

func main() {
	var (
		nodes       = flag.Int("nodes", 3, fmt.Sprintf("Number of nodes (1-%d).", cluster.MaxNodes))
		noKubeProxy = flag.Bool("no-kube-proxy", false, "Leave kube-proxy out (nothing serves the Services).")
		noWorkload  = flag.Bool("no-workload", false, "Leave the Deployment and its Services out.")
		port        = flag.Int("port", 0, "Port on 127.0.0.1 where kubectl reaches the API server (0: any free port).")
		keep        = flag.Bool("keep", false, "Keep the run directory (logs, kubeconfigs) after exit.")
		runDir      = flag.String("run-dir", "", "Directory for the cluster's files (default: a new temporary directory). Its contents are kept.")
		binDir      = flag.String("bin-dir", "", "Directory with the binaries (default: what hack/realcluster.sh prints, building them once).")
		timeout     = flag.Duration("start-timeout", 30*time.Minute, "Bound on the whole bring-up, building included.")
	)
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if err := realcluster.CanRun(); err != nil {
		log.Fatalf("%v: run it as root (sudo) after hack/install-deps.sh", err)
	}

	// Ctrl-C or SIGTERM ends a bring-up or the wait; later ones are
	// ignored so the teardown always finishes.
	ctx, cancel := harness.InterruptContext()
	defer cancel()

	c, err := realcluster.Start(ctx, realcluster.Options{
		Nodes:        *nodes,
		NoKubeProxy:  *noKubeProxy,
		NoWorkload:   *noWorkload,
		RunDir:       *runDir,
		KeepRunDir:   *keep,
		BinDir:       *binDir,
		StartTimeout: *timeout,
		ForwardAddr:  netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(*port)).String(),
		Logf:         log.Printf,
	})
	if err != nil {
		log.Printf("the cluster did not come up: %v", err)
		os.Exit(1)
	}
	fmt.Printf("\nreal-node cluster up in %.1fs; Ctrl-C to tear it down.\n\n%s\n", c.Timings[len(c.Timings)-1].Duration.Seconds(), c.Summary())
	<-ctx.Done()
	stopStart := time.Now()
	code := 0
	if err := c.Close(); err != nil {
		log.Printf("teardown: %v", err)
		code = 1
	}
	if left := c.Leftovers(); len(left) > 0 {
		log.Printf("left on the machine: %v", left)
		code = 1
	}
	log.Printf("cluster removed in %.1fs", time.Since(stopStart).Seconds())
	if *keep || *runDir != "" {
		log.Printf("run directory kept: %s", c.RunDir)
	}
	os.Exit(code)
}
