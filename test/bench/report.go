package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Report is a finished run: its results and the machine they were taken on.
type Report struct {
	Results []Result
	Elapsed time.Duration
	Machine string
	Date    time.Time
	// Flags are each program's command line (and configuration file),
	// listed in the report's header.
	Flags []ProgramFlags
	// Command is what took the measurements ("make bench" unless set).
	Command string
	// Extra are further Markdown sections (each with its own "###"
	// heading) placed after the tables: the operator benchmark's, say.
	Extra []string
}

// ProgramFlags is what a program was started with.
type ProgramFlags struct {
	Program, Flags string
}

// NewReport describes the results with the machine they were taken on.
func NewReport(results []Result, elapsed time.Duration) *Report {
	return &Report{Results: results, Elapsed: elapsed, Machine: machine(), Date: time.Now().UTC()}
}

// machine names the CPU, core count, memory, kernel and load average.
func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	var si unix.Sysinfo_t
	mem := "?"
	if unix.Sysinfo(&si) == nil {
		// The memory the kernel manages, a little less than the machine's
		// (a 2 GiB VM has 1.9).
		mem = fmt.Sprintf("%.1f GiB", float64(uint64(si.Totalram)*uint64(si.Unit))/(1<<30))
	}
	var un unix.Utsname
	kernel := "?"
	if unix.Uname(&un) == nil {
		kernel = unix.ByteSliceToString(un.Release[:])
	}
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return fmt.Sprintf("%s, %d cores, %s, Linux %s, %s; load average at the end %s", cpu, runtime.NumCPU(), mem, kernel, runtime.Version(), load)
}

// row is one line of a mode's table.
type row struct {
	what        string
	kp, ps      string
	ratio       string
	target, met string
}

// lookup finds a result.
func (r *Report) lookup(program, mode string, n int) (Result, bool) {
	for _, res := range r.Results {
		if res.Program == program && res.Mode == mode && res.Services == n {
			return res, true
		}
	}
	return Result{}, false
}

// modes and sizes present in the results, in order of appearance.
func (r *Report) modes() []string { return uniq(r.Results, func(x Result) string { return x.Mode }) }
func (r *Report) sizes() []int    { return uniq(r.Results, func(x Result) int { return x.Services }) }

// sizesOf lists the Service counts measured in mode.
func (r *Report) sizesOf(mode string) []int {
	var rs []Result
	for _, x := range r.Results {
		if x.Mode == mode {
			rs = append(rs, x)
		}
	}
	return uniq(rs, func(x Result) int { return x.Services })
}

