package rollout

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// BenchmarkRollout moves N simulated nodes (PROXYSHIFT_SCALE_NODES, a comma
// separated list, default 1000) from iptables to nftables at
// maxUnavailable 10% with a one-node canary. The operator runs as its own
// process (test/rollout/operatorbin) so its memory is measured alone; the
// agents and the watch recorder run in the test process. It reports the
// time to complete, the operator's API writes per node, its reconciles and
// its peak RSS, and fails if maxUnavailable was ever exceeded.
//
//	go test ./test/rollout/ -run '^$' -bench Rollout -benchtime 1x
func BenchmarkRollout(b *testing.B) {
	sizes := os.Getenv("PROXYSHIFT_SCALE_NODES")
	if sizes == "" {
		sizes = "1000"
	}
	defer func() {
		if binPath != "" {
			_ = os.RemoveAll(filepath.Dir(binPath))
		}
	}()
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("PROXYSHIFT_SCALE_NODES: bad size %q", s)
		}
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				runScale(b, n)
			}
		})
	}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func operatorBinary(b *testing.B) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "proxyshift-operatorbin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "operatorbin")
		cmd := exec.Command("go", "build", "-o", binPath, "./test/rollout/operatorbin")
		cmd.Dir = testenv.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build operatorbin: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return binPath
}

type opStats struct {
	Writes       map[string]int64 `json:"writes"`
	Reconciles   int64            `json:"reconciles"`
	Errors       int64            `json:"errors"`
	StatusWrites int64            `json:"statusWrites"`
	PeakRSSKiB   int64            `json:"peakRSSKiB"`
	PeakHeapMiB  float64          `json:"peakHeapMiB"`
}

func runScale(b *testing.B, n int) {
	b.StopTimer()
	bin := operatorBinary(b)
	w := newWorld(b)
	w.agents.def.delay = 500 * time.Millisecond
	w.agents.def.jitter = 500 * time.Millisecond

	// Nodes, created in parallel.
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node-%05d", i)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				w.createNode(names[i], pool)
			}
		}(g)
	}
	wg.Wait()
	limit := n / 10
	if limit < 1 {
		limit = 1
	}
	w.rec.track("scale", names, limit)

	statsFile := filepath.Join(b.TempDir(), "stats.json")
	args := []string{"--kubeconfig", w.env.Kubeconfig, "--stats", statsFile, "--zap-log-level=" + logLevel()}
	if p := os.Getenv("PROXYSHIFT_SCALE_HEAP_PROFILE"); p != "" {
		args = append(args, "--heap-profile", p)
	}
	cmd := exec.Command(bin, args...)
	logPath := filepath.Join(b.TempDir(), "operator.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	opLog := func() string {
		out, _ := os.ReadFile(logPath)
		if len(out) > 4000 {
			out = out[len(out)-4000:]
		}
		return string(out)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	b.Cleanup(stop)

	pc := newConfig("scale", v1alpha1.ModeNFTables, intstr.FromString("10%"))
	pc.Spec.Rollout.NodeTimeout = "5m"
	pc.Spec.Rollout.Canary = v1alpha1.CanaryPolicy{Nodes: ptr.To(int32(1))}
	b.StartTimer()
	start := time.Now()
	w.create(pc)
	deadline := start.Add(20 * time.Minute)
	var c *v1alpha1.ProxyConfig
	for {
		c = w.config("scale")
		if c.Status.Phase == v1alpha1.RolloutCompleted {
			break
		}
		if c.Status.Phase == v1alpha1.RolloutFailed || time.Now().After(deadline) {
			b.Fatalf("rollout did not complete: phase %s %+v %+v", c.Status.Phase, c.Status.Nodes, c.Status.Conditions)
		}
		select {
		case err := <-exited:
			stopped = true
			b.Fatalf("operator exited: %v\n%s", err, opLog())
		case <-time.After(200 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	time.Sleep(time.Second) // let the last events and the stats file land
	stop()

	raw, err := os.ReadFile(statsFile)
	if err != nil {
		b.Fatal(err)
	}
	var st opStats
	if err := json.Unmarshal(raw, &st); err != nil {
		b.Fatal(err)
	}
	max := w.rec.check(b)["scale"]
	var pnWrites, statusWrites, eventWrites, other int64
	var keys []string
	for k, v := range st.Writes {
		keys = append(keys, fmt.Sprintf("%s=%d", k, v))
		switch {
		case strings.HasSuffix(k, " proxynodes"):
			pnWrites += v
		case strings.HasSuffix(k, " proxyconfigs/status"):
			statusWrites += v
		case strings.HasSuffix(k, " events"):
			eventWrites += v
		default:
			other += v
		}
	}
	sort.Strings(keys)
	total := pnWrites + statusWrites + eventWrites + other
	w.agents.mu.Lock()
	agentWrites := w.agents.writes
	w.agents.mu.Unlock()

	b.ReportMetric(elapsed.Seconds(), "s/rollout")
	b.ReportMetric(float64(total)/float64(n), "writes/node")
	b.ReportMetric(float64(pnWrites)/float64(n), "proxynode-writes/node")
	b.ReportMetric(float64(st.Reconciles), "reconciles")
	b.ReportMetric(float64(st.PeakRSSKiB)/1024, "peak-RSS-MiB")
	b.Logf("%d nodes: completed in %s (%s); max %d in transition (limit %d)", n, elapsed.Round(time.Millisecond), c.Status.Nodes.Summary, max, limit)
	b.Logf("operator writes: %d total = %.2f/node (ProxyNode %d, ProxyConfig status %d, events %d, other %d): %s",
		total, float64(total)/float64(n), pnWrites, statusWrites, eventWrites, other, strings.Join(keys, " "))
	if os.Getenv("PROXYSHIFT_SCALE_LOG") != "" {
		_ = exec.Command("cp", logPath, os.Getenv("PROXYSHIFT_SCALE_LOG")).Run()
	}
	b.Logf("operator: %d reconciles, %d errors, peak RSS %.1f MiB, peak Go heap in use %.1f MiB; agents wrote status %d times",
		st.Reconciles, st.Errors, float64(st.PeakRSSKiB)/1024, st.PeakHeapMiB, agentWrites)
	if st.Errors != 0 {
		b.Errorf("%d reconcile errors", st.Errors)
	}
}

// logLevel is the operator's log level: debug (one line per reconcile) when
// PROXYSHIFT_SCALE_LOG names a file to copy its log to, else info.
func logLevel() string {
	if os.Getenv("PROXYSHIFT_SCALE_LOG") != "" {
		return "debug"
	}
	return "info"
}
