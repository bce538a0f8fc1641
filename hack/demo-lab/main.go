// Command demo-lab shows proxyshift moving a local cluster between dataplane
// modes under traffic: it brings up a 3-node local cluster (test/cluster)
// in iptables mode, has the operator take the nodes over with a
// ProxyConfig in iptables mode, starts a bounded traffic generator in the
// client namespaces against the web Service's ClusterIP and its NodePort,
// sets the ProxyConfig to nftables, shows each node's progress and the
// traffic as they go, prints a summary (time, requests, failures, what
// each agent removed, what the kernels hold), switches back to iptables
// the same way (unless -no-back), and tears everything down.
//
// It needs root (network namespaces, netfilter). Traffic stays inside the
// namespaces the harness creates (198.18.0.0/15); Ctrl-C tears down.
//
//	sudo make demo-lab
//	sudo go run ./hack/demo-lab -h
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/e2e"
)

func main() {
	var (
		nodes       = flag.Int("nodes", 3, "Number of nodes (1-10).")
		rate        = flag.Int("rate", 50, "Requests per second the traffic generator sends while a rollout runs (1-200).")
		nodeTimeout = flag.Duration("node-timeout", 45*time.Second, "The ProxyConfig's spec.rollout.nodeTimeout.")
		noBack      = flag.Bool("no-back", false, "Stop after the move to nftables instead of switching back to iptables.")
		verbose     = flag.Bool("v", false, "Show the cluster's bring-up steps.")
		keep        = flag.Bool("keep", false, "Keep the run directory (logs, kubeconfig) after tearing down.")
	)
	flag.Parse()
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	if err := preflight(*nodes, *rate); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(2)
	}
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Everything, a cold build included, within this bound.
	ctx, cancel := context.WithTimeout(sigCtx, 12*time.Minute)
	defer cancel()
	d := &demo{nodes: *nodes, rate: *rate, nodeTimeout: *nodeTimeout, back: !*noBack, verbose: *verbose, keep: *keep, start: time.Now()}
	err := d.run(ctx)
	if err != nil {
		if sigCtx.Err() != nil {
			err = errors.New("interrupted; everything was torn down")
		}
		fmt.Fprintf(os.Stderr, "\ndemo: %v\n", err)
		os.Exit(1)
	}
}

func preflight(nodes, rate int) error {
	if nodes < 1 || nodes > 10 {
		return fmt.Errorf("-nodes %d: must be 1..10", nodes)
	}
	if rate < 1 || rate > 200 {
		return fmt.Errorf("-rate %d: must be 1..200", rate)
	}
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root: it creates network namespaces and programs netfilter inside them.\n      Run it as root: sudo make demo-lab")
	}
	var missing []string
	for _, bin := range []string{"ip", "nft", "iptables-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		if _, err2 := exec.LookPath("iptables-nft-restore"); err2 != nil {
			missing = append(missing, "iptables-restore")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: the demo's iptables and nftables modes and its checks need iproute2, nftables and iptables (Debian: apt-get install iproute2 nftables iptables)", strings.Join(missing, ", "))
	}
	return nil
}

type demo struct {
	nodes, rate int
	nodeTimeout time.Duration
	back        bool
	verbose     bool
	keep        bool
	start       time.Time

	c *cluster.Cluster
}