func uniq[T comparable](rs []Result, key func(Result) T) []T {
	var out []T
	seen := map[T]bool{}
	for _, x := range rs {
		if k := key(x); !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// latencyPartRows are the rows of one part of the programming latencies
// at n services (what, explained by detail), one per percentile (100:
// the maximum), kube-proxy's figures beside proxyshift's.
func latencyPartRows(what, detail string, n int, kp, ps []time.Duration, percentiles ...float64) []row {
	var out []row
	for _, p := range percentiles {
		label := fmt.Sprintf("of a programming latency, %s (%s) p%.0f, %d services", what, detail, p, n)
		if p == 100 {
			label = fmt.Sprintf("of a programming latency, %s max, %d services", what, n)
		}
		out = append(out, durationRow(label, Percentile(kp, p), Percentile(ps, p), 0, 0))
	}
	return out
}

// durationRow compares one duration figure; ratio is proxyshift over
// kube-proxy; a target is met when the ratio (or, for an absolute
// target, proxyshift's figure) is at most the bound.
func durationRow(what string, kp, ps time.Duration, maxRatio float64, maxAbs time.Duration) row {
	r := row{what: what, kp: fmtDuration(kp), ps: fmtDuration(ps), ratio: "-"}
	if ps == 0 {
		return r // not measured: no ratio, no target
	}
	if kp > 0 {
		ratio := float64(ps) / float64(kp)
		r.ratio = fmt.Sprintf("%.2f", ratio)
		if maxRatio > 0 {
			r.target, r.met = fmt.Sprintf("<= %.1fx kube-proxy", maxRatio), metText(ratio <= maxRatio)
		}
	}
	if maxAbs > 0 {
		r.target, r.met = "<= "+fmtDuration(maxAbs), metText(ps <= maxAbs)
	}
	return r
}

// firstSyncRow compares first syncs, where either may have timed out:
// a timed-out figure is a lower bound ("> 5m0s"), and so is its ratio.
func firstSyncRow(what string, kp, ps Result, maxRatio float64) row {
	r := durationRow(what, kp.FirstSync, ps.FirstSync, maxRatio, 0)
	switch {
	case kp.TimedOut && ps.TimedOut:
		r.kp, r.ps, r.ratio, r.target, r.met = "> "+fmtDuration(kp.FirstSync), "> "+fmtDuration(ps.FirstSync), "-", "", ""
	// One program only was measured, and it gave up: no ratio.
	case kp.TimedOut && ps.FirstSync == 0:
		r.kp, r.ratio, r.target, r.met = "> "+fmtDuration(kp.FirstSync)+" (gave up)", "-", "", ""
	case ps.TimedOut && kp.FirstSync == 0:
		r.ps, r.ratio, r.target, r.met = "> "+fmtDuration(ps.FirstSync)+" (gave up)", "-", "", ""
	case kp.TimedOut:
		bound := float64(ps.FirstSync) / float64(kp.FirstSync)
		r.kp, r.ratio = "> "+fmtDuration(kp.FirstSync)+" (gave up)", fmt.Sprintf("< %.2f", bound)
		if maxRatio > 0 {
			r.met = metText(bound <= maxRatio)
		}
	case ps.TimedOut:
		r.ps, r.ratio = "> "+fmtDuration(ps.FirstSync)+" (gave up)", fmt.Sprintf("> %.2f", float64(ps.FirstSync)/float64(kp.FirstSync))
		if maxRatio > 0 {
			r.met = metText(false)
		}
	}
	return r
}

func metText(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// rows builds a mode's table. The targets are the issue's: nftables full
// sync <= 0.5x kube-proxy's at the largest size, a one-endpoint change <=
// 10 ms, programming latency p99 <= 30 ms and max <= 100 ms there;
// iptables full sync <= 1.0x, a one-endpoint change and programming
// latency p99 <= 0.5x; first packet to the last Service within 10% of the
// first in nftables mode; peak RSS <= 0.5x kube-proxy's at the largest
// nftables size, and the process tree's <= 1.0x at the largest iptables
// size. Other modes (ipvs, measured in the test VM) have
// no targets: their rows compare.
func (r *Report) rows(mode string) []row {
	sizes := r.sizesOf(mode)
	largest := sizes[len(sizes)-1]
	nft, ipt := mode == "nftables", mode == "iptables"
	var out []row
	// A program that was not measured (-programs, or PROXYSHIFT_VMBENCH_PROGRAMS,
	// names one) shows "-".
	lookup := func(program string, n int) (Result, bool) {
		res, ok := r.lookup(program, mode, n)
		if !ok {
			res = Result{Program: program, Mode: mode, Services: n}
		}
		return res, ok
	}
	each := func(f func(n int, kp, ps Result, atLargest bool)) {
		for _, n := range sizes {
			kp, _ := lookup("kube-proxy", n)
			ps, _ := lookup("proxyshift", n)
			f(n, kp, ps, n == largest)
		}
	}
	each(func(n int, kp, ps Result, atLargest bool) {
		ratio := 0.0
		switch {
		case nft && atLargest:
			ratio = 0.5
		case ipt:
			ratio = 1.0
		}
		out = append(out, firstSyncRow(fmt.Sprintf("first full sync, %d services (until the last answers)", n), kp, ps, ratio))
	})
	// Whatever follows needs proxyshift's first sync to have finished; a
	// kube-proxy that did not finish shows "-" (no figure) there.
	each = func(f func(n int, kp, ps Result, atLargest bool)) {
		for _, n := range sizes {
			kp, _ := lookup("kube-proxy", n)
			ps, measured := lookup("proxyshift", n)
			if measured && !ps.TimedOut {
				if kp.TimedOut {
					kp = Result{Program: kp.Program, Mode: mode, Services: n}
				}
				f(n, kp, ps, n == largest)
			}
		}
	}
	each(func(n int, kp, ps Result, _ bool) {
		out = append(out, durationRow(fmt.Sprintf("first full sync, %d services (own metrics; syncs: %d / %d)", n, kp.FirstSyncs, ps.FirstSyncs), kp.FirstSyncMetric, ps.FirstSyncMetric, 0, 0))
	})
	each(func(n int, kp, ps Result, atLargest bool) {
		rw := durationRow(fmt.Sprintf("one-endpoint change sync, %d services (own metrics, mean of the syncs during the changes, periodic ones included)", n), kp.ChangeSync, ps.ChangeSync, 0, 0)
		switch {
		case nft && atLargest:
			rw = durationRow(rw.what, kp.ChangeSync, ps.ChangeSync, 0, 10*time.Millisecond)
		case ipt:
			rw = durationRow(rw.what, kp.ChangeSync, ps.ChangeSync, 0.5, 0)
		}
		out = append(out, rw)
	})
	each(func(n int, kp, ps Result, atLargest bool) {
		for _, p := range []float64{50, 90, 99, 100} {
			what := fmt.Sprintf("programming latency p%.0f, %d services", p, n)
			switch p {
			case 50:
				what += fmt.Sprintf(" (%d / %d changes over %s / %s)", len(kp.Latency), len(ps.Latency), fmtDuration(kp.ChangeSpan), fmtDuration(ps.ChangeSpan))
			case 100:
				what = fmt.Sprintf("programming latency max, %d services", n)
			}
			var ratio float64
			var abs time.Duration
			switch {
			case nft && atLargest && p == 99:
				abs = 30 * time.Millisecond
			case nft && atLargest && p == 100:
				abs = 100 * time.Millisecond
			case ipt && p == 99:
				ratio = 0.5
			}
			out = append(out, durationRow(what, Percentile(kp.Latency, p), Percentile(ps.Latency, p), ratio, abs))
		}
		out = append(out, latencyPartRows("the EndpointSlice update call", "the API server's write, etcd's fsync included", n, kp.Write, ps.Write, 99, 100)...)
		out = append(out, latencyPartRows("the part after the update call returned", "the program's watch and sync, the probe", n, kp.AfterWrite(), ps.AfterWrite(), 50, 99, 100)...)
	})
	for _, n := range sizes {
		// A kube-proxy whose first sync gave up had used at least what
		// it used until then.
		kp, _ := lookup("kube-proxy", n)
		ps, measured := lookup("proxyshift", n)
		if !measured || ps.TimedOut {
			continue
		}
		var own, tree float64
		switch {
		case nft && n == largest:
			own = 0.5
		case ipt && n == largest:
			tree = 1.0
		}
		out = append(out,
			rssRow(fmt.Sprintf("peak RSS, %d services", n), kp.PeakRSS, ps.PeakRSS, kp.TimedOut, own),
			rssRow(fmt.Sprintf("peak RSS of the process tree (the program and the commands it runs; sampled every %s), %d services", TreeSampleEvery, n), kp.TreeRSS, ps.TreeRSS, kp.TimedOut, tree))
	}
	each(func(n int, kp, ps Result, _ bool) {
		out = append(out,
			bytesRow(fmt.Sprintf("peak Go heap in use (sampled every %s), %d services", HeapSampleEvery, n), int64(kp.Heap.PeakInuse), int64(ps.Heap.PeakInuse)),
			bytesRow(fmt.Sprintf("Go heap allocated from exec until the first sync settled, %d services", n), int64(kp.Heap.StartupAlloc), int64(ps.Heap.StartupAlloc)))
	})
	each(func(n int, kp, ps Result, atLargest bool) {
		rw := row{what: fmt.Sprintf("ruleset size (`nft list ruleset`), %d services", n), kp: "-", ps: fmtMB(ps.Ruleset.Bytes), ratio: "-"}
		if kp.Ruleset.Bytes > 0 {
			ratio := float64(ps.Ruleset.Bytes) / float64(kp.Ruleset.Bytes)
			rw.kp, rw.ratio = fmtMB(kp.Ruleset.Bytes), fmt.Sprintf("%.2f", ratio)
			if nft && atLargest {
				rw.target, rw.met = "<= 1.0x kube-proxy", metText(ratio <= 1)
			}
		}
		out = append(out, rw)
	})
	each(func(n int, kp, ps Result, _ bool) {
		if kp.RulesetKernel == 0 && ps.RulesetKernel == 0 {
			return // IPVS mode, or a machine that cannot tell
		}
		out = append(out, sizeRow(fmt.Sprintf("the ruleset's kernel memory (what deleting its tables frees in the program's memory cgroup), %d services", n),
			kp.RulesetKernel, ps.RulesetKernel, func(b int64) string { return fmtMB(int(b)) }))
	})
	each(func(n int, kp, ps Result, atLargest bool) {
		if !atLargest {
			return
		}
		for _, p := range []float64{50, 99} {
			out = append(out,
				durationRow(fmt.Sprintf("first-packet (TCP connect) p%.0f, first service of %d", p, n), Percentile(kp.ConnectFirst, p), Percentile(ps.ConnectFirst, p), 0, 0),
				durationRow(fmt.Sprintf("first-packet (TCP connect) p%.0f, last service of %d", p, n), Percentile(kp.ConnectLast, p), Percentile(ps.ConnectLast, p), 0, 0))
		}
		// kube-proxy made no connection when its first sync gave up.
		measured := len(kp.ConnectFirst)+len(kp.ConnectLast)+kp.ConnectFailures > 0
		orNone := func(s string) string {
			if !measured {
				return "-"
			}
			return s
		}
		out = append(out, row{what: fmt.Sprintf("first-packet connections unanswered within 2 s (of %d)", len(ps.ConnectFirst)+len(ps.ConnectLast)+ps.ConnectFailures),
			kp: orNone(fmt.Sprint(kp.ConnectFailures)), ps: fmt.Sprint(ps.ConnectFailures), ratio: "-"})
		spread := row{what: fmt.Sprintf("first-packet p50, last / first service of %d", n),
			kp: orNone(fmt.Sprintf("%.2f", lastOverFirst(kp))), ps: fmt.Sprintf("%.2f", lastOverFirst(ps)), ratio: "-"}
		if nft {
			spread.target, spread.met = "proxyshift <= 1.10", metText(lastOverFirst(ps) <= 1.10)
		}
		out = append(out, spread)
	})
	return out
}

// bytesRow compares two sizes in bytes, in MiB; a program not measured (0)
// shows "-".
func bytesRow(what string, kp, ps int64) row { return sizeRow(what, kp, ps, fmtMiB) }

// sizeRow compares two sizes in bytes, written by format; 0 is no figure.
func sizeRow(what string, kp, ps int64, format func(int64) string) row {
	rw := row{what: what, kp: "-", ps: "-", ratio: "-"}
	if kp > 0 {
		rw.kp = format(kp)
	}
	if ps > 0 {
		rw.ps = format(ps)
	}
	if kp > 0 && ps > 0 {
		rw.ratio = fmt.Sprintf("%.2f", float64(ps)/float64(kp))
	}
	return rw
}

// rssRow compares two peak resident sets in bytes, kube-proxy's a lower
// bound when its first sync gave up (and so the ratio an upper one); a
// target is met when the ratio is at most maxRatio (0: no target).
func rssRow(what string, kp, ps int64, kpGaveUp bool, maxRatio float64) row {
	rw := bytesRow(what, kp, ps)
	if kp <= 0 || ps <= 0 {
		return rw
	}
	ratio := float64(ps) / float64(kp)
	if kpGaveUp {
		rw.kp = ">= " + rw.kp + " (gave up)"
		rw.ratio = fmt.Sprintf("<= %.2f", ratio)
	}
	if maxRatio > 0 {
		rw.target, rw.met = fmt.Sprintf("<= %.1fx kube-proxy", maxRatio), metText(ratio <= maxRatio)
	}
	return rw
}

func lastOverFirst(r Result) float64 {
	first := Percentile(r.ConnectFirst, 50)
	if first == 0 {
		return 0
	}
	return float64(Percentile(r.ConnectLast, 50)) / float64(first)
}

// Markdown renders the report: how it was taken, then a table per mode.
func (r *Report) Markdown() string {
	var b bytes.Buffer
	command := r.Command
	if command == "" {
		command = "make bench"
	}
	fmt.Fprintf(&b, "Measured on %s by `%s` (%s wall in all): %s.\n", r.Date.Format("2006-01-02 15:04 UTC"), command, r.Elapsed.Round(time.Second), r.Machine)
	if len(r.Flags) > 0 {
		fmt.Fprintln(&b, "\nEvery flag each program was started with (`<mode>` is the mode measured; nothing else is set, so every other setting is the program's default):")
		for _, f := range r.Flags {
			fmt.Fprintf(&b, "\n%s:\n\n```\n%s\n```\n", f.Program, f.Flags)
		}
	}
	for _, mode := range r.modes() {
		fmt.Fprintf(&b, "\n### %s mode\n\n", mode)
		fmt.Fprintln(&b, "| | kube-proxy | proxyshift | ratio | target |")
		fmt.Fprintln(&b, "| --- | --- | --- | --- | --- |")
		for _, rw := range r.rows(mode) {
			target := rw.target
			if rw.met != "" {
				target += ": " + rw.met
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", rw.what, rw.kp, rw.ps, rw.ratio, target)
		}
	}
	for _, mode := range r.modes() {
		sizes := r.sizesOf(mode)
		if ps, ok := r.lookup("proxyshift", mode, sizes[len(sizes)-1]); ok && len(ps.Heap.LiveTop) > 0 {
			b.WriteString(heapMarkdown(ps))
		}
	}
	for _, res := range r.Results {
		if res.Switches != nil {
			b.WriteString(switchMarkdown(res.Switches))
		}
	}
	for _, x := range r.Extra {
		b.WriteString("\n" + strings.TrimRight(x, "\n") + "\n")
	}
	return b.String()
}

// heapMarkdown is the section on where a run's Go heap went: the
// functions holding the most of it and those that allocated the most,
// once the first sync had settled.
func heapMarkdown(r Result) string {
	var b strings.Builder
	h := r.Heap
	fmt.Fprintf(&b, "\n### where %s's Go heap goes, %s mode, %d services\n\n", r.Program, r.Mode, r.Services)
	fmt.Fprintf(&b, "From its heap profile once the first sync had settled (`-keep` keeps it: %s in the run's directory), flat bytes by function as `go tool pprof -top` lists them. Live: the heap at the last collection before the profile, %s in it. Allocated: everything allocated from exec until that collection, %s in it, of %s the runtime counted until the profile. The heap in use peaked at %s (sampled every %s from its metrics).\n\n",
		filepath.Base(h.Profile), fmtMiB(h.LiveTotal), fmtMiB(h.AllocTotal), fmtMiB(int64(h.StartupAlloc)), fmtMiB(int64(h.PeakInuse)), HeapSampleEvery)
	fmt.Fprintln(&b, "| live | | allocated | |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- |")
	for i := range max(len(h.LiveTop), len(h.AllocTop)) {
		cell := func(top []FuncBytes) string {
			if i >= len(top) {
				return "| |"
			}
			return fmt.Sprintf("`%s` | %s |", top[i].Func, fmtMB(int(top[i].Bytes)))
		}
		fmt.Fprintf(&b, "| %s %s\n", cell(h.LiveTop), cell(h.AllocTop))
	}
	return b.String()
}

// SwitchTarget is the bound on one node's mode switch at 10k
// Services (Preparing -> Active).
const SwitchTarget = 3 * time.Second

// switchMarkdown is the mode-switch section: per direction, the time
// from the spec write and from Preparing to Active (p50 and max, with
// the count), the time spent in each phase (mean), and the prober's new
// connections and failures during all of the switches.
func switchMarkdown(s *SwitchResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### mode switch, one node, %d services\n\n", s.Services)
	fmt.Fprintln(&b, "The agent runs in the first mode; the benchmark writes the ProxyNode spec (desiredMode, a new configRef generation) as the operator would and watches its status until the agent reports Active in the new mode for that generation. Meanwhile a prober in the node namespace opens a new TCP connection every 5 ms through the service rules, round robin to three Services (the first, a middle and the last ordinary one), each given "+fmtDuration(ProbeTimeout)+" to connect and answer.")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| switch | switches | spec written -> Active p50 | max | Preparing -> Active p50 | max | time in each phase (mean) | target |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, d := range directions(s.Switches) {
		took, prep := s.Took(d[0], d[1], false), s.Took(d[0], d[1], true)
		fmt.Fprintf(&b, "| %s -> %s | %d | %s | %s | %s | %s | %s | Preparing -> Active <= %s: %s |\n", d[0], d[1], len(took),
			fmtDuration(Percentile(took, 50)), fmtDuration(Percentile(took, 100)),
			fmtDuration(Percentile(prep, 50)), fmtDuration(Percentile(prep, 100)),
			phaseMeans(s.Switches, d[0], d[1]), fmtDuration(SwitchTarget), metText(Percentile(prep, 100) <= SwitchTarget))
	}
	fmt.Fprintf(&b, "\nNew connections during the switches: %d opened, %d failed (target 0: %s).\n", s.Connects, s.Failures, metText(s.Failures == 0 && s.Connects > 0))
	for _, f := range s.FailureSample {
		fmt.Fprintf(&b, "- failed: %s\n", f)
	}
	if s.Err != "" {
		fmt.Fprintf(&b, "\nThe switches stopped early: %s\n", s.Err)
	}
	return b.String()
}

// directions lists the (from, to) pairs of the switches, in order of
// appearance.
func directions(sws []Switch) [][2]string {
	var out [][2]string
	for _, sw := range sws {
		d := [2]string{sw.From, sw.To}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// phaseMeans is the mean time the switches from -> to spent in each
// phase the status showed before Active ("Preparing 1.2 s, ..."),
// counting the first phase from the spec write.
func phaseMeans(sws []Switch, from, to string) string {
	var order []v1alpha1.NodePhase
	sum := map[v1alpha1.NodePhase]time.Duration{}
	count := 0
	for _, sw := range sws {
		if sw.From != from || sw.To != to {
			continue
		}
		count++
		var prev time.Duration
		var prevPhase v1alpha1.NodePhase = "before the first phase"
		for _, p := range append(slices.Clone(sw.Phases), PhaseAt{Phase: v1alpha1.NodeActive, At: sw.Took}) {
			if !slices.Contains(order, prevPhase) {
				order = append(order, prevPhase)
			}
			sum[prevPhase] += p.At - prev
			prev, prevPhase = p.At, p.Phase
			if p.Phase == v1alpha1.NodeActive {
				break
			}
		}
	}
	var parts []string
	for _, ph := range order {
		parts = append(parts, fmt.Sprintf("%s %s", ph, fmtDuration(sum[ph]/time.Duration(count))))
	}
	return strings.Join(parts, ", ")
}

// Section markers in the Markdown file WriteInto updates.
const (
	beginMarker = "<!-- make bench: begin -->"
	endMarker   = "<!-- make bench: end -->"
)

// ChartName is the first chart's file name (first full sync), next to
// the Markdown file; the others are named in Charts.
const ChartName = "benchmarks-kube-proxy.png"

// WriteInto replaces the part of the Markdown file at path between the
// markers (appending them when missing) with the report and links to
// the charts, which it renders next to the file.
func (r *Report) WriteInto(path string) error {
	charts, err := r.Charts(filepath.Dir(path))
	if err != nil {
		return err
	}
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	section := beginMarker + "\n" + r.Markdown() + "\n### charts\n"
	for _, c := range charts {
		section += "\n![" + c.Title + "](" + c.File + ")\n"
	}
	section += endMarker
	doc := string(old)
	i, j := strings.Index(doc, beginMarker), strings.Index(doc, endMarker)
	if i >= 0 && j > i {
		doc = doc[:i] + section + doc[j+len(endMarker):]
	} else {
		doc = strings.TrimRight(doc, "\n") + "\n\n" + section + "\n"
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

func fmtDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%d µs", d.Microseconds())
}

func fmtMB(b int) string { return fmt.Sprintf("%.2f MB", float64(b)/1e6) }

func fmtMiB(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
