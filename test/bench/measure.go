package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// Result is one program's figures in one mode at one Service count.
type Result struct {
	Program  string
	Mode     string
	Services int
	// FirstSync is from starting the program until the last Service
	// answers, measured from outside (it includes start-up and the
	// initial list of every Service and EndpointSlice).
	FirstSync time.Duration
	// TimedOut says the last Service did not answer within FirstSync (the
	// plan's SyncTimeout); nothing else was measured then.
	TimedOut bool
	// FirstSyncMetric is the time the program's own metrics account to
	// its syncs up to that point, over FirstSyncs syncs.
	FirstSyncMetric time.Duration
	FirstSyncs      uint64
	// ChangeSync is the mean sync duration, from the program's metrics,
	// over the syncs the endpoint changes caused (ChangeSyncs of them).
	ChangeSync  time.Duration
	ChangeSyncs uint64
	// Latency holds one programming latency per endpoint change: from
	// the EndpointSlice update being sent (no read before it) until a
	// connection to the Service reaches the new endpoint.
	Latency []time.Duration
	// Write holds, per endpoint change, the time the EndpointSlice update
	// call took (the API server's write, etcd's included): the part of
	// Latency before the program can have seen the change.
	Write []time.Duration
	// ChangeSpan is the time from the first endpoint change to the last
	// one's answer: the changes meet every periodic resync in it.
	ChangeSpan time.Duration
	// ConnectFirst and ConnectLast are TCP connect times to the first
	// and the last ordinary Service, one per connection that got an
	// answer; ConnectFailures counts those that did not (within 2 s).
	ConnectFirst, ConnectLast []time.Duration
	ConnectFailures           int
	// PeakRSS is the program's peak resident set size, in bytes, before
	// any mode switch; for a program whose first sync gave up, its peak
	// until then.
	PeakRSS int64
	// TreeRSS is the largest resident set of the program and the
	// processes it started together (iptables-restore, ...), sampled
	// every TreeSampleEvery until PeakRSS is read (see treeRSS).
	TreeRSS int64
	// Heap is the program's Go heap, read through its metrics and
	// profiles.
	Heap HeapFigures
	// Ruleset is the node's `nft list ruleset` once the first sync has
	// settled (see MeasureRuleset).
	Ruleset RulesetSize
	// RulesetKernel is the kernel memory the program's ruleset held at
	// the end of its run (see rulesetKernelMemory), or 0 when this
	// machine cannot tell.
	RulesetKernel int64
	// Switches are the mode switches measured after everything else
	// (proxyshift only, at Plan.SwitchSize), or nil.
	Switches *SwitchResult
}

// HeapFigures are a program's Go heap in one run, up to its mode
// switches: HeapInuse sampled every HeapSampleEvery from its metrics, and
// one heap profile taken once its first sync has settled (none during
// it: writing a profile costs the program CPU).
type HeapFigures struct {
	// PeakInuse is the most HeapInuse sampled (the heap the process held:
	// live objects and garbage not yet collected).
	PeakInuse uint64
	// StartupAlloc is every byte the program allocated from exec until
	// its first sync had settled (TotalAlloc then).
	StartupAlloc uint64
	// Profile is the heap profile taken with StartupAlloc, in the run's
	// directory (go tool pprof reads it): its in-use figures are the live
	// heap at the last collection before it, its allocation figures
	// everything allocated until that collection.
	Profile string
	// LiveTop and AllocTop are the functions that hold the most of the
	// profile's in-use bytes and that allocated the most of its bytes
	// (flat, as go tool pprof -top lists them), LiveTotal and AllocTotal
	// the profile's totals.
	LiveTop, AllocTop     []FuncBytes
	LiveTotal, AllocTotal int64
}

// heapTop is how many functions HeapFigures lists from each profile.
const heapTop = 10

