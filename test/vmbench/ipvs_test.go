package vmbench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/bench"
	"github.com/proxyshift/proxyshift/test/vm"
)

// kube-proxy's IPVS mode keeps its Services' addresses in ipsets and
// matches them from iptables rules; the VM's kernel has no modprobe to
// load these on demand, as a node's has.
var kubeProxyIPVSModules = []string{
	"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet",
	"ip_set_hash_net", "ip_set_bitmap_port", "xt_set", "xt_addrtype", "veth",
}

// TestMain loads, inside the VM, the modules of the ipvs and iptables
// modes (kube-proxy's IPVS mode programs iptables too) and kube-proxy's
// ipset modules.
func TestMain(m *testing.M) {
	vm.Main(m, kubeProxyIPVSModules, v1alpha1.ModeIPVS, v1alpha1.ModeIPTables)
}

// Where hack/vm/run.sh puts the programs in the initramfs.
const (
	kubeProxyBin = "/usr/sbin/kube-proxy"
	agentBin     = "/usr/sbin/proxyshift-agent"
)

// The report's markers on the VM's console, between which
// hack/vm/bench-report.sh finds the Markdown it puts into
// docs/benchmarks.md.
const (
	reportBegin = "PROXYSHIFT-BENCH-REPORT-BEGIN"
	reportEnd   = "PROXYSHIFT-BENCH-REPORT-END"
)

// settings is what one run measures, from the environment (make bench-vm
// sets it through PROXYSHIFT_VM_ENV), with a small default for make
// test-vm.
type settings struct {
	sizes                      []int
	changes                    int
	connects                   int
	syncTimeout, changeTimeout time.Duration
	changeBudget               time.Duration
	// programs are the programs measured (both by default), and logs
	// says to print their logs at the end, not only on failure.
	programs []string
	logs     bool
}

func settingsFromEnv(t *testing.T) settings {
	s := settings{sizes: []int{100}, changes: 3, connects: 20, syncTimeout: 5 * time.Minute, changeTimeout: 3 * time.Minute,
		programs: []string{"kube-proxy", "proxyshift"}, logs: os.Getenv("PROXYSHIFT_VMBENCH_LOGS") == "1"}
	if v := os.Getenv("PROXYSHIFT_VMBENCH_PROGRAMS"); v != "" {
		s.programs = strings.Split(v, ",")
	}
	if v := os.Getenv("PROXYSHIFT_VMBENCH_SIZES"); v != "" {
		s.sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= bench.ProbeServices || (len(s.sizes) > 0 && n <= s.sizes[len(s.sizes)-1]) {
				t.Fatalf("PROXYSHIFT_VMBENCH_SIZES=%q: want ascending Service counts above %d", v, bench.ProbeServices)
			}
			s.sizes = append(s.sizes, n)
		}
	}
	for name, into := range map[string]*int{"PROXYSHIFT_VMBENCH_CHANGES": &s.changes, "PROXYSHIFT_VMBENCH_CONNECTS": &s.connects} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive count", name, v)
			}
			*into = n
		}
	}
	for name, into := range map[string]*time.Duration{"PROXYSHIFT_VMBENCH_SYNC_TIMEOUT": &s.syncTimeout, "PROXYSHIFT_VMBENCH_CHANGE_TIMEOUT": &s.changeTimeout, "PROXYSHIFT_VMBENCH_CHANGE_BUDGET": &s.changeBudget} {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				t.Fatalf("%s=%q: want a duration", name, v)
			}
			*into = d
		}
	}
	return s
}

