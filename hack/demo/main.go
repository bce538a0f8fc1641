// Command demo shows the migration users make, on the real-node
// cluster (test/realcluster): real kubelets and containerd, kube-proxy
// v1.37.2 as a DaemonSet in iptables mode, a Deployment behind a ClusterIP
// and a NodePort Service. It installs proxyshift as a user would (`make
// images`, import, `kubectl apply -k config/local`: nothing changes),
// sends traffic through every way into the Services, applies a
// ProxyConfig in nftables mode as a dry run and shows its plan and its
// findings (what will behave differently) with the kubectl plugin, starts
// it (kube-proxy's pod leaves each node as proxyshift takes it over),
// shows each node's progress and the traffic,
// then hands every node back to kube-proxy (unless -no-back), prints what
// each node's kernel holds after each step, and tears everything down.
//
// It needs root (network namespaces, cgroups, kubelets). Traffic stays
// inside the namespaces the harness creates (198.18.0.0/15); Ctrl-C tears
// down.
//
//	sudo make demo
//	sudo go run ./hack/demo -h
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/plugin"
	"github.com/proxyshift/proxyshift/test/e2e"
	"github.com/proxyshift/proxyshift/test/harness"
	"github.com/proxyshift/proxyshift/test/realcluster"
)

// configName is the ProxyConfig the demo applies.
const configName = "demo"

func main() {
	var (
		nodes   = flag.Int("nodes", 3, "Number of nodes (1-5).")
		rate    = flag.Int("rate", 30, "Requests per second the traffic generator sends (1-200).")
		noBack  = flag.Bool("no-back", false, "Stop after the takeover instead of handing the nodes back to kube-proxy.")
		verbose = flag.Bool("v", false, "Show the cluster's bring-up steps.")
		keep    = flag.Bool("keep", false, "Keep the run directory (logs, kubeconfig) after tearing down.")
	)
	flag.Parse()
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	switch {
	case *nodes < 1 || *nodes > 5:
		fail(2, "-nodes %d: must be 1..5", *nodes)
	case *rate < 1 || *rate > 200:
		fail(2, "-rate %d: must be 1..200", *rate)
	}
	if err := realcluster.CanRun(); err != nil {
		fail(2, "%v: run it as root (sudo make demo)", err)
	}
	ctx, cancel := harness.InterruptContext()
	defer cancel()
	d := &demo{nodes: *nodes, rate: *rate, back: !*noBack, verbose: *verbose, keep: *keep, start: time.Now()}
	if err := d.run(ctx); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("interrupted (%v); everything was torn down", err)
		}
		fail(1, "%v", err)
	}
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "demo: "+format+"\n", args...)
	os.Exit(code)
}

type demo struct {
	nodes, rate         int
	back, verbose, keep bool
	start               time.Time

	c  *realcluster.Cluster
	cl client.Client
}