// readTops fills the top functions from the saved profile.
func (h *HeapFigures) readTops() error {
	p, err := readProfile(h.Profile)
	if err != nil {
		return err
	}
	if h.LiveTop, h.LiveTotal, err = topFunctions(p, "inuse_space", heapTop); err != nil {
		return err
	}
	h.AllocTop, h.AllocTotal, err = topFunctions(p, "alloc_space", heapTop)
	return err
}

// HeapSampleEvery is how often the benchmark reads a program's heap: a
// first sync at 10k lasts about a second.
const HeapSampleEvery = 250 * time.Millisecond

// Plan says what Run measures.
type Plan struct {
	// Sizes are the Service counts, ascending.
	Sizes []int
	// Modes are the dataplane modes, run for each size up to the mode's
	// MaxSize (no limit when absent or 0).
	Modes   []string
	MaxSize map[string]int
	// Programs run one after the other in each mode.
	Programs []Program
	// Changes is the number of endpoint changes per run.
	Changes int
	// ChangeEvery spaces the starts of the endpoint changes (a change
	// that is not served by then delays the next one): longer than the
	// programs' minSyncPeriod, so each change is synced on its own, and
	// Changes of them span several periodic resyncs.
	ChangeEvery time.Duration
	// ChangeTimeout bounds the wait for each endpoint change to be
	// served (0: 30 s). Under the test VM's emulation kube-proxy's IPVS
	// syncs of 100 Services took 30 to 40 s each, and a change waits
	// for the sync under way, then its own.
	ChangeTimeout time.Duration
	// ChangeBudget, when set, ends a program's endpoint changes once
	// they have taken that long (at least one is measured): in the test
	// VM, where one change of kube-proxy's IPVS mode takes minutes at 1k
	// Services, the report then shows fewer samples for it.
	ChangeBudget time.Duration
	// Connects is the number of connections per first-packet figure.
	Connects int
	// SyncTimeout bounds each first sync.
	SyncTimeout time.Duration
	// Dir receives each run's kubeconfig, configuration and log.
	Dir string
	// Kubeconfig is the administrator's; APIServer its host:port on the
	// root namespace's loopback.
	Kubeconfig, APIServer string
	// Workers is the number of concurrent API writers creating Services.
	Workers int
	// Logf reports progress.
	Logf func(format string, args ...any)
	// ProxyNodes writes the ProxyNode of a program that follows one.
	ProxyNodes *ProxyNodes
	// SwitchSize is the Service count at which the node switches modes
	// (in the run of Switch.Modes[0]); 0 measures no switch.
	SwitchSize int
	Switch     SwitchPlan
}

func (p Plan) changeTimeout() time.Duration {
	if p.ChangeTimeout > 0 {
		return p.ChangeTimeout
	}
	return 30 * time.Second
}

// Run creates the Services size by size and measures every program in
// every mode at each size. It returns what it measured so far with any
// error.
func Run(ctx context.Context, lab *Lab, objs *Objects, plan Plan) ([]Result, error) {
	var results []Result
	for _, n := range plan.Sizes {
		start := time.Now()
		if err := objs.EnsureServices(ctx, n, plan.Workers); err != nil {
			return results, err
		}
		plan.Logf("%d Services with their EndpointSlices in the API server (%s)", n, time.Since(start).Round(time.Millisecond))
		for _, mode := range plan.Modes {
			if m := plan.MaxSize[mode]; m > 0 && n > m {
				continue
			}
			for _, prog := range plan.Programs {
				res, err := measure(ctx, lab, objs, plan, prog, mode, n)
				if err != nil {
					return results, fmt.Errorf("%s, %s mode, %d Services: %w", prog.Name, mode, n, err)
				}
				plan.Logf("%s", res.Summary())
				results = append(results, res)
			}
		}
	}
	return results, nil
}

// AfterWrite holds, per endpoint change, the part of its programming
// latency after the EndpointSlice update call returned: the program's
// watch, its sync and the probe that saw the new endpoint answer (an
// upper bound of the program's part, since the watch event can be on
// its way before the call returns).
func (r Result) AfterWrite() []time.Duration {
	out := make([]time.Duration, min(len(r.Latency), len(r.Write)))
	for i := range out {
		out[i] = r.Latency[i] - r.Write[i]
	}
	return out
}

