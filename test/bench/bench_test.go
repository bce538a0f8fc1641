package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {1, time.Millisecond}} {
		if got := Percentile(ds, c.p); got != c.want {
			t.Errorf("p%v = %s, want %s", c.p, got, c.want)
		}
	}
	if got := Percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("p99 of one sample = %s, want it", got)
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %s, want 0", got)
	}
	if ds[0] != 100*time.Millisecond {
		t.Error("Percentile sorted its argument in place")
	}
}

func TestHistogramSumsLabels(t *testing.T) {
	text := `# HELP kubeproxy_sync_proxy_rules_duration_seconds SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.75
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 1
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.25
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1
# TYPE other_total counter
other_total 5
`
	h, err := histogram(strings.NewReader(text), "kubeproxy_sync_proxy_rules_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != 4 || h.Sum != 1.0 {
		t.Fatalf("got %+v, want count 4 sum 1.0", h)
	}
	if m := h.Sub(Histogram{Count: 2, Sum: 0.5}).Mean(); m != 250*time.Millisecond {
		t.Errorf("mean of the last two = %s, want 250ms", m)
	}
	if _, err := histogram(strings.NewReader(text), "other_total"); err == nil {
		t.Error("a counter read as a histogram")
	}
	if h, err := histogram(strings.NewReader(text), "missing"); err != nil || h.Count != 0 {
		t.Errorf("missing histogram = %+v, %v; want empty, no error (no sync yet)", h, err)
	}
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func sampleResults() []Result {
	rs := plainResults()
	heap := func(inuse, startup uint64) HeapFigures {
		return HeapFigures{PeakInuse: inuse << 20, StartupAlloc: startup << 20, Profile: "/run/heap-startup.pprof"}
	}
	rs[2].Heap, rs[3].Heap = heap(200, 1000), heap(80, 250)
	rs[3].Heap.LiveTop = []FuncBytes{{"k8s.io/api/discovery/v1.(*Endpoint).Unmarshal", 30 << 20}, {"runtime.malg", 1 << 20}}
	rs[3].Heap.AllocTop = []FuncBytes{{"github.com/proxyshift/proxyshift/nodeagent/model.(*builder).endpoints", 100 << 20}}
	rs[3].Heap.LiveTotal, rs[3].Heap.AllocTotal = 60<<20, 240<<20
	rs[2].PeakRSS, rs[3].PeakRSS = 300<<20, 140<<20
	rs[4].TreeRSS, rs[5].TreeRSS = 500<<20, 250<<20
	rs[2].RulesetKernel, rs[3].RulesetKernel = 24_000_000, 36_000_000
	return rs
}

func plainResults() []Result {
	res := func(prog, mode string, n int, first, change, p99 time.Duration, connFirst, connLast time.Duration) Result {
		return Result{Program: prog, Mode: mode, Services: n, FirstSync: first, FirstSyncMetric: first / 2, FirstSyncs: 1,
			ChangeSync: change, ChangeSyncs: 50, Latency: []time.Duration{p99 / 2, p99}, Write: []time.Duration{p99 / 10, p99 / 5},
			ConnectFirst: []time.Duration{connFirst}, ConnectLast: []time.Duration{connLast}, PeakRSS: 100 << 20}
	}
	return []Result{
		res("kube-proxy", "nftables", 1000, ms(2000), ms(100), ms(150), ms(1), ms(1)),
		res("proxyshift", "nftables", 1000, ms(700), ms(3), ms(20), ms(1), ms(1)),
		res("kube-proxy", "nftables", 10000, ms(10000), ms(400), ms(500), ms(1), ms(1)),
		res("proxyshift", "nftables", 10000, ms(6000), ms(8), ms(150), ms(1), ms(2)),
		res("kube-proxy", "iptables", 10000, ms(60000), ms(1000), ms(1500), ms(1), ms(3)),
		res("proxyshift", "iptables", 10000, ms(50000), ms(400), ms(600), ms(1), ms(1)),
	}
}

// TestReportTargets checks the rows that carry the targets: a
// ratio target, an absolute one, and the first-packet spread.
func TestReportTargets(t *testing.T) {
	r := &Report{Results: sampleResults()}
	md := r.Markdown()
	for _, want := range []string{
		"| first full sync, 10000 services (until the last answers) | 10.00 s | 6.00 s | 0.60 | <= 0.5x kube-proxy: **missed** |",
		"| one-endpoint change sync, 10000 services (own metrics, mean of the syncs during the changes, periodic ones included) | 400.0 ms | 8.0 ms | 0.02 | <= 10.0 ms: met |",
		"| programming latency p50, 10000 services (2 / 2 changes over - / -) | 250.0 ms | 75.0 ms | 0.30 |  |",
		"| programming latency p99, 10000 services | 500.0 ms | 150.0 ms | 0.30 | <= 30.0 ms: **missed** |",
		"| programming latency max, 10000 services | 500.0 ms | 150.0 ms | 0.30 | <= 100.0 ms: **missed** |",
		"| of a programming latency, the EndpointSlice update call (the API server's write, etcd's fsync included) p99, 10000 services | 100.0 ms | 30.0 ms | 0.30 |  |",
		"| of a programming latency, the part after the update call returned max, 10000 services | 400.0 ms | 120.0 ms | 0.30 |  |",
		"| programming latency p99, 10000 services | 1.50 s | 600.0 ms | 0.40 | <= 0.5x kube-proxy: met |",
		"| first-packet p50, last / first service of 10000 | 1.00 | 2.00 | - | proxyshift <= 1.10: **missed** |",
		"| first full sync, 10000 services (until the last answers) | 60.00 s | 50.00 s | 0.83 | <= 1.0x kube-proxy: met |",
		"| peak RSS, 10000 services | 300 MiB | 140 MiB | 0.47 | <= 0.5x kube-proxy: met |",
		"| peak RSS of the process tree (the program and the commands it runs; sampled every 100ms), 10000 services | 500 MiB | 250 MiB | 0.50 | <= 1.0x kube-proxy: met |",
		"| one-endpoint change sync, 10000 services (own metrics, mean of the syncs during the changes, periodic ones included) | 1.00 s | 400.0 ms | 0.40 | <= 0.5x kube-proxy: met |",
		"### nftables mode", "### iptables mode",
		"| peak Go heap in use (sampled every 250ms), 10000 services | 200 MiB | 80 MiB | 0.40 |  |",
		"| the ruleset's kernel memory (what deleting its tables frees in the program's memory cgroup), 10000 services | 24.00 MB | 36.00 MB | 1.50 |  |",
		"| Go heap allocated from exec until the first sync settled, 10000 services | 1000 MiB | 250 MiB | 0.25 |  |",
		"### where proxyshift's Go heap goes, nftables mode, 10000 services",
		"| `k8s.io/api/discovery/v1.(*Endpoint).Unmarshal` | 31.46 MB | `github.com/proxyshift/proxyshift/nodeagent/model.(*builder).endpoints` | 104.86 MB |",
		"| `runtime.malg` | 1.05 MB | | |",
		"Live: the heap at the last collection before the profile, 60 MiB in it. Allocated: everything allocated from exec until that collection, 240 MiB in it, of 250 MiB the runtime counted until the profile. The heap in use peaked at 80 MiB (sampled every 250ms from its metrics).",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "kernel memory (what deleting its tables frees in the program's memory cgroup), 1000 services") {
		t.Errorf("a kernel memory row for a size where neither program has the figure:\n%s", md)
	}
	// A first sync that timed out is a lower bound, and the rows that
	// need it are left out.
	timedOut := append(sampleResults(), Result{Program: "kube-proxy", Mode: "iptables", Services: 20000, FirstSync: 5 * time.Minute, TimedOut: true, TreeRSS: 600 << 20},
		Result{Program: "proxyshift", Mode: "iptables", Services: 20000, FirstSync: time.Minute, ConnectFirst: []time.Duration{1}, ConnectLast: []time.Duration{1}, TreeRSS: 300 << 20})
	md2 := (&Report{Results: timedOut}).Markdown()
	if want := "| first full sync, 20000 services (until the last answers) | > 300.00 s (gave up) | 60.00 s | < 0.20 | <= 1.0x kube-proxy: met |"; !strings.Contains(md2, want) {
		t.Errorf("report lacks %q:\n%s", want, md2)
	}
	if want := "| one-endpoint change sync, 20000 services (own metrics, mean of the syncs during the changes, periodic ones included) | - | - | - |  |"; !strings.Contains(md2, want) {
		t.Errorf("after kube-proxy timed out, proxyshift's rows show with no kube-proxy figure; lacks %q:\n%s", want, md2)
	}
	for _, want := range []string{
		"| peak RSS, 20000 services | - | - | - |  |",
		// What kube-proxy held until it gave up bounds its peak from below.
		"| peak RSS of the process tree (the program and the commands it runs; sampled every 100ms), 20000 services | >= 600 MiB (gave up) | 300 MiB | <= 0.50 | <= 1.0x kube-proxy: met |",
		"| first-packet connections unanswered within 2 s (of 2) | - | 0 | - |  |",
		"| first-packet p50, last / first service of 20000 | - | 1.00 | - |  |",
	} {
		if !strings.Contains(md2, want) {
			t.Errorf("lacks %q:\n%s", want, md2)
		}
	}
	// The 1k nftables full sync has no target (the target is at the
	// largest size only).
	if !strings.Contains(md, "| first full sync, 1000 services (until the last answers) | 2.00 s | 700.0 ms | 0.35 |  |") {
		t.Errorf("1k full sync row carries a target:\n%s", md)
	}
}

// TestReportIPVSHasNoTargets checks that the IPVS rows (test/vmbench,
// measured under emulation) carry no target, iptables' included, and that
// the header names the command that measured them.
func TestReportIPVSHasNoTargets(t *testing.T) {
	var results []Result
	for _, r := range sampleResults() {
		if r.Mode == "iptables" {
			r.Mode = "ipvs"
			results = append(results, r)
		}
	}
	md := (&Report{Results: results, Command: "make bench-vm"}).Markdown()
	if !strings.Contains(md, "by `make bench-vm`") || !strings.Contains(md, "### ipvs mode") {
		t.Errorf("report lacks its command or its mode:\n%s", md)
	}
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| ") && !strings.HasSuffix(line, "|  |") && !strings.HasPrefix(line, "| |") && !strings.HasPrefix(line, "| ---") {
			t.Errorf("IPVS row carries a target: %s", line)
		}
	}
	if !strings.Contains(md, "| programming latency p99, 10000 services | 1.50 s | 600.0 ms | 0.40 |  |") {
		t.Errorf("report lacks the IPVS latency row:\n%s", md)
	}
}