func (d *demo) say(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) run(ctx context.Context) error {
	back := map[bool]string{true: " → kube-proxy", false: ""}[d.back]
	fmt.Printf("proxyshift demo on real kubelets: %d nodes, kube-proxy (iptables) → proxyshift nftables%s, under %d req/s of traffic\n\n", d.nodes, back, d.rate)
	d.say("bringing the real-node cluster up (control plane; %d nodes with containerd and kubelet v1.37.2; kube-proxy; a Deployment) ...", d.nodes)
	opts := realcluster.Options{Nodes: d.nodes, KeepRunDir: d.keep, Logf: func(string, ...any) {}}
	if d.verbose {
		opts.Logf = func(format string, args ...any) { d.say("  "+format, args...) }
	}
	c, err := realcluster.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("bringing the cluster up: %w", err)
	}
	d.c = c
	defer d.tearDown()
	d.say("cluster up in %.1fs; kubeconfig (while the demo runs): export KUBECONFIG=%s", c.Timings[len(c.Timings)-1].Duration.Seconds(), c.Kubeconfig)
	if d.cl, err = c.ProxyshiftClient(); err != nil {
		return err
	}

	d.say("installing proxyshift: make images, import them on every node, kubectl apply -k config/local ...")
	timings, err := c.InstallProxyshift(ctx)
	if err != nil {
		return err
	}
	var took time.Duration
	for _, tm := range timings {
		took += tm.Duration
	}
	d.say("installed in %.1fs; installing changes nothing: kube-proxy serves every node", took.Seconds())
	if err := d.waitReported(ctx); err != nil {
		return err
	}
	d.kubectl(ctx, "get", "proxynodes", "-o", "wide")

	targets, err := c.WebTargets(ctx)
	if err != nil {
		return err
	}
	var ets []e2e.Target
	for _, t := range targets {
		ets = append(ets, e2e.Target{Name: fmt.Sprintf("%s from %s", t.Addr, t.From), From: t.NS, Addr: t.Addr})
	}
	d.say("traffic: %d req/s of new connections, round robin over %d ways in (the ClusterIP from every node and a client, every node's NodePort from the client)", d.rate, len(ets))
	tctx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	tr := e2e.StartTraffic(tctx, ets, d.rate, 2*time.Second)
	defer tr.Stop()

	steps := []v1alpha1.ProxyMode{v1alpha1.ModeNFTables}
	if d.back {
		steps = append(steps, v1alpha1.ModeKubeProxy)
	}
	type result struct {
		mode         v1alpha1.ProxyMode
		took         time.Duration
		sent, failed int64
		phase        v1alpha1.RolloutPhase
	}
	var results []result
	for _, mode := range steps {
		fmt.Println()
		var gen int64
		start := time.Now()
		sent0, failed0 := tr.Sent.Load(), tr.Failed.Load()
		if mode == steps[0] {
			// Know before you switch: a dry run first, its plan and
			// what will behave differently, then start that plan.
			if gen, err = d.planFirst(ctx, mode); err != nil {
				return err
			}
			start = time.Now()
			sent0, failed0 = tr.Sent.Load(), tr.Failed.Load()
		} else {
			d.say("kubectl apply: ProxyConfig %s, mode %s (every node; canary 1, then 1 at a time; rollback on failure)", configName, mode)
			if gen, err = realcluster.ApplyMode(ctx, d.cl, configName, mode); err != nil {
				return err
			}
		}
		s, err := e2e.Follow(ctx, d.cl, configName, gen, 6*time.Minute, tr, d.say)
		if err != nil {
			return err
		}
		st := s.Config.Status
		r := result{mode: mode, took: time.Since(start), sent: tr.Sent.Load() - sent0, failed: tr.Failed.Load() - failed0, phase: st.Phase}
		results = append(results, r)
		d.say("ProxyConfig %s: %s in %.1fs; %d requests during it, %d failed", configName, st.Phase, r.took.Seconds(), r.sent, r.failed)
		for _, f := range st.FailedNodes {
			d.say("  failed node %s: %s", f.Name, f.Reason)
		}
		d.kubectl(ctx, "get", "proxyconfig,proxynodes")
		d.say("kube-proxy's pods run on: %s", strings.Join(d.kubeProxyNodes(ctx), ", "))
		d.say("what each node's kernel holds (iptables-save of both backends, nft list tables, inside the node):")
		for _, n := range c.Nodes {
			o, err := n.Objects(ctx)
			if err != nil {
				d.say("  %s: %v", n.Name, err)
				continue
			}
			d.say("  %s: %s", n.Name, o.Summary())
		}
		if st.Phase != v1alpha1.RolloutCompleted {
			d.say("the rollout did not complete; stopping here")
			break
		}
	}
	stopTraffic()
	tr.Stop()

	fmt.Println("\n──── summary ────")
	for _, r := range results {
		fmt.Printf("  rollout to %-10s  %-9s %5.1fs  %5d requests during it, %d failed\n", r.mode, r.phase, r.took.Seconds(), r.sent, r.failed)
	}
	fmt.Printf("  traffic in all: %d requests, %d failed\n", tr.Sent.Load(), tr.Failed.Load())
	ans := tr.Answers()
	var pods []string
	for _, k := range slices.Sorted(maps.Keys(ans)) {
		pods = append(pods, fmt.Sprintf("%s %d", k, ans[k]))
	}
	fmt.Printf("  answered by: %s\n", strings.Join(pods, ", "))
	for _, f := range tr.Failures() {
		fmt.Printf("  failure: %s\n", f)
	}
	fmt.Printf("  demo time so far: %.1fs\n", time.Since(d.start).Seconds())
	fmt.Println("─────────────────")
	for _, r := range results {
		if r.phase != v1alpha1.RolloutCompleted {
			return fmt.Errorf("the rollout to %s ended %s", r.mode, r.phase)
		}
	}
	if tr.Failed.Load() > 0 {
		return fmt.Errorf("%d requests failed", tr.Failed.Load())
	}
	return nil
}

