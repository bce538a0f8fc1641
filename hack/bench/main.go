// Command bench measures proxyshift's agent beside kube-proxy (see
// test/bench): it starts the test API server, creates the Services and
// EndpointSlices size by size, runs each program in its own network
// namespace in each mode, prints a table with both figures and their ratio
// per row, and (with -write) puts it into docs/benchmarks.md with PNG
// charts: first-sync time and peak RSS against Service count, and a
// programming-latency CDF per mode and size. At the largest size it also
// switches the node's mode nftables <-> iptables through its ProxyNode.
//
// It needs root (network namespaces, netfilter). `make bench` builds
// everything it needs and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/proxyshift/proxyshift/test/bench"
	"github.com/proxyshift/proxyshift/test/testenv"
)

func main() {
	var (
		kubeProxy = flag.String("kube-proxy", "", "kube-proxy binary (hack/kube-proxy.sh prints it).")
		agent     = flag.String("agent", "bin/proxyshift-agent", "proxyshift-agent binary.")
		assets    = flag.String("assets", os.Getenv("KUBEBUILDER_ASSETS"), "Directory with kube-apiserver and etcd (hack/controlplane.sh prints it).")
		sizes     = flag.String("sizes", "1000,5000,10000", "Comma-separated Service counts, ascending.")
		modes     = flag.String("modes", "nftables,iptables", "Comma-separated modes.")
		programs  = flag.String("programs", "kube-proxy,proxyshift", "Comma-separated programs to run (a subset of the default).")
		iptMax    = flag.Int("iptables-max", 5000, "Largest Service count measured in iptables mode (kube-proxy's iptables-nft first sync grows quadratically: it did not finish 5k within 5 minutes here, and 10k would not fit the run's time).")
		syncLimit = flag.Duration("sync-timeout", 3*time.Minute, "Bound on each first sync; a program that takes longer is reported as slower than it.")
		changes   = flag.Int("changes", 100, "Endpoint changes per run (programming latency samples).")
		every     = flag.Duration("change-every", 1100*time.Millisecond, "Time between the starts of two endpoint changes: above both programs' default minSyncPeriod (1s); 100 changes span three to four of their default periodic resyncs (30s).")
		connects  = flag.Int("connects", 200, "Connections per first-packet figure.")
		swSize    = flag.Int("switch-size", 0, "Service count at which the node switches modes (default the largest of -sizes); -1 measures no switch.")
		swModes   = flag.String("switch-modes", "nftables,iptables", "Modes the node switches between, in turn from the first (the switches run after that mode's measurements).")
		swRounds  = flag.Int("switch-rounds", 2, "Rounds through -switch-modes (2 rounds of two modes: 2 switches each way).")
		timeout   = flag.Duration("timeout", 40*time.Minute, "Bound on the whole run.")
		write     = flag.String("write", "", "Markdown file whose benchmark section gets the table (the chart goes next to it); empty prints only.")
		keep      = flag.Bool("keep", false, "Keep the run directory (logs, configurations).")
	)
	flag.Parse()
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	plan := bench.Plan{
		Modes: strings.Split(*modes, ","), MaxSize: map[string]int{"iptables": *iptMax},
		Changes: *changes, ChangeEvery: *every, Connects: *connects, SyncTimeout: *syncLimit, Workers: 16,
		SwitchSize: *swSize,
		Switch:     bench.SwitchPlan{Modes: strings.Split(*swModes, ","), Rounds: *swRounds, Timeout: 3 * time.Minute, ProbeEvery: 5 * time.Millisecond},
	}
	if !*operatorOnly {
		if err := run(plan, *programs, *kubeProxy, *agent, *assets, *sizes, *timeout, *write, *keep); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
	}
	if err := runOperator(*assets, *write, *keep); err != nil {
		fmt.Fprintf(os.Stderr, "bench: operator: %v\n", err)
		os.Exit(1)
	}
}

func run(plan bench.Plan, programs, kubeProxy, agent, assets, sizeList string, timeout time.Duration, write string, keep bool) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root: it creates network namespaces and programs netfilter inside them (sudo make bench)")
	}
	if kubeProxy == "" || assets == "" {
		return fmt.Errorf("-kube-proxy and -assets are required (make bench sets them)")
	}
	var err error
	if plan.Sizes, err = parseSizes(sizeList); err != nil {
		return err
	}
	if plan.SwitchSize == 0 {
		plan.SwitchSize = plan.Sizes[len(plan.Sizes)-1]
	}
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(sigCtx, timeout)
	defer cancel()

	dir, err := os.MkdirTemp("", "proxyshift-bench-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Printf("run directory: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	logf := func(format string, args ...any) {
		fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	started := time.Now()
	env, err := testenv.LaunchAdvertising(assets, dir, bench.APIAdvertiseIP)
	if err != nil {
		return err
	}
	defer env.Stop()
	host, err := url.Parse(env.Config.Host)
	if err != nil {
		return err
	}
	cfg := *env.Config
	cfg.QPS, cfg.Burst = 2000, 4000
	kube, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		return err
	}
	lab, err := bench.NewLab()
	if err != nil {
		return err
	}
	defer lab.Close()
	objs, err := bench.NewObjects(ctx, kube)
	if err != nil {
		return err
	}
	if plan.ProxyNodes, err = bench.NewProxyNodes(env.Config); err != nil {
		return err
	}
	for _, p := range []bench.Program{bench.KubeProxy(kubeProxy), bench.Proxyshift(agent)} {
		if slices.Contains(strings.Split(programs, ","), p.Name) {
			plan.Programs = append(plan.Programs, p)
		}
	}
	if len(plan.Programs) == 0 {
		return fmt.Errorf("-programs: want kube-proxy, proxyshift or both, got %q", programs)
	}
	plan.Dir, plan.Kubeconfig, plan.APIServer, plan.Logf = dir, env.Kubeconfig, host.Host, logf
	results, runErr := bench.Run(ctx, lab, objs, plan)
	report := bench.NewReport(results, time.Since(started))
	for _, p := range plan.Programs {
		report.Flags = append(report.Flags, bench.ProgramFlags{Program: p.Name, Flags: p.Flags("<mode>")})
	}
	fmt.Println()
	if runErr != nil {
		// What was measured is written all the same, with why it stopped.
		report.Extra = append(report.Extra, fmt.Sprintf("### the run stopped early\n\n%v", runErr))
	}
	fmt.Print(report.Markdown())
	if write != "" && len(results) > 0 {
		if err := report.WriteInto(write); err != nil {
			return err
		}
		logf("wrote the table into %s and the charts next to it", write)
	}
	return runErr
}

func parseSizes(list string) ([]int, error) {
	var sizes []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= bench.ProbeServices || (len(sizes) > 0 && n <= sizes[len(sizes)-1]) {
			return nil, fmt.Errorf("-sizes: want ascending counts above %d, got %q", bench.ProbeServices, list)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}
