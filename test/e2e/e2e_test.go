package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/testlog"
)

// Rollouts here are short: one node at a time, each switch a few seconds.
const (
	nodeTimeout    = 45 * time.Second
	rolloutTimeout = 3 * time.Minute
	trafficRate    = 50
	requestTimeout = 2 * time.Second
)

func init() { testlog.Init() }

// binDir holds the operator and agent, built once for every test's cluster.
var binDir string

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() != 0 {
			return m.Run() // every test skips, naming root
		}
		dir, err := os.MkdirTemp("", "proxyshift-e2e-bin-")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := cluster.Build(ctx, cluster.RepoRoot(), dir); err != nil {
			// Let the tests report it: each fails naming the build.
			buildErr = err
		}
		binDir = dir
		return m.Run()
	}()
	os.Exit(code)
}

var buildErr error

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the local cluster runs in network namespaces and programs netfilter (run as root, e.g. sudo make test-e2e)")
	}
	if buildErr != nil {
		t.Fatalf("building the operator and the agent: %v", buildErr)
	}
}

func startCluster(t *testing.T, mode v1alpha1.ProxyMode) *cluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{
		Nodes:      3,
		Mode:       mode,
		BinDir:     binDir,
		KeepRunDir: os.Getenv("PROXYSHIFT_E2E_KEEP") != "",
		Logf:       t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, c)
		}
		if err := c.Close(); err != nil {
			t.Errorf("tearing the cluster down: %v", err)
		}
	})
	if err := WaitNodesActive(context.Background(), c.Client, mode, 3, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// dumpLogs shows the end of the operator's and the agents' logs.
func dumpLogs(t *testing.T, c *cluster.Cluster) {
	for _, p := range c.Processes() {
		if p == c.Etcd || p == c.APIServer {
			continue
		}
		b, err := os.ReadFile(p.Log)
		if err != nil {
			continue
		}
		s := string(b)
		if len(s) > 3000 {
			s = "[...]" + s[len(s)-3000:]
		}
		t.Logf("---- %s (%s)\n%s", p.Name, filepath.Base(p.Log), s)
	}
}

// rollout applies mode to the ProxyConfig and waits for the rollout to end.
func rollout(t *testing.T, c *cluster.Cluster, mode v1alpha1.ProxyMode) Snapshot {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	gen, err := ApplyMode(ctx, c.Client, ConfigName, mode, nodeTimeout)
	if err != nil {
		t.Fatalf("apply ProxyConfig mode %s: %v", mode, err)
	}
	s, err := WaitDone(ctx, c.Client, ConfigName, gen, rolloutTimeout, func(s Snapshot) {
		t.Logf("%6.1fs %s", time.Since(start).Seconds(), s.Line())
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rollout to %s: %s in %.1fs", mode, s.Config.Status.Phase, time.Since(start).Seconds())
	return s
}

func checkCompleted(t *testing.T, s Snapshot, mode v1alpha1.ProxyMode, n int) {
	t.Helper()
	st := s.Config.Status
	if st.Phase != v1alpha1.RolloutCompleted || st.Nodes.Selected != int32(n) || st.Nodes.Updated != int32(n) || st.Nodes.Ready != int32(n) || st.Nodes.Failed != 0 {
		t.Errorf("ProxyConfig: phase %s, nodes %+v, failed %v; want Completed with %d/%d updated and ready", st.Phase, st.Nodes, st.FailedNodes, n, n)
	}
	if cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); cond == nil || cond.Status != "True" {
		t.Errorf("ProxyConfig condition Ready = %+v, want True", cond)
	}
	for _, pn := range s.Nodes {
		if pn.Status.ActiveMode != mode || pn.Status.Phase != v1alpha1.NodeActive {
			t.Errorf("ProxyNode %s: %s, want %s Active", pn.Name, NodeText(pn), mode)
		}
	}
}

func checkKernels(t *testing.T, c *cluster.Cluster, want map[string]v1alpha1.ProxyMode) {
	t.Helper()
	for _, n := range c.Nodes {
		k, err := ReadKernel(context.Background(), n)
		if err != nil {
			t.Errorf("%s: %v", n.Name, err)
			continue
		}
		left, missing := k.Leftovers(want[n.Name])
		if len(left) > 0 {
			t.Errorf("%s runs %s but holds leftovers of the other mode: %s", n.Name, want[n.Name], strings.Join(left, ", "))
		}
		if missing != "" {
			t.Errorf("%s should run %s: %s", n.Name, want[n.Name], missing)
		}
		t.Logf("%s kernel: legacy chains %d, nft chains %d, nftables table proxyshift %v", n.Name, len(k.LegacyChains), len(k.NFTChains), k.Table)
	}
}

func allNodes(c *cluster.Cluster, mode v1alpha1.ProxyMode) map[string]v1alpha1.ProxyMode {
	m := map[string]v1alpha1.ProxyMode{}
	for _, n := range c.Nodes {
		m[n.Name] = mode
	}
	return m
}

func startTraffic(t *testing.T, c *cluster.Cluster) *Traffic {
	t.Helper()
	targets, err := Targets(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr := StartTraffic(ctx, targets, trafficRate, requestTimeout)
	t.Cleanup(func() { cancel(); tr.Stop() })
	return tr
}

func checkTraffic(t *testing.T, tr *Traffic) {
	t.Helper()
	tr.Stop()
	sent, failed := tr.Sent.Load(), tr.Failed.Load()
	t.Logf("traffic: %d requests, %d failed; by target %v; answers %v", sent, failed, tr.ByTarget(), tr.Answers())
	if sent < 100 {
		t.Errorf("only %d requests were sent", sent)
	}
	for name, tt := range tr.ByTarget() {
		if tt.Sent == 0 {
			t.Errorf("no request was sent to %s", name)
		}
	}
	if failed != 0 {
		t.Errorf("%d of %d requests failed; first failures:\n%s", failed, sent, strings.Join(tr.Failures(), "\n"))
	}
}

// TestRoundTrip moves three nodes iptables → nftables → iptables under
// continuous traffic to the ClusterIP (entering at every node) and the
// NodePort (on every node): no request may fail, each rollout completes
// with every node Active in the target mode, and no node keeps anything
// of the mode it left.
func TestRoundTrip(t *testing.T) {
	requireRoot(t)
	c := startCluster(t, v1alpha1.ModeIPTables)

	s := rollout(t, c, v1alpha1.ModeIPTables) // take the nodes over: nothing to switch
	checkCompleted(t, s, v1alpha1.ModeIPTables, 3)
	checkKernels(t, c, allNodes(c, v1alpha1.ModeIPTables))

	tr := startTraffic(t, c)
	time.Sleep(2 * time.Second) // traffic flows before the switch starts
	logs := LogSizes(c)

	s = rollout(t, c, v1alpha1.ModeNFTables)
	checkCompleted(t, s, v1alpha1.ModeNFTables, 3)
	checkKernels(t, c, allNodes(c, v1alpha1.ModeNFTables))

	s = rollout(t, c, v1alpha1.ModeIPTables)
	checkCompleted(t, s, v1alpha1.ModeIPTables, 3)
	checkKernels(t, c, allNodes(c, v1alpha1.ModeIPTables))

	time.Sleep(time.Second)
	checkTraffic(t, tr)

	// Every node removed the mode it left, twice, and said so.
	rm := Removals(c, logs)
	for _, n := range c.Nodes {
		var modes []string
		for _, r := range rm {
			if r.Node == n.Name && r.What == "Removed the old mode" {
				modes = append(modes, r.Mode)
			}
		}
		if !slices.Equal(modes, []string{"iptables", "nftables"}) {
			t.Errorf("%s logged removing %v, want [iptables nftables]", n.Name, modes)
		}
	}
	for _, r := range rm {
		t.Logf("%s: %s %s: %s", r.Node, r.What, r.Mode, r.Summary())
	}
}

// TestFailedVerifyRollsBack makes the canary's agent fail verification:
// the rollout stops there and rolls that node back to iptables, the other
// nodes are never asked to switch, traffic keeps flowing, and the
// ProxyConfig is Failed naming the node and why.
func TestFailedVerifyRollsBack(t *testing.T) {
	requireRoot(t)
	c := startCluster(t, v1alpha1.ModeIPTables)
	ctx := context.Background()

	s := rollout(t, c, v1alpha1.ModeIPTables)
	checkCompleted(t, s, v1alpha1.ModeIPTables, 3)

	// The operator takes nodes in name order: node-1 is the canary. It is
	// also where the first client's traffic enters the cluster.
	bad := c.Nodes[0]
	if err := bad.Agent.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	bad.Agent.Args = append(bad.Agent.Args, "--test-fail-verify")
	if err := bad.Agent.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitAgentHealthy(ctx, bad, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	tr := startTraffic(t, c)
	time.Sleep(2 * time.Second)
	logs := LogSizes(c)

	// Record every desiredMode the other nodes are ever given.
	others := map[string][]v1alpha1.ProxyMode{}
	s = rolloutWatching(t, c, v1alpha1.ModeNFTables, func(s Snapshot) {
		for _, pn := range s.Nodes {
			if pn.Name != bad.Name && !slices.Contains(others[pn.Name], pn.Spec.DesiredMode) {
				others[pn.Name] = append(others[pn.Name], pn.Spec.DesiredMode)
			}
		}
	})

	st := s.Config.Status
	if st.Phase != v1alpha1.RolloutFailed {
		t.Errorf("ProxyConfig phase %s, want Failed", st.Phase)
	}
	if len(st.FailedNodes) != 1 || st.FailedNodes[0].Name != bad.Name || st.FailedNodes[0].Reason == "" {
		t.Errorf("ProxyConfig failedNodes %+v, want just %s with a reason", st.FailedNodes, bad.Name)
	} else {
		t.Logf("failed node %s: %s", st.FailedNodes[0].Name, st.FailedNodes[0].Reason)
	}
	if cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDegraded); cond == nil || cond.Status != "True" {
		t.Errorf("ProxyConfig condition Degraded = %+v, want True", cond)
	} else {
		t.Logf("Degraded: %s: %s", cond.Reason, cond.Message)
	}
	for name, modes := range others {
		if !slices.Equal(modes, []v1alpha1.ProxyMode{v1alpha1.ModeIPTables}) {
			t.Errorf("%s was asked for %v; it should never have left iptables", name, modes)
		}
	}

	// The failed node serves iptables again (the rollback may finish
	// just after the operator marks the rollout Failed).
	deadline := time.Now().Add(nodeTimeout)
	for {
		pn := &v1alpha1.ProxyNode{}
		err := c.Client.Get(ctx, client.ObjectKey{Name: bad.Name}, pn)
		if err == nil && pn.Status.ActiveMode == v1alpha1.ModeIPTables && pn.Status.Phase != v1alpha1.NodeVerifying && pn.Status.Phase != v1alpha1.NodeProgramming && pn.Status.Phase != v1alpha1.NodePreparing && pn.Status.Phase != v1alpha1.NodeCleaningUp {
			t.Logf("%s after the rollback: %s", bad.Name, NodeText(*pn))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not roll back to iptables: %s (err %v)", bad.Name, NodeText(*pn), err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, pn := range mustTake(t, c).Nodes {
		if pn.Name != bad.Name && (pn.Status.ActiveMode != v1alpha1.ModeIPTables || pn.Status.Phase != v1alpha1.NodeActive) {
			t.Errorf("ProxyNode %s: %s, want untouched: iptables Active", pn.Name, NodeText(pn))
		}
	}
	checkKernels(t, c, allNodes(c, v1alpha1.ModeIPTables))

	time.Sleep(time.Second)
	checkTraffic(t, tr)
	// Only the failed node removed anything: the target it had programmed.
	rolledBack := false
	for _, r := range Removals(c, logs) {
		t.Logf("%s: %s %s: %s", r.Node, r.What, r.Mode, r.Summary())
		if r.Node != bad.Name {
			t.Errorf("%s removed something although it should be untouched: %s %s", r.Node, r.What, r.Mode)
		}
		if r.Node == bad.Name && r.What == "Rolled back: removed the failed target" && r.Mode == "nftables" {
			rolledBack = true
		}
	}
	if !rolledBack {
		t.Errorf("%s did not log removing the nftables target it rolled back from", bad.Name)
	}
}

func rolloutWatching(t *testing.T, c *cluster.Cluster, mode v1alpha1.ProxyMode, watch func(Snapshot)) Snapshot {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	gen, err := ApplyMode(ctx, c.Client, ConfigName, mode, nodeTimeout)
	if err != nil {
		t.Fatalf("apply ProxyConfig mode %s: %v", mode, err)
	}
	s, err := WaitDone(ctx, c.Client, ConfigName, gen, rolloutTimeout, func(s Snapshot) {
		t.Logf("%6.1fs %s", time.Since(start).Seconds(), s.Line())
		watch(s)
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustTake(t *testing.T, c *cluster.Cluster) Snapshot {
	t.Helper()
	s, err := Take(context.Background(), c.Client, ConfigName)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
