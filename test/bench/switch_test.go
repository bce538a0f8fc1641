package bench

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func sampleSwitches() *SwitchResult {
	sw := func(from, to string, prep, took time.Duration) Switch {
		return Switch{From: from, To: to, Took: took, Phases: []PhaseAt{
			{v1alpha1.NodePreparing, took - prep}, {v1alpha1.NodeProgramming, took - prep + prep/2}, {v1alpha1.NodeActive, took}}}
	}
	return &SwitchResult{Services: 10000, Connects: 900, Failures: 1, FailureSample: []string{"198.19.1.60:80: i/o timeout"},
		Switches: []Switch{
			sw("nftables", "iptables", ms(4000), ms(4200)),
			sw("iptables", "nftables", ms(1000), ms(1100)),
			sw("nftables", "iptables", ms(2000), ms(2100)),
			sw("iptables", "nftables", ms(2000), ms(2300)),
		}}
}

// TestSwitchReport checks the mode-switch section: p50 and max per
// direction from the spec write and from Preparing, the target on the
// slowest Preparing -> Active, the phase means and the prober's counts.
func TestSwitchReport(t *testing.T) {
	r := &Report{Results: append(sampleResults(), Result{Program: "proxyshift", Mode: "nftables", Services: 10000, Switches: sampleSwitches()})}
	md := r.Markdown()
	for _, want := range []string{
		"### mode switch, one node, 10000 services",
		"| nftables -> iptables | 2 | 2.10 s | 4.20 s | 2.00 s | 4.00 s | before the first phase 150.0 ms, Preparing 1.50 s, Programming 1.50 s | Preparing -> Active <= 3.00 s: **missed** |",
		"| iptables -> nftables | 2 | 1.10 s | 2.30 s | 1.00 s | 2.00 s | before the first phase 200.0 ms, Preparing 750.0 ms, Programming 750.0 ms | Preparing -> Active <= 3.00 s: met |",
		"New connections during the switches: 900 opened, 1 failed (target 0: **missed**).",
		"- failed: 198.19.1.60:80: i/o timeout",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// TestReportListsFlags checks that the header lists every flag each
// program is started with, the agent's being only what the lab needs
// (no default turned off: no sync periods, --proxynode left on).
func TestReportListsFlags(t *testing.T) {
	progs := []Program{KubeProxy("/kp"), Proxyshift("/agent")}
	r := &Report{Results: sampleResults()}
	for _, p := range progs {
		r.Flags = append(r.Flags, ProgramFlags{Program: p.Name, Flags: p.Flags("<mode>")})
	}
	md := r.Markdown()
	for _, want := range []string{
		"proxyshift:\n\n```\n--kubeconfig <dir>/kubeconfig --node-name bench-node --mode <mode> --cluster-cidr 198.18.128.0/17 -v=1 --profiling\n```",
		"kube-proxy:\n\n```\n--config <dir>/kube-proxy.yaml --v=1\napiVersion: kubeproxy.config.k8s.io/v1alpha1",
		"mode: <mode>",
		"enableProfiling: true",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	for _, banned := range []string{"sync-period", "syncPeriod", "proxynode"} {
		if strings.Contains(md, banned) {
			t.Errorf("a program is started with %q:\n%s", banned, md)
		}
	}
}

// TestCDF checks the step points of the empirical distribution.
func TestCDF(t *testing.T) {
	pts := cdf([]time.Duration{ms(30), ms(10), ms(20), ms(40)})
	if len(pts) != 8 {
		t.Fatalf("%d points, want 8", len(pts))
	}
	if pts[0].X != 10 || pts[0].Y != 0 || pts[1].Y != 0.25 || pts[7].X != 40 || pts[7].Y != 1 {
		t.Errorf("cdf = %v", pts)
	}
}

// TestChartsWritten checks that WriteInto draws the size charts and one
// latency CDF per mode and size, and links each from the section.
func TestChartsWritten(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "benchmarks.md")
	if err := os.WriteFile(path, []byte("# Benchmarks\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &Report{Results: sampleResults(), Date: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	if err := r.WriteInto(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ChartName, "benchmarks-rss.png", "benchmarks-latency-nftables-1000.png", "benchmarks-latency-nftables-10000.png", "benchmarks-latency-iptables-10000.png"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Size() < 1000 {
			t.Errorf("chart %s: %v, %v", f, st, err)
		}
		if !strings.Contains(string(b), "]("+f+")") {
			t.Errorf("%s not linked:\n%s", f, b)
		}
	}
}

// TestProberRecordCounts: a refused connection is a failure and a
// refusal, a timed-out one a failure only, an answer after a connect of
// a second or more a resend and no failure; the sample keeps the first
// five failures.
func TestProberRecordCounts(t *testing.T) {
	p := &prober{}
	tg := netip.MustParseAddrPort("198.19.1.0:80")
	now := time.Now()
	refused := &net.OpError{Op: "dial", Net: "tcp4", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	p.record(tg, now, time.Millisecond, refused)
	p.record(tg, now, time.Second, context.DeadlineExceeded)
	p.record(tg, now, 1200*time.Millisecond, nil)
	p.record(tg, now, time.Millisecond, nil)
	for range 5 {
		p.record(tg, now, time.Millisecond, errors.New("answered by the wrong endpoint"))
	}
	c := p.counts
	if c.Connects != 9 || c.Failures != 7 || c.Refused != 1 || c.Resent != 1 || len(c.Sample) != 5 {
		t.Errorf("counts = %+v; want 9 connects, 7 failures, 1 refused, 1 resent, 5 in the sample", c)
	}
	if !strings.Contains(c.Sample[0], "connection refused") || !strings.Contains(c.Sample[0], tg.String()) {
		t.Errorf("first sample %q does not name the target and the refusal", c.Sample[0])
	}
}
