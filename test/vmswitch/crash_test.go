package vmswitch_test

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The agent killed with SIGKILL is a process of its own: this test binary
// again, which TestMain turns into the agent's switcher for the lab node
// when the environment says so (childEnv), running until it is killed.
const (
	childEnv   = "PROXYSHIFT_VMSWITCH_AGENT"
	childNS    = "PROXYSHIFT_VMSWITCH_NETNS"
	childPods  = "PROXYSHIFT_VMSWITCH_PODS"
	childMode  = "PROXYSHIFT_VMSWITCH_MODE"
	childPhase = "PROXYSHIFT_VMSWITCH_STOP_AT"
	// stopMark is what the switcher logs once it did the work of the
	// phase it was told to stop at, and hangs.
	stopMark = "Test hook: stopping at phase"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := runAgent(); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runAgent is the child: the agent's switcher and backends for the node
// namespace named by the environment, desiring a mode, with the sync
// loop's first sync of the web service, stopping (hanging) once the work
// of a phase is done.
func runAgent() error {
	fd, err := unix.Open(os.Getenv(childNS), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the node namespace: %w", err)
	}
	var pods []netip.Addr
	for _, p := range strings.Split(os.Getenv(childPods), ",") {
		pods = append(pods, netip.MustParseAddr(p))
	}
	fanout := switcher.NewFanout()
	cfg := agentConfig(nsexec.NS(fd), nodeConfig, fanout, &phases{})
	cfg.StopAt = v1alpha1.NodePhase(os.Getenv(childPhase))
	sw := switcher.New(cfg, switcher.Desire{Mode: v1alpha1.ProxyMode(os.Getenv(childMode))})
	ctx := context.Background()
	st, step, err := sw.Init(ctx)
	if err != nil {
		return err
	}
	if _, err := fanout.Sync(ctx, dataplane.SyncRequest{Model: web(pods), Full: true}); err != nil {
		return err
	}
	return sw.Run(ctx, st, step)
}

// agentProcess is a running child agent.
type agentProcess struct {
	cmd     *exec.Cmd
	stopped chan struct{}
	once    sync.Once
	mu      sync.Mutex
	log     []string
}

// startAgentProcess starts the child agent for the lab node, desiring
// mode, to hang at phase.
func startAgentProcess(t *testing.T, lab *netlab.Lab, pods []*netlab.Pod, mode v1alpha1.ProxyMode, phase v1alpha1.NodePhase) *agentProcess {
	t.Helper()
	var ips []string
	for _, ip := range podIPs(pods) {
		ips = append(ips, ip.String())
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1",
		childNS+"="+fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), lab.Node.NS.FD()),
		childPods+"="+strings.Join(ips, ","), childMode+"="+string(mode), childPhase+"="+string(phase))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	a := &agentProcess{cmd: cmd, stopped: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the agent process: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			a.mu.Lock()
			a.log = append(a.log, sc.Text())
			a.mu.Unlock()
			if strings.Contains(sc.Text(), stopMark) {
				a.once.Do(func() { close(a.stopped) })
			}
		}
	}()
	t.Cleanup(func() { a.kill9() })
	return a
}

// logText is what the child logged so far.
func (a *agentProcess) logText() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.log, "\n")
}

// waitStopped waits until the child did its phase's work and hangs.
func (a *agentProcess) waitStopped(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-a.stopped:
	case <-time.After(timeout):
		t.Fatalf("the agent process did not reach its stop within %s; its log:\n%s", timeout, a.logText())
	}
}

// kill9 kills the child with SIGKILL and reaps it.
func (a *agentProcess) kill9() {
	if a.cmd.ProcessState != nil {
		return
	}
	_ = a.cmd.Process.Kill()
	_ = a.cmd.Wait()
}

// TestVMKillInEveryPhaseIPVS kills the agent (SIGKILL, a process of its
// own) once it has done the work of each phase of a switch into ipvs and
// out of it (to nftables, then iptables, by turns), then starts a new
// agent desiring the same mode: it must converge to that mode with
// nothing of the other left, while new connections to a cluster IP and a
// NodePort never fail, not even while no agent runs, and a connection
// opened before the switch keeps carrying data.
func TestVMKillInEveryPhaseIPVS(t *testing.T) {
	loadModules(t)
	lab := netlab.NewLab(t)
	pods := []*netlab.Pod{lab.Node.AddPod(t, "pod-a"), lab.Node.AddPod(t, "pod-b")}
	n := startNode(t, lab, nodeConfig, web(podIPs(pods)), v1alpha1.ModeNFTables)
	n.waitActive(v1alpha1.ModeNFTables)
	n.stop()

	current := v1alpha1.ModeNFTables
	for i, phase := range []v1alpha1.NodePhase{v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeCleaningUp} {
		away := []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables}[i%2]
		for _, to := range []v1alpha1.ProxyMode{v1alpha1.ModeIPVS, away} {
			if to == current {
				continue
			}
			t.Run(string(current)+"-to-"+string(to)+"-killed-in-"+string(phase), func(t *testing.T) {
				session, err := lab.Client.NS.OpenSession(netip.AddrPortFrom(webIP, 80), 2*time.Second)
				if err != nil {
					t.Fatalf("open a long-lived connection: %v", err)
				}
				defer session.Close()
				loop := netlab.StartClientLoop(t, lab.Client.NS, netip.AddrPortFrom(webIP, 80), nodePort)

				hung := startAgentProcess(t, lab, pods, to, phase)
				hung.waitStopped(t, 180*time.Second)
				hung.kill9()
				time.Sleep(500 * time.Millisecond) // no agent at all now

				next := startNode(t, lab, nodeConfig, web(podIPs(pods)), to)
				next.waitServing(to, nil)
				time.Sleep(300 * time.Millisecond)
				if _, failed := loop.Counts(); failed > 0 {
					t.Logf("the killed agent's log, to read the failed connections' times against:\n%s", hung.logText())
				}
				loop.RequireNoFailures(t, "across the kill and the restart")
				if err := session.Exchange("after-restart", 2*time.Second); err != nil {
					t.Errorf("the connection opened through %s before the switch (to %s) no longer carries data: %v", current, session.Server, err)
				}
				next.requireOnly(to)
				requireTraffic(t, lab, len(pods))
				next.stop()
			})
			current = to
		}
	}
}
