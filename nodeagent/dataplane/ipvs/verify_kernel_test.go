package ipvs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	libipvs "github.com/moby/ipvs"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// destinationReads counts b's reads of real servers (one netlink round
// trip per virtual service) and can end a context at the nth.
type destinationReads struct {
	n      atomic.Int32
	cancel atomic.Pointer[struct {
		at     int32
		cancel context.CancelFunc
	}]
}

func countReads(b *Backend) *destinationReads {
	r := &destinationReads{}
	open := b.openIPVS
	b.openIPVS = func() (ipvsHandle, error) {
		h, err := open()
		if err != nil {
			return nil, err
		}
		return readCounter{ipvsHandle: h, reads: r}, nil
	}
	return r
}

// cancelAt ends a context once the nth read from now has been made.
func (r *destinationReads) cancelAt(n int32, cancel context.CancelFunc) {
	r.cancel.Store(&struct {
		at     int32
		cancel context.CancelFunc
	}{r.n.Load() + n, cancel})
}

type readCounter struct {
	ipvsHandle
	reads *destinationReads
}

func (c readCounter) GetDestinations(s *libipvs.Service) ([]*libipvs.Destination, error) {
	n := c.reads.n.Add(1)
	if p := c.reads.cancel.Load(); p != nil && n == p.at {
		p.cancel()
	}
	return c.ipvsHandle.GetDestinations(s)
}

// TestVMResyncVerifiesResumesAndRepairs checks the periodic resync
// (verify.go): of an unchanged kernel it writes nothing, neither an IPVS
// call nor an nftables commit; a change preempts it between two virtual
// services, and the next one reads only those it had not verified and
// the one the change rewrote; drift (a real server deleted by another
// program) is repaired, and traffic reaches every endpoint again.
func TestVMResyncVerifiesResumesAndRepairs(t *testing.T) {
	lab, pods := newLab(t, 2)
	b := newLabBackend(t, lab)
	calls, reset := record(b)
	reads := countReads(b)
	var sps []*model.ServicePort
	for i := range 6 {
		sps = append(sps, labService(fmt.Sprintf("svc-%d", i), fmt.Sprintf("198.19.0.%d", 60+i), pods...))
	}
	m := snapshotOf(sps...)
	counts := mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	resync := dataplane.SyncRequest{Model: m, Full: true, Resync: true}
	generation := func() uint32 {
		t.Helper()
		g, err := nft.Generation(lab.Node.NS.NS())
		if err != nil {
			t.Fatal(err)
		}
		return g
	}

	// Unchanged: every virtual service read, nothing written.
	reset()
	before, gen := reads.n.Load(), generation()
	if got := mustSync(t, b, resync); got != counts {
		t.Errorf("the resync reports %+v; the full sync reported %+v", got, counts)
	}
	if got := calls(); len(got) > 0 {
		t.Errorf("a resync of an unchanged kernel made IPVS calls: %q", got)
	}
	if g := generation(); g != gen {
		t.Errorf("a resync of an unchanged kernel committed to nftables (generation %d -> %d)", gen, g)
	}
	if n := reads.n.Load() - before; n != 6 {
		t.Errorf("the resync read %d virtual services' real servers; want all 6", n)
	}

	// Preempted at the third read: nothing written, and reported as
	// preempted.
	ctx, cancel := context.WithCancel(context.Background())
	reads.cancelAt(3, cancel)
	_, err := b.Sync(ctx, resync)
	if !dataplane.Preempted(ctx, resync, err) {
		t.Fatalf("a resync whose context ended mid-way returned %v; want it preempted", err)
	}
	if got := calls(); len(got) > 0 {
		t.Errorf("a preempted resync made IPVS calls: %q", got)
	}
	// A change to svc-0, which the preempted resync had verified.
	sps[0].Endpoints = sps[0].Endpoints[:1]
	counts = mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{sps[0].Name: {}}})
	reset()
	before = reads.n.Load()
	mustSync(t, b, resync)
	if got := calls(); len(got) > 0 {
		t.Errorf("the resumed resync made IPVS calls: %q", got)
	}
	// Verified before the change: svc-0, svc-1 and svc-2 (the third read
	// ended the context after it). Left: svc-3 to svc-5, and svc-0 again.
	if n := reads.n.Load() - before; n != 4 {
		t.Errorf("the resumed resync read %d virtual services' real servers; want 4 (the 3 not verified, and the changed one)", n)
	}
	before = reads.n.Load()
	mustSync(t, b, resync)
	if n := reads.n.Load() - before; n != 6 {
		t.Errorf("the resync after a finished one read %d virtual services; want all 6 (it starts afresh)", n)
	}

	// Drift: another program deletes one of svc-3's real servers.
	h := rawHandle(t, lab)
	svc := &libipvs.Service{AddressFamily: ipv4.af, Protocol: 6, Address: vip("198.19.0.63").Addr().AsSlice(), Port: 80}
	dests, err := h.GetDestinations(svc)
	if err != nil || len(dests) != 2 {
		t.Fatalf("svc-3's real servers: %v, %v; want 2", dests, err)
	}
	if err := h.DelDestination(svc, dests[0]); err != nil {
		t.Fatal(err)
	}
	reset()
	if got := mustSync(t, b, resync); got != counts {
		t.Errorf("the repairing resync reports %+v; want %+v", got, counts)
	}
	if got := calls(); !slices.ContainsFunc(got, func(c string) bool { return strings.HasPrefix(c, "NewDestination tcp/198.19.0.63:80 ") }) {
		t.Errorf("the resync did not put the deleted real server back; IPVS calls %q", got)
	}
	if tally := lab.Client.NS.Spread(netlab.TCP, vip("198.19.0.63"), 20, okTimeout); !slices.Equal(tally.Names(), []string{"pod-a", "pod-b"}) || tally.Answered() != 20 {
		t.Errorf("svc-3 after the repair: %v; want pod-a and pod-b", tally)
	}
}
