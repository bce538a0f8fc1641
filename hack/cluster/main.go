// Command cluster runs a local proxyshift cluster on this machine until
// Ctrl-C: the test API server and etcd, the operator, N nodes (network
// namespaces) each with its own proxyshift-agent, backend pods and demo
// Services, all inside network namespaces with addresses from
// 198.18.0.0/15. It prints a kubeconfig for kubectl in another terminal.
// Everything is removed on exit (Ctrl-C, SIGTERM or a failed start).
//
//	sudo go run ./hack/cluster [-nodes 3] [-pods-per-node 2] [-mode nftables]
//
// See docs/local-cluster.md.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/harness"
)

func main() {
	var (
		nodes      = flag.Int("nodes", 3, fmt.Sprintf("Number of nodes (1-%d).", cluster.MaxNodes))
		pods       = flag.Int("pods-per-node", 2, "Backend pods on each node.")
		mode       = flag.String("mode", string(v1alpha1.ModeNFTables), "Dataplane the agents start with (and the ProxyNodes' desiredMode).")
		port       = flag.Int("port", 0, "Port on 127.0.0.1 where kubectl reaches the API server (0: any free port).")
		keep       = flag.Bool("keep", false, "Keep the run directory (logs, kubeconfigs) after exit.")
		runDir     = flag.String("run-dir", "", "Directory for the cluster's files (default: a new temporary directory). Its contents are kept.")
		binDir     = flag.String("bin-dir", "", "Directory with prebuilt proxyshift-operator and proxyshift-agent (default: build them).")
		noOperator = flag.Bool("no-operator", false, "Do not run the operator.")
		noPN       = flag.Bool("no-proxynodes", false, "Do not create ProxyNodes (leave it to the operator).")
		kcOut      = flag.String("write-kubeconfig", "", "Also copy the kubeconfig to this path (removed on exit).")
		agentArgs  = flag.String("agent-args", "", "Extra agent flags, space-separated.")
		timeout    = flag.Duration("start-timeout", 10*time.Minute, "Bound on the whole bring-up, building included.")
	)
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	ctrllog.SetLogger(zap.New(zap.WriteTo(io.Discard))) // the harness's API client has nothing to say
	if os.Geteuid() != 0 {
		log.Fatal("the local cluster needs root (network namespaces, netfilter): run it with sudo")
	}

	// Ctrl-C or SIGTERM ends a bring-up or the wait; later ones are
	// ignored so the teardown always finishes.
	ctx, cancel := harness.InterruptContext()
	defer cancel()

	opts := cluster.Options{
		Nodes:        *nodes,
		PodsPerNode:  *pods,
		Mode:         v1alpha1.ProxyMode(*mode),
		RunDir:       *runDir,
		KeepRunDir:   *keep,
		BinDir:       *binDir,
		NoOperator:   *noOperator,
		NoProxyNodes: *noPN,
		StartTimeout: *timeout,
		ForwardAddr:  netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(*port)).String(),
		AgentArgs:    strings.Fields(*agentArgs),
		Logf:         log.Printf,
	}
	start := time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		log.Printf("the cluster did not come up: %v", err)
		os.Exit(1)
	}
	code := 0
	if *kcOut != "" {
		if err := copyFile(c.Kubeconfig, *kcOut); err != nil {
			log.Printf("write %s: %v", *kcOut, err)
			cancel()
			code = 1
		}
	}
	if code == 0 {
		fmt.Printf("\nproxyshift local cluster up in %.1fs; Ctrl-C to tear it down.\n\n%s", time.Since(start).Seconds(), c.Summary())
		if *kcOut != "" {
			fmt.Printf("kubeconfig copy: %s\n", *kcOut)
		}
		fmt.Println()
	}
	<-ctx.Done()
	if *kcOut != "" {
		_ = os.Remove(*kcOut)
	}
	stopStart := time.Now()
	if err := c.Close(); err != nil {
		log.Printf("teardown: %v", err)
		code = 1
	}
	log.Printf("cluster removed in %.1fs", time.Since(stopStart).Seconds())
	if *keep || *runDir != "" {
		log.Printf("run directory kept: %s", c.RunDir)
	}
	os.Exit(code)
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}
