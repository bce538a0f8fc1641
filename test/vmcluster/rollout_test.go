package vmcluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/e2e"
	"github.com/proxyshift/proxyshift/test/netlab"
)

const (
	// nodeTimeout is the rollout's per-node timeout: under emulation on a
	// busy host one switch out of ipvs (both iptables variants read and
	// swept) took over 2 minutes (test/vmswitch), and at host load 20 a
	// full iptables sync of two Services took 25 s here.
	nodeTimeout = 8 * time.Minute
	// rolloutTimeout bounds one rollout of both nodes.
	rolloutTimeout = 2*nodeTimeout + 2*time.Minute
	// syncPeriod is the agents' full resync period, long: under emulation
	// a full iptables sync takes tens of seconds, which the switches
	// should have to themselves.
	syncPeriod = "10m"
	// connectionTimeout bounds each of the client's new connections. Not
	// 2 s, as on the host: at host load 20 the emulated VM stalled long
	// enough for a 2 s read deadline to fire 3.5 s after the connection
	// began, and connections failed so while no node was switching.
	connectionTimeout = 10 * time.Second
)

// settings gives the ProxyConfig's mode settings the long syncPeriod
// (the ipvs mode has none; the agents' flag sets it).
func settings(pc *v1alpha1.ProxyConfig) {
	switch {
	case pc.Spec.IPTables != nil:
		pc.Spec.IPTables.SyncPeriod = syncPeriod
	case pc.Spec.NFTables != nil:
		pc.Spec.NFTables.SyncPeriod = syncPeriod
	}
}

// TestVMClusterRollouts moves both nodes iptables -> ipvs -> nftables ->
// ipvs -> iptables through ProxyConfig rollouts that the operator runs and
// the agent binaries carry out, under a client that keeps opening new
// connections (one every few milliseconds, to the cluster IP and both
// NodePorts): each rollout completes with every ProxyNode Active in its
// mode, no new connection fails, the long-lived connections opened before
// it still carry data, and each node's kernel holds the new mode's objects
// and nothing of the others' (nftables tables and iptables chains through
// netlink and iptables-legacy-save, the IPVS virtual services through
// netlink, the dummy interface).
func TestVMClusterRollouts(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	if err := e2e.WaitNodesActive(w.ctx, w.c, v1alpha1.ModeIPTables, len(w.nodes), nodeTimeout); err != nil {
		t.Fatal(err)
	}
	w.requireTraffic(t)
	w.requireOnly(t, v1alpha1.ModeIPTables)

	from := v1alpha1.ModeIPTables
	var took []string
	for _, to := range []v1alpha1.ProxyMode{v1alpha1.ModeIPVS, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS, v1alpha1.ModeIPTables} {
		ok := t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
			var sessions []*netlab.Session
			for _, target := range w.targets() {
				s, err := w.client.NS.OpenSession(target, 2*time.Second)
				if err != nil {
					t.Fatalf("open a long-lived connection to %s: %v", target, err)
				}
				defer s.Close()
				sessions = append(sessions, s)
			}
			loop := netlab.StartClientLoopTimeout(t, w.client.NS, 5*time.Millisecond, connectionTimeout, w.targets()...)

			start := time.Now()
			gen, err := e2e.ApplyModeWith(w.ctx, w.c, e2e.ConfigName, to, nodeTimeout, settings)
			if err != nil {
				t.Fatal(err)
			}
			snap, err := e2e.WaitDone(w.ctx, w.c, e2e.ConfigName, gen, rolloutTimeout, func(s e2e.Snapshot) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), s.Line()) })
			if err != nil {
				t.Fatal(err)
			}
			d := time.Since(start)
			ok, failed := loop.Counts()
			loop.RequireNoFailures(t, "during the rollout to "+string(to))
			took = append(took, fmt.Sprintf("%s -> %s %.1fs (%d connections)", from, to, d.Seconds(), ok+failed))
			t.Logf("the rollout %s -> %s took %.1fs; %d new connections, %d failed", from, to, d.Seconds(), ok+failed, failed)

			if snap.Config.Status.Phase != v1alpha1.RolloutCompleted {
				t.Fatalf("the rollout to %s ended %s: %s", to, snap.Config.Status.Phase, snap.Line())
			}
			for _, pn := range snap.Nodes {
				st := pn.Status
				if st.ActiveMode != to || st.Phase != v1alpha1.NodeActive || st.ObservedConfig == nil || st.ObservedConfig.Generation != gen {
					t.Errorf("ProxyNode %s: %s, observed %+v; want %s Active for generation %d", pn.Name, e2e.NodeText(pn), st.ObservedConfig, to, gen)
				}
			}
			for i, s := range sessions {
				if err := s.Exchange("after-rollout", 2*time.Second); err != nil {
					t.Errorf("the connection opened through %s before the rollout (to %s via %s) no longer carries data: %v", from, s.Server, w.targets()[i], err)
				}
			}
			w.requireOnly(t, to)
			w.requireTraffic(t)
		})
		if !ok {
			break
		}
		from = to
	}
	t.Logf("rollouts: %v", took)
}
