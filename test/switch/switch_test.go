package switchtest

import (
	"slices"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestSwitchPairs moves a node iptables -> nftables -> iptables under a
// client that keeps opening new connections: none may fail, a TCP
// connection opened before each switch still carries data after it, the
// phases are reported in order, and afterwards the kernel holds nothing of
// the old mode (iptables-save of both variants and families, and the
// nftables ruleset). IPVS pairs run in the VM (make test-vm).
func TestSwitchPairs(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	w.startAgent()
	w.waitActive(v1alpha1.ModeIPTables)
	w.requireTraffic()
	w.requireOnly(v1alpha1.ModeIPTables)

	_, seen := w.phasesSince(0)
	for _, to := range []v1alpha1.ProxyMode{v1alpha1.ModeNFTables, v1alpha1.ModeIPTables} {
		from := other(to)
		t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
			session, err := w.lab.Client.NS.OpenSession(w.clusterIP(), 2*time.Second)
			if err != nil {
				t.Fatalf("open a long-lived connection: %v", err)
			}
			defer session.Close()
			loop := w.startClientLoop()
			time.Sleep(300 * time.Millisecond)

			w.desire(to)
			pn := w.waitActive(to)
			time.Sleep(300 * time.Millisecond)
			loop.RequireNoFailures(t, "during the switch")

			if err := session.Exchange("after-switch", 2*time.Second); err != nil {
				t.Errorf("the connection opened before the switch (to %s) no longer carries data: %v", session.Server, err)
			}
			var phases []v1alpha1.NodePhase
			phases, seen = w.phasesSince(seen)
			want := []v1alpha1.NodePhase{v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeCleaningUp, v1alpha1.NodeActive}
			if !slices.Equal(phases, want) {
				t.Errorf("phases reported %v, want %v", phases, want)
			}
			if pn.Status.Counts == nil || pn.Status.Counts.Services < 2 || pn.Status.LastSyncTime == nil {
				t.Errorf("status lacks sync figures: counts %+v lastSync %v", pn.Status.Counts, pn.Status.LastSyncTime)
			}
			w.requireOnly(to)
			w.requireTraffic()
		})
	}

	// The kernel facts are reported.
	k := w.proxyNode().Status.Kernel
	if k == nil || k.Version == "" || len(k.Modules) == 0 || k.NFTables != v1alpha1.CapabilityYes || len(k.IPTablesBackends) != 2 {
		t.Fatalf("kernel facts: %+v", k)
	}
	for _, m := range k.Modules {
		if m.Name == "nf_tables" && m.State == "" {
			t.Errorf("module %s has no state", m.Name)
		}
	}
	_ = netlab.NodeIP
}
