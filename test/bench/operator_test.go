package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// auditLine is one audit event as kube-apiserver v1.37 writes it with
// testenv.LaunchAudited's policy (fields the count does not read cut).
func auditLine(verb, resource, sub, name string, code int, at string) string {
	sr := ""
	if sub != "" {
		sr = `,"subresource":"` + sub + `"`
	}
	return `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","verb":"` + verb +
		`","user":{"username":"proxyshift-operator","groups":["system:masters","system:authenticated"]},` +
		`"objectRef":{"resource":"` + resource + `","name":"` + name + `","apiGroup":"network.proxyshift.io","apiVersion":"v1alpha1"` + sr + `},` +
		`"responseStatus":{"metadata":{},"code":` + strconv.Itoa(code) + `},"requestReceivedTimestamp":"` + at + `","stageTimestamp":"` + at + `"}`
}

func TestCountWritesFromAuditLog(t *testing.T) {
	log := strings.Join([]string{
		auditLine("create", "leases", "", "proxyshift-operator.proxyshift.io", 201, "2026-12-01T20:19:47.45Z"),
		auditLine("create", "proxynodes", "", "node-00000", 201, "2026-12-01T20:19:48Z"),
		auditLine("create", "proxynodes", "", "node-00001", 201, "2026-12-01T20:19:48Z"),
		auditLine("update", "leases", "", "proxyshift-operator.proxyshift.io", 200, "2026-12-01T20:19:49Z"),
		// the ProxyConfig is created at 20:20:00
		auditLine("update", "proxyconfigs", "status", "bench", 200, "2026-12-01T20:20:01Z"),
		auditLine("update", "proxynodes", "", "node-00000", 200, "2026-12-01T20:20:02Z"),
		auditLine("update", "proxynodes", "", "node-00001", 409, "2026-12-01T20:20:02Z"),
		auditLine("update", "proxynodes", "", "node-00001", 200, "2026-12-01T20:20:03Z"),
		auditLine("patch", "nodes", "", "node-00001", 200, "2026-12-01T20:20:04Z"),
		auditLine("create", "events", "", "bench.1879", 201, "2026-12-01T20:20:05Z"),
		auditLine("update", "leases", "", "proxyshift-operator.proxyshift.io", 200, "2026-12-01T20:20:06Z"),
	}, "\n") + "\n"
	split, _ := time.Parse(time.RFC3339, "2026-12-01T20:20:00Z")
	w, err := countWrites(strings.NewReader(log), split)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]int{
		"create leases": {1, 0}, "update leases": {1, 1}, "create proxynodes": {2, 0}, "update proxynodes": {0, 3},
		"update proxyconfigs/status": {0, 1}, "patch nodes": {0, 1}, "create events": {0, 1},
	}
	for k, v := range want {
		if w.Before[k] != v[0] || w.After[k] != v[1] {
			t.Errorf("%s: before %d after %d, want %v", k, w.Before[k], w.After[k], v)
		}
	}
	if got := len(w.Kinds()); got != len(want) {
		t.Errorf("kinds %v, want %d", w.Kinds(), len(want))
	}
	if w.Failed != 1 {
		t.Errorf("failed %d, want 1 (the 409)", w.Failed)
	}
	if got := w.Total(true); got != 8 {
		t.Errorf("total without leases %d, want 8", got)
	}
	if got := w.Total(false); got != 11 {
		t.Errorf("total %d, want 11", got)
	}
	if node, n := w.MaxPerNode(); node != "node-00001" || n != 4 {
		t.Errorf("max per node %s=%d, want node-00001=4 (create, two updates, the Node's label)", node, n)
	}
	if w.PerNode["node-00000"] != 2 || w.PerNode["bench"] != 0 {
		t.Errorf("per node %v", w.PerNode)
	}
	if _, err := countWrites(strings.NewReader("not json\n"), split); err == nil {
		t.Error("a broken line was read")
	}
}

