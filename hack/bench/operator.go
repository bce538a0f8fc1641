package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/test/bench"
)

// The operator benchmark's flags (test/bench.RunOperator).
var (
	operatorNodes   = flag.Int("operator-nodes", 10000, "Simulated Nodes for the operator benchmark (the shipped operator binary moving them iptables -> nftables); 0 skips it. 1000 is a quick run.")
	operatorBin     = flag.String("operator", "bin/proxyshift-operator", "proxyshift-operator binary.")
	operatorOnly    = flag.Bool("operator-only", false, "Run only the operator benchmark (no kube-proxy comparison).")
	operatorMaxUnav = flag.String("operator-max-unavailable", "10%", "The benchmark ProxyConfig's spec.rollout.maxUnavailable. The default, 1 node, would move 10k nodes one at a time: hours.")
	operatorTimeout = flag.Duration("operator-timeout", 10*time.Minute, "Bound on each of the operator benchmark's install (every ProxyNode created and reported) and rollout.")
)

// runOperator measures the operator and, with write set, puts its section
// into that Markdown file.
func runOperator(assets, write string, keep bool) error {
	if *operatorNodes <= 0 {
		return nil
	}
	if assets == "" {
		return fmt.Errorf("-assets is required (make bench sets it)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "proxyshift-bench-operator-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Printf("operator run directory: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	logf := func(format string, args ...any) {
		fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	res, err := bench.RunOperator(ctx, bench.OperatorPlan{
		Nodes: *operatorNodes, Operator: *operatorBin, Assets: assets, Dir: dir,
		MaxUnavailable: intstr.Parse(*operatorMaxUnav), SwitchTime: time.Second, SwitchJitter: time.Second,
		Timeout: *operatorTimeout, Logf: logf,
	})
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(res.Markdown())
	if write != "" {
		if err := res.WriteInto(write); err != nil {
			return err
		}
		logf("wrote the operator's figures into %s", write)
	}
	return nil
}
