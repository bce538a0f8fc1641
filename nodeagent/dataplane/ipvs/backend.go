package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/internal/text"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/forwarddrop"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Backend is the IPVS dataplane: virtual services, a dummy interface and
// a helper table. Syncs and cleanups are serialized, and Programmed and
// KernelSettings only read, so it is safe for concurrent use.
type Backend struct {
	cfg       dataplane.NodeConfig
	scheduler string
	strictARP bool
	timeouts  Timeouts
	exclude   []netip.Prefix
	netns     nsexec.NS
	// procSys is where the sysctls are read and written (/proc/sys).
	procSys string
	// openIPVS opens IPVS in the namespace; tests wrap it.
	openIPVS func() (ipvsHandle, error)

	mu sync.Mutex
	// state is what the last successful sync of each family programmed;
	// without it the next sync of the family is a full one.
	state map[*family]*familyState
	// forward reports chains of other programs that drop forwarded
	// packets by default (replies from endpoints are forwarded), which
	// the helper table cannot overrule.
	forward forwarddrop.Check
}

var _ dataplane.Backend = (*Backend)(nil)

// Option configures a Backend.
type Option func(*Backend)

// WithNetNS makes the backend program network namespace ns instead of
// the caller's: its netlink sockets are opened there, and only the
// short-lived threads that read and write sysctls enter it. The caller
// keeps ns open while the backend is used.
func WithNetNS(ns nsexec.NS) Option {
	return func(b *Backend) { b.netns = ns }
}

// WithProcSys makes the backend read and write its sysctls under dir
// instead of /proc/sys: a container whose /proc/sys is read-only (any
// unprivileged one) reaches the node's network sysctls through the host's
// /proc/sys/net mounted read-write at dir/net. The sysctls under net/ are
// those of the network namespace of the thread that opens them, whichever
// mount they are opened through.
func WithProcSys(dir string) Option {
	return func(b *Backend) {
		if dir != "" {
			b.procSys = dir
		}
	}
}

// WithScheduler sets the IPVS scheduler of every virtual service, by its
// kernel name (rr, wrr, sh...; DefaultScheduler when not set). The kernel
// refuses a scheduler it has no module for when the first virtual service
// is created.
func WithScheduler(s string) Option {
	return func(b *Backend) {
		if s != "" {
			b.scheduler = s
		}
	}
}

// WithStrictARP makes syncs set arp_ignore=1 and arp_announce=2, so that
// the node does not answer ARP for the service IPs bound to its dummy
// interface (needed with load balancers that announce them, such as
// MetalLB in layer 2 mode).
func WithStrictARP(on bool) Option {
	return func(b *Backend) { b.strictARP = on }
}

// DefaultScheduler is the scheduler of a backend made without
// WithScheduler: round robin, the API's default.
const DefaultScheduler = "rr"

// New returns a backend for the node cfg describes. It checks that IPVS
// answers in the target namespace, and fails if it does not: there is no
// fallback to another mode. It loads no kernel module (the agent loads
// the modules a mode needs when a switch to it prepares; a node where
// IPVS is not loaded holds nothing of it) and changes nothing in the
// kernel: the virtual services, addresses and rules a previous agent
// programmed keep serving until the first Sync, which is always a full
// one, so an agent restart never interrupts traffic.
func New(cfg dataplane.NodeConfig, opts ...Option) (*Backend, error) {
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("ipvs: masquerade bit %d is not 0-31", cfg.MasqueradeBit)
	}
	b := &Backend{cfg: cfg, scheduler: DefaultScheduler, state: map[*family]*familyState{}}
	for _, o := range opts {
		o(b)
	}
	b.forward = forwarddrop.Check{Mode: "ipvs", NS: b.netns, Own: []string{TableName}}
	b.openIPVS = b.openLibIPVS
	h, err := b.openIPVS()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if err := probeIPVS(h); err != nil {
		return nil, err
	}
	return b, nil
}

// Mode returns "ipvs".
func (b *Backend) Mode() string { return "ipvs" }

// ConflictError lists virtual services the model wants that exist in the
// kernel and are not the backend's. They are left alone; everything else
// is programmed: it is a dataplane.Warning, not a failed sync.
type ConflictError struct {
	// Keys are the virtual services, as protocol/address:port.
	Keys []string
}

var _ dataplane.Warning = (*ConflictError)(nil)

// Error names the virtual services.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("ipvs: %d virtual services exist that are not proxyshift's, left alone and not programmed: %s", len(e.Keys), text.List(e.Keys, ", ", 10))
}

// LeftAlone returns the virtual services.
func (e *ConflictError) LeftAlone() []string { return e.Keys }