func TestReconcileMetricsQuantiles(t *testing.T) {
	page := `# TYPE controller_runtime_reconcile_total counter
controller_runtime_reconcile_total{controller="proxyshift-operator",result="success"} 90
controller_runtime_reconcile_total{controller="proxyshift-operator",result="requeue_after"} 8
controller_runtime_reconcile_total{controller="proxyshift-operator",result="error"} 2
controller_runtime_reconcile_total{controller="proxyshift-nodes",result="success"} 5
# TYPE controller_runtime_reconcile_time_seconds histogram
controller_runtime_reconcile_time_seconds_bucket{controller="proxyshift-operator",le="0.005"} 50
controller_runtime_reconcile_time_seconds_bucket{controller="proxyshift-operator",le="0.01"} 90
controller_runtime_reconcile_time_seconds_bucket{controller="proxyshift-operator",le="0.5"} 99
controller_runtime_reconcile_time_seconds_bucket{controller="proxyshift-operator",le="1"} 100
controller_runtime_reconcile_time_seconds_bucket{controller="proxyshift-operator",le="+Inf"} 100
controller_runtime_reconcile_time_seconds_sum{controller="proxyshift-operator"} 2
controller_runtime_reconcile_time_seconds_count{controller="proxyshift-operator"} 100
controller_runtime_reconcile_time_seconds_bucket{controller="proxyshift-nodes",le="0.005"} 4
controller_runtime_reconcile_time_seconds_bucket{controller="proxyshift-nodes",le="+Inf"} 5
controller_runtime_reconcile_time_seconds_sum{controller="proxyshift-nodes"} 30.01
controller_runtime_reconcile_time_seconds_count{controller="proxyshift-nodes"} 5
`
	m, err := reconcileMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	op := m["proxyshift-operator"]
	if op == nil || op.Total != 100 || op.Errors != 2 || op.Count != 100 {
		t.Fatalf("proxyshift-operator: %+v", op)
	}
	// p50: the 50th of 100 is the last of the first bucket: its bound.
	if got := op.Quantile(0.5); got != 5*time.Millisecond {
		t.Errorf("p50 %s, want 5ms", got)
	}
	// p99: the 99th is the last of (0.01, 0.5], 9 in it.
	if got := op.Quantile(0.99); got != 500*time.Millisecond {
		t.Errorf("p99 %s, want 500ms", got)
	}
	// p70: 20 of the 40 in (0.005, 0.01]: halfway.
	if got := op.Quantile(0.7); got != 7500*time.Microsecond {
		t.Errorf("p70 %s, want 7.5ms", got)
	}
	if b, beyond := op.MaxBound(); b != time.Second || beyond {
		t.Errorf("max %s beyond=%v, want <= 1s", b, beyond)
	}
	if got := op.Mean(); got != 20*time.Millisecond {
		t.Errorf("mean %s, want 20ms", got)
	}
	nodes := m["proxyshift-nodes"]
	if b, beyond := nodes.MaxBound(); b != 5*time.Millisecond || !beyond {
		t.Errorf("nodes max %s beyond=%v, want beyond 5ms", b, beyond)
	}
	if got := nodes.Quantile(0.99); got != 5*time.Millisecond {
		t.Errorf("nodes p99 %s, want the largest finite bound", got)
	}
	if got := (&Reconciles{}).Quantile(0.5); got != 0 {
		t.Errorf("p50 of nothing %s", got)
	}
}

func TestReplaceSectionKeepsTheRest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.md")
	orig := "# B\n\n" + beginMarker + "\nagent table\n" + endMarker + "\n\ntext after\n"
	if err := os.WriteFile(path, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"first\n", "second\n"} {
		if err := replaceSection(path, operatorBegin, operatorEnd, body); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(path)
	want := orig + "\n" + operatorBegin + "\nsecond\n" + operatorEnd + "\n"
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestOperatorBenchmarkSmall runs the whole operator benchmark at 40 nodes:
// the operator binary built from cmd/operator, the audited API server, the
// simulated agents, a rollout to Completed, and every figure read.
func TestOperatorBenchmarkSmall(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: export KUBEBUILDER_ASSETS=$(hack/controlplane.sh)")
	}
	bin := filepath.Join(t.TempDir(), "proxyshift-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/operator")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the operator: %v\n%s", err, out)
	}
	const nodes = 40
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	res, err := RunOperator(ctx, OperatorPlan{
		Nodes: nodes, Operator: bin, Assets: assets, Dir: dir,
		MaxUnavailable: intstr.FromString("25%"), SwitchTime: 100 * time.Millisecond, SwitchJitter: 100 * time.Millisecond,
		Timeout: 3 * time.Minute, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status.Phase != v1alpha1.RolloutCompleted || res.Status.Nodes.Updated != nodes {
		t.Errorf("status %s %+v, want Completed with every node updated", res.Status.Phase, res.Status.Nodes)
	}
	// One create at install, one spec update in the rollout, per node.
	w := res.Writes
	if w.Before["create proxynodes"] != nodes || w.After["update proxynodes"] != nodes || w.After["create proxynodes"] != 0 {
		t.Errorf("ProxyNode writes before/after: %v / %v, want %d creates then %d updates", w.Before, w.After, nodes, nodes)
	}
	if _, most := w.MaxPerNode(); most != 2 {
		t.Errorf("most writes to one node's objects: %d, want 2", most)
	}
	if len(w.PerNode) != nodes {
		t.Errorf("writes to %d nodes' objects, want %d", len(w.PerNode), nodes)
	}
	if res.AgentWrites != 3*nodes {
		t.Errorf("agents wrote %d times, want %d (a first report, Preparing, Active)", res.AgentWrites, 3*nodes)
	}
	if res.PeakRSS < 10<<20 {
		t.Errorf("peak RSS %d bytes: not the operator's", res.PeakRSS)
	}
	if res.PeakHeap < 1<<20 || res.PeakHeap > uint64(res.PeakRSS) {
		t.Errorf("peak Go heap in use %d bytes beside a peak RSS of %d: not read from the operator's metrics", res.PeakHeap, res.PeakRSS)
	}
	if p, err := readProfile(filepath.Join(dir, HeapProfileName)); err != nil {
		t.Errorf("the operator's heap profile at its peak: %v", err)
	} else if top, total, err := topFunctions(p, "inuse_space", 1); err != nil || len(top) != 1 || total <= 0 {
		t.Errorf("the operator's heap profile at its peak: top %v of %d bytes, %v", top, total, err)
	}
	rc := res.Reconciles["proxyshift-operator"]
	if rc == nil || rc.Total == 0 || rc.Count == 0 || rc.Errors != 0 {
		t.Errorf("proxyshift-operator reconciles: %+v", rc)
	}
	if nr := res.Reconciles["proxyshift-nodes"]; nr == nil || nr.Total < nodes {
		t.Errorf("proxyshift-nodes reconciles: %+v, want one per node at least", nr)
	}
	md := res.Markdown()
	for _, s := range []string{"| operator peak RSS (VmHWM) |", "proxyshift-operator: reconcile time p50 / p99", "| create proxynodes | 40 | 0 |"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q:\n%s", s, md)
		}
	}
}