// TestWriteIntoReplacesItsSection checks that a second write replaces the
// first one's section and leaves the rest of the file alone, and that the
// chart is written.
func TestWriteIntoReplacesItsSection(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "benchmarks.md")
	if err := os.WriteFile(path, []byte("# Benchmarks\n\nintro\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &Report{Results: sampleResults(), Machine: "test machine", Date: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	for range 2 {
		if err := r.WriteInto(path); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.HasPrefix(doc, "# Benchmarks\n\nintro\n") || strings.Count(doc, beginMarker) != 1 || strings.Count(doc, "### nftables mode") != 1 {
		t.Errorf("file after two writes:\n%s", doc)
	}
	st, err := os.Stat(filepath.Join(dir, ChartName))
	if err != nil || st.Size() < 1000 {
		t.Errorf("chart: %v, %v", st, err)
	}
}

// TestReportOneProgram checks a run that measured one program only
// (-programs proxyshift, or kube-proxy): its figures are in the table,
// the other column shows "-", and no ratio or target is made up.
func TestReportOneProgram(t *testing.T) {
	var agentOnly, kubeProxyOnly []Result
	for _, r := range sampleResults() {
		if r.Mode != "iptables" {
			continue
		}
		r.Mode = "ipvs"
		if r.Program == "proxyshift" {
			agentOnly = append(agentOnly, r)
		} else {
			kubeProxyOnly = append(kubeProxyOnly, r)
		}
	}
	md := (&Report{Results: agentOnly}).Markdown()
	for _, want := range []string{
		"| first full sync, 10000 services (until the last answers) | - | 50.00 s | - |  |",
		"| programming latency p99, 10000 services | - | 600.0 ms | - |  |",
		"| peak RSS, 10000 services | - | ",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("agent-only report lacks %q:\n%s", want, md)
		}
	}
	kubeProxyOnly = append(kubeProxyOnly, Result{Program: "kube-proxy", Mode: "ipvs", Services: 20000, FirstSync: 20 * time.Minute, TimedOut: true})
	md = (&Report{Results: kubeProxyOnly}).Markdown()
	for _, want := range []string{
		"| first full sync, 10000 services (until the last answers) | 60.00 s | - | - |  |",
		"| first full sync, 20000 services (until the last answers) | > 1200.00 s (gave up) | - | - |  |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("kube-proxy-only report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "programming latency") {
		t.Errorf("kube-proxy-only report has rows that need the agent's figures:\n%s", md)
	}
}

// AfterWrite pairs each change's latency with its own update call, and a
// change whose answer never came (a Write without a Latency) is left out.
func TestAfterWrite(t *testing.T) {
	r := Result{Latency: []time.Duration{ms(10), ms(30)}, Write: []time.Duration{ms(4), ms(25), ms(7)}}
	if got, want := r.AfterWrite(), []time.Duration{ms(6), ms(5)}; !slices.Equal(got, want) {
		t.Errorf("AfterWrite() = %v, want %v", got, want)
	}
}