// Summary is one line describing the result.
func (r Result) Summary() string {
	if r.TimedOut {
		return fmt.Sprintf("%-10s %-8s %5d services: the last Service did not answer within %s", r.Program, r.Mode, r.Services, r.FirstSync)
	}
	return fmt.Sprintf("%-10s %-8s %5d services: first sync %s (metrics %s in %d), change sync %s, programming latency of %d changes over %s: p50 %s p90 %s p99 %s max %s, connect first p50 %s last p50 %s, peak RSS %d MiB",
		r.Program, r.Mode, r.Services, round(r.FirstSync), round(r.FirstSyncMetric), r.FirstSyncs, round(r.ChangeSync),
		len(r.Latency), round(r.ChangeSpan), round(Percentile(r.Latency, 50)), round(Percentile(r.Latency, 90)), round(Percentile(r.Latency, 99)), round(Percentile(r.Latency, 100)),
		round(Percentile(r.ConnectFirst, 50)), round(Percentile(r.ConnectLast, 50)), r.PeakRSS>>20) + failures(r.ConnectFailures)
}

func measure(ctx context.Context, lab *Lab, objs *Objects, plan Plan, prog Program, mode string, n int) (Result, error) {
	res := Result{Program: prog.Name, Mode: mode, Services: n}
	dir := filepath.Join(plan.Dir, fmt.Sprintf("%s-%s-%d", prog.Name, mode, n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	node, err := lab.NewNode(plan.APIServer)
	if err != nil {
		return res, err
	}
	defer node.Close()
	if prog.FollowsProxyNode {
		if err := plan.ProxyNodes.Reset(ctx, mode); err != nil {
			return res, err
		}
	}
	start := time.Now()
	run, err := prog.Start(node, mode, dir, plan.Kubeconfig)
	if err != nil {
		return res, err
	}
	defer run.Stop()
	// The program runs in a memory cgroup of its own, which tells its
	// ruleset's kernel memory at the end; a machine without one measures
	// everything else. Not in IPVS mode: its virtual services are no
	// nftables objects, and what deleting the tables frees would be a
	// part only.
	var cg *memcg
	if mode != "ipvs" {
		cg, err = newMemcg(fmt.Sprintf("%s-%s-%d", prog.Name, mode, n))
		if err == nil {
			defer func(cg *memcg) {
				_ = run.Stop()
				if err := cg.remove(); err != nil {
					plan.Logf("remove the memory cgroup: %v", err)
				}
			}(cg)
			err = cg.add(run.proc.Pid())
		}
		if err != nil {
			plan.Logf("%s %s %d services: the ruleset's kernel memory is not measured: %v", prog.Name, mode, n, err)
			cg = nil
		}
	}
	fail := func(err error) (Result, error) {
		return res, fmt.Errorf("%w (log: %s)", err, run.proc.Log)
	}
	heap := run.Heap()
	hctx, stopHeap := context.WithCancel(ctx)
	defer stopHeap()
	peakHeap := heap.watch(hctx, HeapSampleEvery, "")
	tctx, stopTree := context.WithCancel(ctx)
	defer stopTree()
	pid := run.proc.Pid()
	peakTree := watchPeak(tctx, TreeSampleEvery, func() (int64, error) { return treeRSS(pid) }, nil)
	readRSS := func() (err error) {
		stopTree()
		res.TreeRSS = <-peakTree
		res.PeakRSS, err = run.PeakRSS()
		return err
	}

	// First sync: until the last Service answers.
	if _, err := waitAnswer(ctx, node, run, ServiceAddr(LastOrdinary(n)), netip.Addr{}, plan.SyncTimeout); err != nil {
		if exited, _ := run.Exited(); exited || ctx.Err() != nil || !errors.Is(err, errTimeout) {
			return fail(fmt.Errorf("first sync: %w", err))
		}
		res.FirstSync, res.TimedOut = plan.SyncTimeout, true
		// Its memory so far is a lower bound of its peak.
		if err := readRSS(); err != nil {
			return fail(err)
		}
		return res, nil
	}
	res.FirstSync = time.Since(start)
	// The changes start once the program's metrics show its first sync,
	// say it is ready and stand still: a program still busy starting up
	// (proxyshift verifies a mode before it calls a switch done) is not
	// measured then.
	synced, err := settledSyncs(ctx, run, plan.SyncTimeout)
	if err != nil {
		return fail(err)
	}
	res.FirstSyncMetric, res.FirstSyncs = time.Duration(synced.Sum*float64(time.Second)), synced.Count
	res.Heap.Profile = filepath.Join(dir, "heap-startup.pprof")
	startup, err := heap.stats(ctx)
	if err == nil {
		res.Heap.StartupAlloc = startup.TotalAlloc
		err = heap.save(ctx, "heap", res.Heap.Profile)
	}
	if err == nil {
		err = res.Heap.readTops()
	}
	if err != nil {
		return fail(fmt.Errorf("%s's heap after its first sync: %w", prog.Name, err))
	}
	if res.Ruleset, err = MeasureRuleset(ctx, node.NS.NS(), filepath.Join(dir, "ruleset.nft")); err != nil {
		return fail(err)
	}
	plan.Logf("%s %s %d services: ruleset %s", prog.Name, mode, n, res.Ruleset)

	// Endpoint changes, one at a time, each awaited from outside, and
	// started ChangeEvery apart: a change starts at every phase of the
	// periodic resync, during one and right after one included.
	changesStart := time.Now()
	for j := range plan.Changes {
		if plan.ChangeBudget > 0 && j > 0 && time.Since(changesStart) > plan.ChangeBudget {
			plan.Logf("%s %s %d services: %d of %d endpoint changes within the budget of %s", prog.Name, mode, n, j, plan.Changes, plan.ChangeBudget)
			break
		}
		i := j % ProbeServices
		if wait := time.Until(changesStart.Add(time.Duration(j) * plan.ChangeEvery)); wait > 0 {
			select {
			case <-ctx.Done():
				return fail(ctx.Err())
			case <-time.After(wait):
			}
		}
		ep, sent, err := objs.MoveEndpoint(ctx, i)
		if err != nil {
			return fail(err)
		}
		res.Write = append(res.Write, time.Since(sent))
		if _, err := waitAnswer(ctx, node, run, ServiceAddr(i), ep, plan.changeTimeout()); err != nil {
			return fail(fmt.Errorf("endpoint change %d: %w", j, err))
		}
		res.Latency = append(res.Latency, time.Since(sent))
	}
	res.ChangeSpan = time.Since(changesStart)
	changed, err := settledSyncs(ctx, run, plan.SyncTimeout)
	if err != nil {
		return fail(err)
	}
	delta := changed.Sub(synced)
	res.ChangeSync, res.ChangeSyncs = delta.Mean(), delta.Count

	// First-packet latency: new connections to the first and the last
	// ordinary Service, alternately, so that both meet the same machine.
	var last error
	for range plan.Connects {
		for _, c := range []struct {
			svc int
			out *[]time.Duration
		}{{FirstOrdinary(), &res.ConnectFirst}, {LastOrdinary(n), &res.ConnectLast}} {
			_, connect, err := node.Ask(ctx, ServiceAddr(c.svc), 2*time.Second)
			if err != nil {
				res.ConnectFailures++
				last = err
				continue
			}
			*c.out = append(*c.out, connect)
			time.Sleep(time.Millisecond)
		}
	}
	if len(res.ConnectFirst) == 0 || len(res.ConnectLast) == 0 {
		return fail(fmt.Errorf("no connection to %s or to %s answered: %w", ServiceName(FirstOrdinary()), ServiceName(LastOrdinary(n)), last))
	}
	stopHeap()
	res.Heap.PeakInuse = <-peakHeap
	if err := readRSS(); err != nil {
		return fail(err)
	}
	if prog.FollowsProxyNode && n == plan.SwitchSize && len(plan.Switch.Modes) > 1 && mode == plan.Switch.Modes[0] {
		// A switch that fails is reported with what was measured before
		// it; the run goes on.
		res.Switches, err = measureSwitches(ctx, node, plan.ProxyNodes, plan.Switch, n, plan.Logf)
		if err != nil {
			res.Switches.Err = fmt.Sprintf("%v (log: %s)", err, run.proc.Log)
			plan.Logf("%s", res.Switches.Err)
		}
	}
	if cg != nil && res.Ruleset.Bytes > 0 {
		// The program leaves its rules behind when it stops, as it does
		// on a node. (An iptables mode on the legacy backend lists
		// nothing in nft, and its tables are not deleted here.)
		if err := run.Stop(); err != nil {
			return fail(err)
		}
		if res.RulesetKernel, err = rulesetKernelMemory(ctx, cg, node.NS.NS()); err != nil {
			return fail(fmt.Errorf("the ruleset's kernel memory: %w", err))
		}
		plan.Logf("%s %s %d services: the ruleset's kernel memory %.2f MB", prog.Name, mode, n, mb(int(res.RulesetKernel)))
	}
	return res, nil
}

func failures(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d connections unanswered)", n)
}

// errTimeout marks a wait that ran out of time.
var errTimeout = errors.New("timed out")

// waitAnswer connects to addr again and again (about once a millisecond)
// until a backend answers, and, when want is valid, until the answer comes
// from want. It fails when the program exits or timeout passes.
func waitAnswer(ctx context.Context, node *Node, run *Running, addr netip.AddrPort, want netip.Addr, timeout time.Duration) (netip.Addr, error) {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ep, _, err := node.Ask(ctx, addr, 100*time.Millisecond)
		if err == nil && (!want.IsValid() || ep == want) {
			return ep, nil
		}
		if err == nil {
			err = fmt.Errorf("answered by %s, not yet %s", ep, want)
		}
		last = err
		if exited, exitErr := run.Exited(); exited {
			return netip.Addr{}, fmt.Errorf("%s exited: %v", run.Program.Name, exitErr)
		}
		if time.Now().After(deadline) {
			return netip.Addr{}, fmt.Errorf("%w: %s not served within %s: %w", errTimeout, addr, timeout, last)
		}
		if ctx.Err() != nil {
			return netip.Addr{}, errors.Join(ctx.Err(), last)
		}
		time.Sleep(time.Millisecond)
	}
}

// settledSyncs reads the sync histogram until it shows a sync, the
// program says it is ready, and two reads 300 ms apart agree, so that a
// sync still being recorded is counted; it gives up after timeout.
func settledSyncs(ctx context.Context, run *Running, timeout time.Duration) (Histogram, error) {
	deadline := time.Now().Add(timeout)
	prev, _, err := run.Syncs(ctx)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if exited, exitErr := run.Exited(); exited {
			return Histogram{}, fmt.Errorf("%s exited: %v", run.Program.Name, exitErr)
		}
		time.Sleep(300 * time.Millisecond)
		cur, ready, err2 := run.Syncs(ctx)
		if err2 != nil {
			// A program busy syncing (under the test VM's emulation, at
			// 5k Services) may not answer within the client's timeout:
			// ask again.
			err = err2
			continue
		}
		if err == nil && ready && cur == prev && cur.Count > 0 {
			return cur, nil
		}
		prev, err = cur, nil
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return Histogram{}, fmt.Errorf("%s metrics: %w", run.Program.Name, err)
	}
	return Histogram{}, fmt.Errorf("%s's sync metrics did not settle within %s: %+v", run.Program.Name, timeout, prev)
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
