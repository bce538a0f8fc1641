package bench

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/nftables"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestFullSyncKeepsServing: full syncs of an nftables table that serves
// 10 000 services (what a periodic resync that found drift, or a sync
// after a failed incremental one, does) translate every new connection.
// Linux 6.18 publishes the lookup array of an interval map when the
// transaction that filled it ends, after the new rules are live: when the
// endpoints were in interval maps (before the service tables of
// 2026-12-05), a full sync that created them anew left each new
// connection untranslated for about 50 ms at the end of its commit (10
// of them every rewrite here, to the first Service as to the last). Here such a
// connection is refused (Lab.RefuseServices), and every answer must come
// from one of the target's own endpoints.
func TestFullSyncKeepsServing(t *testing.T) {
	netlab.RequireRoot(t)
	lab, err := NewLab()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lab.Close() })
	// No API server: the relay is never used.
	node, err := lab.NewNode("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })

	const n, rewrites = 10000, 5
	sps := make([]*model.ServicePort, 0, n)
	for i := range n {
		opts := make([]dt.PortOpt, 0, EndpointsPerService)
		for e := range EndpointsPerService {
			ep := nthAddr(fixedPool.Addr(), (i*EndpointsPerService+e)%(1<<(32-fixedPool.Bits())))
			opts = append(opts, dt.EP(ep.String(), EndpointPort))
		}
		a := ServiceAddr(i)
		sps = append(sps, dt.Svc(namespace, ServiceName(i), "http", a.Addr().String(), int32(a.Port()), opts...))
	}
	m := dt.Snapshot(sps...)
	b, err := nftables.New(dataplane.NodeConfig{MasqueradeBit: 14}, nftables.WithNetNS(node.NS.NS()))
	if err != nil {
		t.Fatal(err)
	}
	// A connection the rules leave untranslated reaches the backends,
	// which refuse it: its failure says what happened, at once.
	if err := lab.RefuseServices(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		t.Fatal(err)
	}
	var targets []netip.AddrPort
	endpoints := map[netip.AddrPort]map[netip.Addr]bool{}
	for _, i := range []int{0, n / 2, n - 1} {
		tg := ServiceAddr(i)
		targets = append(targets, tg)
		endpoints[tg] = map[netip.Addr]bool{}
		for _, ep := range sps[i].Endpoints {
			endpoints[tg][ep.IP] = true
		}
	}
	answeredByItsOwn := func(target netip.AddrPort, ep netip.Addr) error {
		if !endpoints[target][ep] {
			return fmt.Errorf("answered by %s, not one of %s's endpoints", ep, target)
		}
		return nil
	}
	for _, tg := range targets {
		ep, _, err := node.Ask(ctx, tg, ProbeTimeout)
		if err == nil {
			err = answeredByItsOwn(tg, ep)
		}
		if err != nil {
			t.Fatalf("%s before the full syncs: %v", tg, err)
		}
	}
	// Each connection has 3 s, time for the kernel's first SYN
	// retransmission (after 1 s): a SYN lost to something other than the
	// rules (a busy machine) is sent again and counted as resent, not
	// failed. One the rules left untranslated is refused, which no
	// retransmission hides.
	pr := startProber(ctx, node, targets, 5*time.Millisecond, 3*time.Second, answeredByItsOwn)
	var syncs []string
	for range rewrites {
		time.Sleep(500 * time.Millisecond)
		start := time.Now()
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
			t.Fatal(err)
		}
		syncs = append(syncs, fmt.Sprintf("%s+%s", start.UTC().Format("15:04:05.000"), time.Since(start).Round(time.Millisecond)))
	}
	time.Sleep(500 * time.Millisecond)
	pc := pr.stop()
	if pc.Failures > 0 {
		t.Errorf("%d of %d new connections failed during %d full syncs (%d refused: left untranslated), syncs at %v UTC: %v",
			pc.Failures, pc.Connects, rewrites, pc.Refused, syncs, pc.Sample)
	}
	if pc.Connects < 100 {
		t.Errorf("only %d connections during the full syncs", pc.Connects)
	}
	t.Logf("%d connections during %d full syncs of %d services (at %v UTC), %d answered after a SYN retransmission", pc.Connects, rewrites, n, syncs, pc.Resent)
}