// planFirst creates the ProxyConfig in mode as a dry run, shows its plan
// and its findings with the kubectl plugin, then starts the plan; it
// returns the generation that started it.
func (d *demo) planFirst(ctx context.Context, mode v1alpha1.ProxyMode) (int64, error) {
	pc := realcluster.NewProxyConfig(configName, mode)
	pc.Spec.Rollout.DryRun = true
	d.say("kubectl apply: ProxyConfig %s, mode %s, as a dry run (spec.rollout.dryRun: true; every node; canary 1, then 1 at a time; rollback on failure)", configName, mode)
	if err := d.cl.Create(ctx, pc); err != nil {
		return 0, err
	}
	for _, args := range [][]string{{"plan", configName, "--request"}, {"findings", configName}, {"plan", configName, "--start"}} {
		if err := d.plugin(ctx, args...); err != nil {
			return 0, err
		}
	}
	if err := d.cl.Get(ctx, client.ObjectKeyFromObject(pc), pc); err != nil {
		return 0, err
	}
	return pc.Generation, nil
}

// plugin runs `kubectl proxyshift ARGS` (the plugin's own code, against
// the cluster's kubeconfig) and prints its output.
func (d *demo) plugin(ctx context.Context, args ...string) error {
	d.say("$ kubectl proxyshift %s", strings.Join(args, " "))
	var out bytes.Buffer
	cmd := plugin.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	cmd.SetArgs(append([]string{"--kubeconfig", d.c.Kubeconfig}, args...))
	err := cmd.ExecuteContext(ctx)
	for _, l := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		fmt.Printf("           %s\n", l)
	}
	return err
}

// waitReported waits until every agent reports its node served by
// kube-proxy.
func (d *demo) waitReported(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		var l v1alpha1.ProxyNodeList
		err := d.cl.List(ctx, &l)
		n := 0
		for _, pn := range l.Items {
			if pn.Status.ActiveMode == v1alpha1.ModeKubeProxy {
				n++
			}
		}
		if err == nil && n == d.nodes {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the agents did not all report kube-proxy serving their node (%d of %d; %v)", n, d.nodes, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// kubectl runs kubectl against the cluster and prints its output.
func (d *demo) kubectl(ctx context.Context, args ...string) {
	d.say("$ kubectl %s", strings.Join(args, " "))
	out, err := d.c.Kubectl(ctx, args...)
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Printf("           %s\n", l)
	}
	if err != nil {
		d.say("  (%v)", err)
	}
}

// kubeProxyNodes are the nodes a running kube-proxy pod is on.
func (d *demo) kubeProxyNodes(ctx context.Context) []string {
	pods, err := d.c.Kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: realcluster.KubeProxySelector})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out = append(out, p.Spec.NodeName)
		}
	}
	slices.Sort(out)
	if len(out) == 0 {
		return []string{"no node"}
	}
	return out
}

func (d *demo) tearDown() {
	fmt.Println()
	d.say("tearing down: kubelets, containerd, control plane, every namespace, mount and cgroup ...")
	if err := d.c.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: tearing down: %v\n", err)
	} else if left := d.c.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "demo: left on the machine: %v\n", left)
	} else {
		d.say("torn down: nothing left on the machine")
	}
	if d.keep {
		fmt.Printf("run directory kept: %s\n", d.c.RunDir)
	}
}
