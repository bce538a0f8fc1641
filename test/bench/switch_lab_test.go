package bench

import (
	"context"
	"net/netip"
	"net/url"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// TestSwitchMeasuredThroughProxyNode runs the agent binary as the
// benchmark does (following its ProxyNode, default flags) in a bench lab
// node with a few Services, switches it nftables -> iptables -> nftables
// through the ProxyNode spec, and checks what the benchmark reports: two
// switches with their phases, the prober's connections through the
// rules, and none of them failed.
func TestSwitchMeasuredThroughProxyNode(t *testing.T) {
	netlab.RequireRoot(t)
	env := testenv.Start(t)
	agent := filepath.Join(t.TempDir(), "proxyshift-agent")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", agent, "./cmd/agent")
	build.Dir = testenv.RepoRoot()
	build.Env = append(build.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(env.Config)
	objs, err := NewObjects(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	const n = ProbeServices + 20
	if err := objs.EnsureServices(ctx, n, 4); err != nil {
		t.Fatal(err)
	}
	pns, err := NewProxyNodes(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	lab, err := NewLab()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lab.Close() })
	host, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	node, err := lab.NewNode(host.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })

	if err := pns.Reset(ctx, "nftables"); err != nil {
		t.Fatal(err)
	}
	run, err := Proxyshift(agent).Start(node, "nftables", t.TempDir(), env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = run.Stop() })
	if _, err := waitAnswer(ctx, node, run, ServiceAddr(LastOrdinary(n)), netip.Addr{}, 2*time.Minute); err != nil {
		t.Fatalf("first sync: %v (log %s)", err, run.proc.Log)
	}
	if _, err := settledSyncs(ctx, run, 2*time.Minute); err != nil {
		t.Fatalf("%v (log %s)", err, run.proc.Log)
	}

	res, err := measureSwitches(ctx, node, pns, SwitchPlan{Modes: []string{"nftables", "iptables"}, Rounds: 1, Timeout: 3 * time.Minute, ProbeEvery: 5 * time.Millisecond}, n, t.Logf)
	if err != nil {
		t.Fatalf("%v (log %s)", err, run.proc.Log)
	}
	if len(res.Switches) != 2 || res.Switches[0].From != "nftables" || res.Switches[0].To != "iptables" || res.Switches[1].To != "nftables" {
		t.Fatalf("switches = %+v, want nftables -> iptables -> nftables", res.Switches)
	}
	for _, sw := range res.Switches {
		if sw.Took <= 0 || sw.PreparingToActive() <= 0 || sw.PreparingToActive() > sw.Took {
			t.Errorf("switch %s -> %s: took %s, Preparing -> Active %s", sw.From, sw.To, sw.Took, sw.PreparingToActive())
		}
		if len(sw.Phases) < 2 || sw.Phases[0].Phase != "Preparing" || sw.Phases[len(sw.Phases)-1].Phase != "Active" {
			t.Errorf("switch %s -> %s went through %s, want Preparing first and Active last", sw.From, sw.To, phaseText(sw.Phases))
		}
	}
	if res.Connects < 10 || res.Failures != 0 {
		t.Errorf("prober: %d connections, %d failed (%v); want some, none failed", res.Connects, res.Failures, res.FailureSample)
	}
	t.Logf("switches: %s in %s, %s in %s; %d connections", phaseText(res.Switches[0].Phases), res.Switches[0].Took, phaseText(res.Switches[1].Phases), res.Switches[1].Took, res.Connects)
}
