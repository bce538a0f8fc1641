package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestVMCleanupHandsConnectionsOver checks that connections IPVS
// forwarded outlive Cleanup: established through a cluster IP and a
// NodePort (both masqueraded, the client is outside the cluster CIDRs),
// they keep exchanging data after Cleanup deleted every object of the
// backend, with no other mode programmed at all: their translation is
// conntrack's now. A new connection then finds nothing.
func TestVMCleanupHandsConnectionsOver(t *testing.T) {
	lab, pods := newLab(t, 2)
	b := newLabBackend(t, lab)
	sp := labService("web", "198.19.0.70", pods...)
	sp.NodePort = 30070
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(sp), Full: true})

	var sessions []*netlab.Session
	for _, target := range []netip.AddrPort{vip("198.19.0.70"), netip.AddrPortFrom(netlab.NodeIP, 30070)} {
		for range 2 {
			s, err := lab.Client.NS.OpenSession(target, okTimeout)
			if err != nil {
				t.Fatalf("connect to %s: %v", target, err)
			}
			defer s.Close()
			sessions = append(sessions, s)
		}
	}
	removed, err := b.Cleanup(context.Background())
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	t.Logf("cleanup removed %q", removed)
	if !strings.Contains(strings.Join(removed, "\n"), fmt.Sprintf("%d of %d connections", len(sessions), len(sessions))) {
		t.Errorf("cleanup removed %q; want every one of the %d connections handed over", removed, len(sessions))
	}
	if got := dumpIPVS(t, rawHandle(t, lab)); got != "" {
		t.Errorf("after cleanup the kernel holds\n%s", got)
	}
	for i, s := range sessions {
		for j := range 3 {
			if err := s.Exchange(fmt.Sprintf("after-cleanup-%d", j), okTimeout); err != nil {
				t.Errorf("connection %d (to %s) after cleanup: %v", i, s.Server, err)
				break
			}
		}
	}
	if _, err := lab.Client.NS.Request(netlab.TCP, vip("198.19.0.70"), okTimeout); err == nil {
		t.Errorf("a new connection to the cluster IP was answered after cleanup")
	}
}