// Sync programs the model's families (those present in req.Model.Ports).
//
// IPVS has no transactions: a sync is a sequence of netlink calls, ordered
// so that traffic is never served without its filtering (see plan). A
// sync that fails part-way leaves what it did; an incremental one that
// fails is retried at once as a full one, which reads back the kernel
// and repairs any drift, as it does on every call with req.Full; a
// periodic resync (req.Resync) verifies first and repairs only what
// differs (verify.go). A
// virtual service someone else created where the model wants one is
// left alone, and reported as a *ConflictError after everything else is
// done.
func (b *Backend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	if req.Model == nil {
		return dataplane.Counts{}, errors.New("ipvs: sync without a model")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	kn, err := b.open()
	if err != nil {
		return dataplane.Counts{}, err
	}
	defer kn.close()
	// A family the node lacks cannot be programmed (its addresses cannot
	// be bound to the dummy interface); the other one is, and the
	// missing one is reported.
	req, missing := dataplane.WithoutMissingFamilies(b.netns, b.procSys, req)
	errs := []error{missing}
	var conflicts []vsKey
	settingsDone := false
	for _, f := range families {
		ports, ok := req.Model.Ports[f.Model]
		if !ok {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if st := b.state[f]; st != nil && !req.Full {
			c, err := b.incremental(kn, f, st, ports, req.Changed)
			if err == nil {
				conflicts = append(conflicts, c...)
				continue
			}
		}
		if !settingsDone {
			// Before any virtual service takes traffic: masquerading
			// needs IPVS connections in conntrack. A resync puts back
			// settings someone changed, as a full sync does.
			if err := b.setSysctls(); err != nil {
				errs = append(errs, err)
			}
			if err := b.setTimeouts(kn); err != nil {
				errs = append(errs, err)
			}
			settingsDone = true
		}
		if st := b.state[f]; st != nil && req.Resync {
			why, err := kn.verify(ctx, f, st)
			if ctx.Err() != nil {
				errs = append(errs, ctx.Err())
				break
			}
			if err == nil && why == "" {
				conflicts = append(conflicts, st.conflicts...)
				continue
			}
			klog.InfoS("Periodic resync repairs IPVS", "family", f.Name, "reason", why, "err", err)
		}
		c, err := b.full(kn, f, ports)
		conflicts = append(conflicts, c...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(conflicts) > 0 {
		ce := &ConflictError{}
		for _, k := range conflicts {
			ce.Keys = append(ce.Keys, k.String())
		}
		errs = append(errs, ce)
	}
	if _, rest := dataplane.SplitWarnings(errors.Join(errs...)); rest == nil {
		if w := b.forward.Sync(ctx, req.Full); w != nil {
			errs = append(errs, w)
		}
	}
	var c dataplane.Counts
	for _, st := range b.state {
		c = plus(c, st.counts(), 1)
	}
	return c, errors.Join(errs...)
}

// renderConfig returns what rendering family f depends on, reading the
// node's addresses when NodePorts answer on all of them.
func (b *Backend) renderConfig(kn *kernel, f *family) (*renderConfig, error) {
	rc := &renderConfig{f: f, policy: dataplane.NewNodePolicy(b.cfg, f.Model), scheduler: string(b.scheduler), exclude: b.exclude}
	rc.nodePortIPs = rc.policy.NodePortIPs
	if rc.policy.NodePortsAnyLocal {
		var err error
		if rc.nodePortIPs, err = kn.localAddrs(f, rc.policy.Loopback); err != nil {
			return nil, err
		}
	}
	return rc, nil
}

// full reads back what the kernel holds for the family and brings it to
// the model.
func (b *Backend) full(kn *kernel, f *family, ports map[model.ServicePortName]*model.ServicePort) ([]vsKey, error) {
	rc, err := b.renderConfig(kn, f)
	if err != nil {
		return nil, err
	}
	tc, err := kn.readTable(f, false)
	if err != nil {
		return nil, err
	}
	kv := &kernelView{}
	if kv.addrs, err = kn.dummyAddrs(f); err != nil {
		return nil, err
	}
	known := map[vsKey]bool{}
	if old := b.state[f]; old != nil {
		for k := range old.owners {
			known[k] = true
		}
	}
	if kv.services, kv.foreign, err = kn.readServices(f, tc.records, kv.addrs, known); err != nil {
		return nil, err
	}
	st, conflicts := newState(rc, ports, kv.foreign)
	st.conflicts = conflicts
	// Until the plan is applied whole, the next sync must be full.
	delete(b.state, f)
	if err := kn.apply(f, st, fullPlan(st, kv)); err != nil {
		return conflicts, err
	}
	b.state[f] = st
	return conflicts, nil
}

// incremental rewrites what the changed service ports had. It writes to
// the helper table only while it is still ours (a full sync reads it,
// and refuses one another program put in its place).
func (b *Backend) incremental(kn *kernel, f *family, st *familyState, ports map[model.ServicePortName]*model.ServicePort, changed model.ChangeSet) ([]vsKey, error) {
	if _, err := nft.FindTable(kn.netns, f.Family, TableName); err != nil {
		delete(b.state, f)
		return nil, err
	}
	changes, conflicts := changesFor(st, ports, changed)
	if p := incrementalPlan(st, changes); !p.empty() {
		if err := kn.apply(f, st, p); err != nil {
			delete(b.state, f)
			return nil, err
		}
	}
	st.commit(changes)
	return conflicts, nil
}

// Programmed reads back what the kernel holds for the backend, in both
// families: Services counts the service ports the helper table records
// a live virtual service for, Endpoints the distinct real servers of
// each, Rules the virtual services, real servers, helper-table elements
// and rules.
func (b *Backend) Programmed(ctx context.Context) (dataplane.Counts, error) {
	kn, err := b.open()
	if err != nil {
		return dataplane.Counts{}, err
	}
	defer kn.close()
	return dataplane.SumFamilies(ctx, families, kn.programmed)
}

// programmed reads back what the kernel holds for family f.
func (kn *kernel) programmed(f *family) (dataplane.Counts, error) {
	var total dataplane.Counts
	tc, ours, err := kn.ours(f, true, nil)
	if err != nil {
		return total, err
	}
	total.Rules += tc.elements + tc.rules
	endpoints := map[string]map[netip.AddrPort]bool{}
	for k, vs := range ours {
		total.Rules += 1 + len(vs.dests)
		port, recorded := tc.records[k]
		if !recorded {
			continue
		}
		if endpoints[port] == nil {
			endpoints[port] = map[netip.AddrPort]bool{}
		}
		for d := range vs.dests {
			endpoints[port][d] = true
		}
	}
	total.Services += len(endpoints)
	for _, eps := range endpoints {
		total.Endpoints += len(eps)
	}
	return total, nil
}

// ours reads family f's helper table (counting its rules and elements
// with counts) and the virtual services in the kernel that are ours
// (readServices; known are those the last sync programmed).
func (kn *kernel) ours(f *family, counts bool, known map[vsKey]bool) (*tableContents, map[vsKey]*virtualService, error) {
	tc, err := kn.readTable(f, counts)
	if err != nil {
		return nil, nil, err
	}
	addrs, err := kn.dummyAddrs(f)
	if err != nil {
		return nil, nil, err
	}
	ours, _, err := kn.readServices(f, tc.records, addrs, known)
	return tc, ours, err
}

// Present says whether the node holds any object of the backend (its
// dummy interface or a helper table), programmed by this process or not:
// whether this node has, or had and never cleaned up, IPVS mode.
func (b *Backend) Present(context.Context) (bool, error) {
	kn, err := b.open()
	if err != nil {
		return false, err
	}
	defer kn.close()
	if l, err := kn.dummy(false); err != nil || l != nil {
		return l != nil, err
	}
	return kn.tableExists()
}

// Cleanup removes everything the backend owns: its virtual services (as
// Programmed and the last sync know them; never anyone else's, nor those
// in an excluded CIDR), the dummy interface with its addresses, and the
// helper tables. It returns one line per removed object. The next Sync is
// a full one.
func (b *Backend) Cleanup(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	kn, err := b.open()
	if err != nil {
		return nil, err
	}
	defer kn.close()
	var removed []string
	var errs []error
	for _, f := range families {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		known := map[vsKey]bool{}
		if st := b.state[f]; st != nil {
			for k := range st.owners {
				known[k] = true
			}
		}
		tc, ours, err := kn.ours(f, false, known)
		if err != nil {
			return removed, err
		}
		gone := deletable(b.exclude, slices.SortedFunc(maps.Keys(ours), compareKeys))
		// The connections IPVS forwarded through them, read before they
		// go, are handed over to conntrack's NAT after (handover.go). A
		// failed handover fails this Cleanup, and the next one, with
		// nothing left to delete, succeeds.
		var flows []forwardedFlow
		if len(gone) > 0 {
			deleted := map[vsKey]bool{}
			for _, k := range gone {
				deleted[k] = true
			}
			if flows, err = kn.forwarded(f, deleted); err != nil {
				errs = append(errs, err)
			}
		}
		if len(flows) > 0 {
			if err := kn.blockFlows(f, flows); err != nil {
				errs = append(errs, fmt.Errorf("ipvs: hold the packets of the connections to hand over: %w", err))
			}
		}
		for _, k := range gone {
			if err := kn.removeServices(f, []vsKey{k}); err != nil {
				errs = append(errs, err)
				continue
			}
			line := "IPVS virtual service " + k.String()
			if port := tc.records[k]; port != "" {
				line += " (" + port + ")"
			}
			removed = append(removed, line)
		}
		if len(flows) > 0 {
			n, err := kn.handOver(ctx, f, flows)
			if err != nil {
				errs = append(errs, err)
			}
			removed = append(removed, fmt.Sprintf("IPVS's translation of %d of %d connections (handed over to conntrack NAT entries)", n, len(flows)))
		}
	}
	b.state = map[*family]*familyState{}
	if l, err := kn.dummy(false); err != nil {
		errs = append(errs, err)
	} else if l != nil {
		if err := kn.nl.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: delete interface %s: %w", DummyInterface, err))
		} else {
			removed = append(removed, "dummy interface "+DummyInterface+" with its addresses")
		}
	}
	for _, f := range families {
		line, err := kn.deleteTable(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("ipvs: %w", err))
		} else if line != "" {
			removed = append(removed, line)
		}
	}
	return removed, errors.Join(errs...)
}