func (d *demo) say(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) run(ctx context.Context) (err error) {
	fmt.Printf("proxyshift demo: %d nodes, iptables → nftables%s under %d req/s of traffic\n\n", d.nodes, map[bool]string{true: " → iptables", false: ""}[d.back], d.rate)
	d.say("bringing the local cluster up (API server, operator, %d node namespaces with agents, pods, Services) ...", d.nodes)
	opts := cluster.Options{Nodes: d.nodes, Mode: v1alpha1.ModeIPTables, KeepRunDir: d.keep}
	if d.verbose {
		opts.Logf = func(format string, args ...any) { d.say("  "+format, args...) }
	}
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("bringing the cluster up: %w", err)
	}
	d.c = c
	defer func() {
		d.say("tearing down: agents, operator, API server, every namespace ...")
		if cerr := c.Close(); cerr != nil {
			fmt.Fprintf(os.Stderr, "demo: tearing down: %v\n", cerr)
		} else {
			d.say("torn down: every process stopped, every namespace removed")
		}
		if d.keep {
			fmt.Printf("run directory kept: %s\n", c.RunDir)
		}
	}()
	var total time.Duration
	for _, t := range c.Timings {
		total += t.Duration
	}
	d.say("cluster up in %.1fs: nodes %s; Services web %s (ClusterIP), web-nodeport :%d (NodePort)", total.Seconds(), strings.Join(nodeNames(c), ", "), c.Service(cluster.ServiceWeb).ClusterAddr(), cluster.NodePort)
	d.say("kubeconfig (while the demo runs): export KUBECONFIG=%s", c.Kubeconfig)

	if err := e2e.WaitNodesActive(ctx, c.Client, v1alpha1.ModeIPTables, d.nodes, 90*time.Second); err != nil {
		return fmt.Errorf("the agents did not all come up in iptables mode: %w", err)
	}
	d.say("every agent serves in iptables mode")

	// 1. The operator takes the nodes over in iptables mode.
	d.say("kubectl apply: ProxyConfig %s, mode iptables (all nodes; canary 1, maxUnavailable 1, nodeTimeout %v)", e2e.ConfigName, d.nodeTimeout)
	s, _, err := d.rollout(ctx, v1alpha1.ModeIPTables, nil)
	if err != nil {
		return err
	}
	if s.Config.Status.Phase != v1alpha1.RolloutCompleted {
		return fmt.Errorf("taking the nodes over in iptables mode ended %s, not Completed (failed nodes: %v); rerun with -keep to keep the operator's and agents' logs", s.Config.Status.Phase, s.Config.Status.FailedNodes)
	}
	for _, n := range s.Nodes {
		if n.Status.ActiveMode != v1alpha1.ModeIPTables {
			return fmt.Errorf("%s runs %q, not iptables: the agent's iptables dataplane is not available here, so the demo cannot show a migration from it (rerun with -keep to keep the agents' logs)", n.Name, n.Status.ActiveMode)
		}
	}

	// 2. Traffic, then the switch(es).
	targets, err := e2e.Targets(c)
	if err != nil {
		return err
	}
	var names []string
	for _, t := range targets {
		names = append(names, t.Name)
	}
	d.say("traffic: %d req/s round robin to %s", d.rate, strings.Join(names, ", "))
	tctx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	tr := e2e.StartTraffic(tctx, targets, d.rate, 2*time.Second)
	defer tr.Stop()
	time.Sleep(2 * time.Second)

	modes := []v1alpha1.ProxyMode{v1alpha1.ModeNFTables}
	if d.back {
		modes = append(modes, v1alpha1.ModeIPTables)
	}
	type result struct {
		mode              v1alpha1.ProxyMode
		took              time.Duration
		sent, failed      int64
		phase             v1alpha1.RolloutPhase
		updated, selected int32
	}
	var results []result
	var failures []string
	for _, m := range modes {
		logs := e2e.LogSizes(c)
		sent0, failed0 := tr.Sent.Load(), tr.Failed.Load()
		d.say("kubectl apply: ProxyConfig %s, mode %s", e2e.ConfigName, m)
		s, took, err := d.rollout(ctx, m, tr)
		if err != nil {
			return err
		}
		st := s.Config.Status
		r := result{mode: m, took: took, sent: tr.Sent.Load() - sent0, failed: tr.Failed.Load() - failed0, phase: st.Phase, updated: st.Nodes.Updated, selected: st.Nodes.Selected}
		results = append(results, r)
		fmt.Println()
		d.say("ProxyConfig %s: %s, %d/%d nodes in %s, in %.1fs; %d requests during the rollout, %d failed", e2e.ConfigName, st.Phase, r.updated, r.selected, m, took.Seconds(), r.sent, r.failed)
		for _, f := range st.FailedNodes {
			d.say("  failed node %s: %s", f.Name, f.Reason)
		}
		d.say("what the agents removed (from their logs):")
		rm := e2e.Removals(c, logs)
		if len(rm) == 0 {
			d.say("  nothing")
		}
		for _, x := range rm {
			d.say("  %s: %s %s: %s", x.Node, strings.ToLower(x.What[:1])+x.What[1:], x.Mode, x.Summary())
		}
		d.say("what each node's kernel holds (iptables-legacy-save, iptables-nft-save, nft list tables inside its namespace):")
		for _, n := range c.Nodes {
			k, err := e2e.ReadKernel(ctx, n)
			if err != nil {
				d.say("  %s: %v", n.Name, err)
				continue
			}
			left, missing := k.Leftovers(m)
			verdict := "clean: nothing of the other mode"
			if len(left) > 0 {
				verdict = "LEFTOVERS: " + strings.Join(left, ", ")
			}
			if missing != "" {
				verdict += "; " + missing
			}
			d.say("  %s: PROXYSHIFT chains legacy %d, nft %d; table proxyshift %s; %s", n.Name, len(k.LegacyChains), len(k.NFTChains), yesNo(k.Table), verdict)
		}
		fmt.Println()
		if st.Phase != v1alpha1.RolloutCompleted {
			d.say("the rollout did not complete; stopping here")
			break
		}
	}
	time.Sleep(time.Second)
	stopTraffic()
	tr.Stop()
	failures = tr.Failures()

	fmt.Println("──── summary ────")
	for _, r := range results {
		fmt.Printf("  rollout to %-8s  %-9s %d/%d nodes  %5.1fs  %5d requests during it, %d failed\n", r.mode, r.phase, r.updated, r.selected, r.took.Seconds(), r.sent, r.failed)
	}
	fmt.Printf("  traffic in all: %d requests, %d failed\n", tr.Sent.Load(), tr.Failed.Load())
	bt := tr.ByTarget()
	for _, k := range slices.Sorted(maps.Keys(bt)) {
		fmt.Printf("    %-22s %5d sent  %d failed\n", k, bt[k].Sent, bt[k].Failed)
	}
	ans := tr.Answers()
	var pods []string
	for _, k := range slices.Sorted(maps.Keys(ans)) {
		pods = append(pods, fmt.Sprintf("%s %d", k, ans[k]))
	}
	fmt.Printf("  answered by: %s\n", strings.Join(pods, ", "))
	for _, f := range failures {
		fmt.Printf("  failure: %s\n", f)
	}
	fmt.Printf("  demo time so far: %.1fs\n", time.Since(d.start).Seconds())
	fmt.Println("─────────────────")
	for _, r := range results {
		if r.phase != v1alpha1.RolloutCompleted {
			return fmt.Errorf("the rollout to %s ended %s", r.mode, r.phase)
		}
	}
	return nil
}