// TestIPVSBesideKubeProxy measures kube-proxy and the agent in IPVS mode
// with make bench's harness and prints the report between its markers.
// It fails unless both programs served every Service (no first sync timed
// out), carried every endpoint change, and answered the first-packet
// connections, with a peak RSS measured.
func TestIPVSBesideKubeProxy(t *testing.T) {
	kubeconfig, cfg := vm.APIServer(t)
	s := settingsFromEnv(t)
	// The run ends before the test binary's timeout would, so that what
	// was measured is still reported.
	ctx, cancel := context.WithCancel(context.Background())
	if deadline, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), deadline.Add(-3*time.Minute))
	}
	defer cancel()

	host, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	kcfg := *cfg
	kcfg.QPS, kcfg.Burst = 500, 1000
	kube, err := kubernetes.NewForConfig(&kcfg)
	if err != nil {
		t.Fatal(err)
	}
	lab, err := bench.NewLab()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := lab.Close(); err != nil {
			t.Errorf("remove the lab: %v", err)
		}
	}()
	objs, err := bench.NewObjects(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	proxyNodes, err := bench.NewProxyNodes(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The API server is the VM's, shared with test/vmcluster after this
	// package: leave nothing of the benchmark's in it.
	defer func() {
		cleanup, stop := context.WithTimeout(context.Background(), 5*time.Minute)
		defer stop()
		if err := objs.Remove(cleanup); err != nil {
			t.Errorf("remove the benchmark's objects: %v", err)
		}
		if err := proxyNodes.Remove(cleanup); err != nil {
			t.Errorf("remove the benchmark's ProxyNode: %v", err)
		}
	}()

	dir := t.TempDir()
	defer func() {
		if t.Failed() || s.logs {
			showLogs(t, dir)
		}
	}()
	var programs []bench.Program
	for _, p := range []bench.Program{bench.KubeProxy(kubeProxyBin), bench.Proxyshift(agentBin)} {
		if slices.Contains(s.programs, p.Name) {
			programs = append(programs, p)
		}
	}
	if len(programs) != len(s.programs) {
		t.Fatalf("PROXYSHIFT_VMBENCH_PROGRAMS=%s: want kube-proxy, proxyshift or both", strings.Join(s.programs, ","))
	}
	plan := bench.Plan{
		Sizes: s.sizes, Modes: []string{string(v1alpha1.ModeIPVS)}, Programs: programs,
		Changes: s.changes, ChangeEvery: 1100 * time.Millisecond, Connects: s.connects,
		SyncTimeout: s.syncTimeout, ChangeTimeout: s.changeTimeout, ChangeBudget: s.changeBudget,
		Dir: dir, Kubeconfig: kubeconfig, APIServer: host.Host,
		Workers: 8, Logf: t.Logf, ProxyNodes: proxyNodes,
	}
	started := time.Now()
	results, runErr := bench.Run(ctx, lab, objs, plan)
	report := bench.NewReport(results, time.Since(started))
	report.Command = "make bench-vm"
	for _, p := range programs {
		report.Flags = append(report.Flags, bench.ProgramFlags{Program: p.Name, Flags: p.Flags("ipvs")})
	}
	if runErr != nil {
		report.Extra = append(report.Extra, fmt.Sprintf("### the run stopped early\n\n%v", runErr))
	}
	fmt.Printf("%s\n%s%s\n", reportBegin, report.Markdown(), reportEnd)
	if runErr != nil {
		t.Fatal(runErr)
	}

	if want := len(s.sizes) * len(programs); len(results) != want {
		t.Fatalf("%d results, want %d (every program at every size)", len(results), want)
	}
	for _, r := range results {
		switch {
		case r.TimedOut:
			t.Errorf("%s: the last Service did not answer within %s", r.Program, r.FirstSync)
		case len(r.Latency) == 0 || (s.changeBudget == 0 && len(r.Latency) != s.changes):
			t.Errorf("%s: %d endpoint changes measured, want %d", r.Summary(), len(r.Latency), s.changes)
		case r.ConnectFailures != 0:
			t.Errorf("%s: %d first-packet connections unanswered", r.Summary(), r.ConnectFailures)
		case r.PeakRSS <= 0:
			t.Errorf("%s: no peak RSS measured", r.Summary())
		default:
			t.Logf("%s", r.Summary())
		}
	}
}

// showLogs prints the end of every program's log under dir (the
// benchmark's run directory, which goes with the VM).
func showLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*", "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Logf("%s: %v", l, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 300 {
			lines = append([]string{"[...]"}, lines[len(lines)-300:]...)
		}
		t.Logf("%s:\n%s", strings.TrimPrefix(l, dir+"/"), strings.Join(lines, "\n"))
	}
}