// rollout applies mode and follows the rollout to its end (e2e.Follow).
func (d *demo) rollout(ctx context.Context, mode v1alpha1.ProxyMode, tr *e2e.Traffic) (e2e.Snapshot, time.Duration, error) {
	start := time.Now()
	gen, err := e2e.ApplyMode(ctx, d.c.Client, e2e.ConfigName, mode, d.nodeTimeout)
	if err != nil {
		return e2e.Snapshot{}, 0, err
	}
	s, err := e2e.Follow(ctx, d.c.Client, e2e.ConfigName, gen, 4*time.Minute, tr, d.say)
	if err != nil && s.Config != nil && s.Config.Status.ObservedGeneration < gen {
		tail := ""
		if d.c.Operator != nil {
			if b, rerr := os.ReadFile(d.c.Operator.Log); rerr == nil {
				tail = string(b[max(0, len(b)-800):])
			}
		}
		err = fmt.Errorf("%w\n      The proxyshift-operator binary did not act on the ProxyConfig. The end of its log:\n%s", err, tail)
	}
	return s, time.Since(start), err
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func nodeNames(c *cluster.Cluster) []string {
	var ns []string
	for _, n := range c.Nodes {
		ns = append(ns, fmt.Sprintf("%s %s", n.Name, n.IP))
	}
	return ns
}
