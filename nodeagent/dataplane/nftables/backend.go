package nftables

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/forwarddrop"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Backend is the nftables dataplane. It is safe for concurrent use: syncs
// and cleanups are serialized, Programmed and Present only read.
type Backend struct {
	cfg   dataplane.NodeConfig
	netns nsexec.NS
	// policy is the node's policy for each family.
	policy map[*family]*dataplane.NodePolicy

	mu sync.Mutex
	// state is what the last successful sync of each family programmed;
	// without it the next sync of the family is a full one.
	state map[*family]*familyState
	// stale are chains already flushed and unreferenced, to delete.
	stale map[*family]map[string]bool
	// forward reports chains of other programs that drop forwarded
	// packets by default, which this table cannot overrule.
	forward forwarddrop.Check
	// gen, when genKnown, is a ruleset generation (nft.Generation) at
	// which the kernel was known to hold exactly the state: set by a
	// periodic resync that verified every family and saw the generation
	// stay, or by a full sync that nothing else committed beside (from
	// its reading of the table to its commit), moved on by each commit
	// of ours that follows it directly.
	// While the generation stays there, a resync has nothing to verify.
	gen      uint32
	genKnown bool
}

// familyState is what the backend knows it programmed in one family.
type familyState struct {
	rs     *ruleset
	claims claimIndex
	// counts are rs.counts(), kept up to date by incremental syncs so
	// that they need not walk every port.
	counts dataplane.Counts
	// verified is how far a preempted verification got (see verify).
	verified verifyProgress
}

var _ dataplane.Backend = (*Backend)(nil)

// Option configures a Backend.
type Option func(*Backend)

// WithNetNS makes the backend program network namespace ns instead of
// the caller's, without switching any thread's namespace. The caller
// keeps ns open while the backend is used.
func WithNetNS(ns nsexec.NS) Option {
	return func(b *Backend) { b.netns = ns }
}

// New returns a backend for the node cfg describes. It does not touch the
// kernel: the rules a previous agent programmed keep working until the
// first Sync replaces them, in one transaction per family, so an agent
// restart never interrupts traffic. The first Sync is always full.
func New(cfg dataplane.NodeConfig, opts ...Option) (*Backend, error) {
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("nftables: masquerade bit %d is not 0-31", cfg.MasqueradeBit)
	}
	b := &Backend{
		cfg:    cfg,
		policy: map[*family]*dataplane.NodePolicy{},
		state:  map[*family]*familyState{},
		stale:  map[*family]map[string]bool{},
	}
	for _, f := range families {
		b.policy[f] = newNodePolicy(f, cfg)
	}
	for _, o := range opts {
		o(b)
	}
	b.forward = forwarddrop.Check{Mode: "nftables", NS: b.netns, Own: []string{TableName}}
	return b, nil
}

// Mode returns "nftables".
func (b *Backend) Mode() string { return "nftables" }

// Sync programs the model's families (those present in req.Model.Ports)
// into the table of each, one transaction per family.
//
// An incremental sync rewrites only the objects of the service ports in
// req.Changed. If the kernel rejects it (something we expected to find
// is gone) it is retried at once as a full sync, which rewrites the whole
// table from the model and so repairs any drift; a full sync that fails
// in place is retried as a replacement of the whole table. Callers should
// still ask for a full sync now and then, since drift that an incremental
// sync does not trip over (a flushed chain) is only repaired by one. A
// periodic one (req.Resync) reads the table back first and rewrites it
// only when it differs from what the backend programmed (see verify).
func (b *Backend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	req, missing := dataplane.WithoutMissingFamilies(b.netns, "", req)
	errs := []error{missing}
	var g0 uint32
	var genErr error
	if req.Resync {
		g0, genErr = nft.Generation(b.netns)
	}
	if !(req.Resync && genErr == nil && b.quiet(g0, req)) {
		errs = append(errs, b.syncFamilies(ctx, req, g0, genErr))
	}
	// The forward hook's other chains are looked at even when the
	// resync had nothing to verify: iptables-legacy's FORWARD policy
	// does not move the nf_tables generation.
	if _, rest := dataplane.SplitWarnings(errors.Join(errs...)); rest == nil {
		if w := b.forward.Sync(ctx, req.Full); w != nil {
			errs = append(errs, w)
		}
	}
	return b.counts(), errors.Join(errs...)
}

// syncFamilies syncs every family of req. After a periodic resync that
// verified (or repaired) every family with nothing else committing
// meanwhile, it records that the kernel holds the state at generation
// g0 (read before, genErr its error).
func (b *Backend) syncFamilies(ctx context.Context, req dataplane.SyncRequest, g0 uint32, genErr error) error {
	if err := dataplane.SyncFamilies(ctx, req, families, familyKey, func(f *family, ports map[model.ServicePortName]*model.ServicePort) error {
		return b.syncFamily(ctx, f, ports, req)
	}); err != nil {
		return err
	}
	if req.Resync && genErr == nil {
		if g, err := nft.Generation(b.netns); err == nil && g == g0 {
			b.gen, b.genKnown = g0, true
		}
	}
	return nil
}

// counts adds up what every family programmed.
func (b *Backend) counts() dataplane.Counts {
	var c dataplane.Counts
	for _, st := range b.state {
		c = c.Plus(st.counts)
	}
	return c
}

// quiet says whether a periodic resync of req has nothing to do: nothing
// committed to nf_tables since the kernel was known to hold the state (at
// generation gen), every family of the model has a state, and none needs
// a rewrite whatever the kernel holds (rewriteReason).
func (b *Backend) quiet(gen uint32, req dataplane.SyncRequest) bool {
	if !b.genKnown || gen != b.gen || req.Model == nil {
		return false
	}
	for _, f := range families {
		if _, ok := req.Model.Ports[f.Model]; !ok {
			continue
		}
		if st := b.state[f]; st == nil || rewriteReason(st.rs) != "" {
			return false
		}
	}
	return true
}

// syncFamily syncs one family, refusing (with a *nft.ForeignTableError)
// a table of our name that another program created.
func (b *Backend) syncFamily(ctx context.Context, f *family, ports map[model.ServicePortName]*model.ServicePort, req dataplane.SyncRequest) error {
	if _, err := nft.FindTable(b.netns, f, TableName); err != nil {
		delete(b.state, f)
		return fmt.Errorf("nftables: %w", err)
	}
	st := b.state[f]
	switch {
	case st != nil && req.Resync:
		why := rewriteReason(st.rs)
		if why == "" {
			var err error
			if why, err = b.verify(ctx, f, st); err != nil || why == "" {
				return err
			}
		}
		klog.InfoS("Periodic resync rewrites the nftables table", "family", f.Name, "reason", why)
	case st != nil && !req.Full:
		if err := b.incremental(f, st, ports, req.Changed); err == nil {
			return nil
		}
	}
	return b.full(ctx, f, ports)
}

// rewriteReason says why a periodic resync must rewrite the table whatever
// the kernel holds ("" when it need not): a port lost a shared key to
// another (ruleset.contested), or incremental syncs left the endpoint
// maps sparse (port ids are compacted only by a rewrite).
func rewriteReason(rs *ruleset) string {
	switch {
	case rs.contested:
		return "a service port waits for a key another one held"
	case int(rs.nextID) > 2*len(rs.ports)+4*endpointMapPorts:
		return fmt.Sprintf("port ids run to %d for %d ports", rs.nextID, len(rs.ports))
	}
	return ""
}

// full rewrites the family's table from the model. The state of the
// previous sync is let go first: a full sync does not read it, and at
// 10k services it is as large as the ruleset rendered now. Should the
// sync fail, the next one is a full one without it, as it would be.
func (b *Backend) full(ctx context.Context, f *family, ports map[model.ServicePortName]*model.ServicePort) error {
	delete(b.state, f)
	rs, claims := render(f, ports, b.policy[f])
	listedAt, genErr := nft.Generation(b.netns)
	kt, err := b.list(ctx, f)
	if err != nil {
		return err
	}
	ops, stale := fullPlan(rs, kt)
	if err := b.commit(f, ops); err != nil {
		if err2 := b.commit(f, replacePlan(rs, kt != nil)); err2 != nil {
			return fmt.Errorf("nftables: sync %s table: %w", f.Name, errors.Join(err, err2))
		}
		stale = nil
	} else if after, err := nft.Generation(b.netns); genErr == nil && err == nil && after == listedAt+1 {
		// Nothing else committed from the listing the plan was made
		// from to the plan's commit: the table is what was planned,
		// and the next periodic resync has nothing to verify.
		b.gen, b.genKnown = after, true
	}
	rs.written()
	b.state[f] = &familyState{rs: rs, claims: claims, counts: rs.counts()}
	b.stale[f] = map[string]bool{}
	for _, c := range stale {
		b.stale[f][c] = true
	}
	b.deleteStale(f)
	return nil
}

// incremental rewrites the objects of the changed service ports.
func (b *Backend) incremental(f *family, st *familyState, ports map[model.ServicePortName]*model.ServicePort, changed model.ChangeSet) error {
	changes := planChanges(f, st, ports, changed, b.policy[f])
	if len(changes) == 0 {
		return nil
	}
	ops, stale := incrementalPlan(changes, st.rs.counted, st.rs.endpointMaps)
	if err := b.commit(f, ops); err != nil {
		return err
	}
	for _, ch := range changes {
		if ch.new != nil {
			ch.new.written()
		}
	}
	st.counts.Rules -= st.rs.counted.len()
	for _, ch := range changes {
		if ch.old != nil {
			st.claims.release(ch.name, ch.old)
			st.rs.counted.add(ch.old, -1)
			st.rs.endpointMaps.addEndpointMap(ch.old, -1)
			st.counts = st.counts.Minus(ch.old.counts())
		}
	}
	for _, ch := range changes {
		if ch.new == nil {
			delete(st.rs.ports, ch.name)
			continue
		}
		st.claims.claim(ch.name, ch.new)
		st.rs.ports[ch.name] = ch.new
		st.rs.nextID = max(st.rs.nextID, ch.new.id+1)
		st.rs.counted.add(ch.new, 1)
		st.rs.endpointMaps.addEndpointMap(ch.new, 1)
		st.counts = st.counts.Plus(ch.new.counts())
	}
	st.counts.Rules += st.rs.counted.len()
	st.rs.contested = st.rs.contested || slices.ContainsFunc(changes, func(ch portChange) bool { return ch.lostKey })
	// A chain flushed by an earlier sync may be wanted again: it exists,
	// empty, and this sync has refilled it.
	for _, c := range stale {
		b.stale[f][c] = true
	}
	for _, ch := range changes {
		if ch.new != nil {
			for _, c := range ch.new.chains {
				delete(b.stale[f], c.Name)
			}
		}
	}
	b.deleteStale(f)
	return nil
}

// planChanges renders the changed ports (a changed name absent from the
// model was deleted) and pairs them with what was programmed for them.
// A key of a shared map that an unchanged port holds stays with it. A
// port keeps its id; a new one gets the next unused (st.rs.nextID on).
func planChanges(f *family, st *familyState, ports map[model.ServicePortName]*model.ServicePort, changed model.ChangeSet, np *dataplane.NodePolicy) []portChange {
	var changes []portChange
	batch := claimIndex{}
	nextID := st.rs.nextID
	for _, name := range model.SortedNames(changed) {
		old := st.rs.ports[name]
		sp := ports[name]
		if sp == nil && old == nil {
			continue
		}
		var nw *portObjects
		contested := false
		if sp != nil {
			id := nextID
			if old != nil {
				id = old.id
			} else {
				nextID++
			}
			nw = renderPort(f, sp, np, id)
			for i := range nw.shared {
				sh := &nw.shared[i]
				kept := sh.elems[:0]
				for _, e := range sh.elems {
					if owner, ok := st.claims[sh.set][e.keyText()]; ok && owner != name {
						if _, alsoChanged := changed[owner]; !alsoChanged {
							contested = true
							continue
						}
					}
					kept = append(kept, e)
				}
				sh.elems = kept
			}
			if batch.claim(name, nw) {
				contested = true
			}
		}
		changes = append(changes, portChange{name: name, old: old, new: nw, lostKey: contested})
	}
	return changes
}

// deleteStale deletes the chains a sync left flushed and unreferenced.
// It runs as a transaction of its own, after the one that dropped the
// last reference: kernels before 6.2 notice a chain is no longer
// referenced by a map element only some time after the element is gone,
// and refuse to delete it until then. What fails now is retried after
// the next sync; an empty chain nothing jumps to is harmless meanwhile.
func (b *Backend) deleteStale(f *family) {
	if len(b.stale[f]) == 0 {
		return
	}
	var ops []op
	for _, c := range slices.Sorted(maps.Keys(b.stale[f])) {
		ops = append(ops, op{kind: opDelChain, name: c})
	}
	if b.commit(f, ops) == nil {
		b.stale[f] = map[string]bool{}
	}
}

// commit sends ops as one transaction on the family's table. The known
// generation (Backend.gen) moves on with it when nothing else committed
// since and meanwhile; otherwise it is forgotten.
func (b *Backend) commit(f *family, ops []op) error {
	if len(ops) == 0 {
		return nil
	}
	before, genErr := nft.Generation(b.netns)
	follows := genErr == nil && b.genKnown && before == b.gen
	b.genKnown = false
	t := nft.NewTxn(b.netns)
	if err := queue(t, f, ops); err != nil {
		return err
	}
	err := t.Commit()
	want := before + 1
	if err != nil {
		want = before // a rejected transaction commits nothing
	}
	if after, gerr := nft.Generation(b.netns); follows && gerr == nil && after == want {
		b.gen, b.genKnown = after, true
	}
	return err
}

// ownChains reads the chains of the family's table, by name, with r
// (nft.Reader: one dump of the family's chains, read in large batches).
// The kernel sends every chain of the family, and iptables-nft's tables
// beside ours can hold 110 000 (kube-proxy's or proxyshift's iptables
// mode at 10 000 services, during a switch), which google/nftables'
// listing read in 10 s.
func ownChains(r *nft.Reader, f *family) (map[string]*nftables.Chain, error) {
	chains := map[string]*nftables.Chain{}
	err := r.EachChain(func(c *nftables.Chain) {
		if c.Table.Name == TableName {
			chains[c.Name] = c
		}
	})
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s chains: %w", f.Name, err)
	}
	return chains, nil
}

// list reads the definitions of the chains and named sets of the
// family's table; nil if there is no table.
func (b *Backend) list(ctx context.Context, f *family) (*kernelTable, error) {
	conn, t, err := nft.OpenTable(b.netns, f, TableName)
	if err != nil || t == nil {
		return nil, err
	}
	r, err := nft.NewReader(ctx, b.netns, f.Table, TableName)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	kt := &kernelTable{sets: map[string]*nftables.Set{}}
	if kt.chains, err = ownChains(r, f); err != nil {
		return nil, err
	}
	sets, err := conn.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s sets: %w", f.Name, err)
	}
	for _, s := range sets {
		if !s.Anonymous {
			kt.sets[s.Name] = s
		}
	}
	if kt.userdata, err = nft.SetUserdata(b.netns, f.Table, TableName); err != nil {
		return nil, err
	}
	return kt, nil
}

// Programmed reads back what the kernel holds in both families' tables:
// Services counts the service ports with elements in the shared maps,
// Endpoints the distinct endpoints of each port in the service-endpoints
// maps plus the endpoint chains with rules (ClientIP affinity), Rules
// every rule plus every element of the maps and sets a sync writes (not
// the affinity sets, which the packet path fills).
func (b *Backend) Programmed(ctx context.Context) (dataplane.Counts, error) {
	return dataplane.SumFamilies(ctx, families, func(f *family) (dataplane.Counts, error) { return b.programmed(ctx, f) })
}

// programmed reads back what the kernel holds in family f's table; a
// table of our name that is not ours is a *nft.ForeignTableError.
func (b *Backend) programmed(ctx context.Context, f *family) (dataplane.Counts, error) {
	var total dataplane.Counts
	conn, t, err := nft.OpenTable(b.netns, f, TableName)
	if err != nil {
		return total, fmt.Errorf("nftables: %w", err)
	}
	if t == nil {
		return total, nil
	}
	sets, err := conn.GetSets(t)
	if err != nil {
		return total, fmt.Errorf("nftables: list %s sets: %w", f.Name, err)
	}
	r, err := nft.NewReader(ctx, b.netns, f.Table, TableName)
	if err != nil {
		return total, err
	}
	defer r.Close()
	// services holds the name hashes of the service ports seen;
	// endpoints the distinct endpoints of each service port, as its map
	// (an index into sets), the choice within it and the element's data
	// (ip . port, each field padded to 4 bytes: at most 20).
	services := map[[hashLen]byte]bool{}
	type endpoint struct {
		set  int32
		port byte
		data [20]byte
	}
	endpoints := map[endpoint]bool{}
	// elements holds the distinct elements seen (see distinctElements).
	elements := newDistinctElements()
	for i, s := range sets {
		if s.Anonymous || s.HasTimeout {
			continue
		}
		isEndpoints := strings.HasPrefix(s.Name, prefixEndpointMap) && kernelDataMap(s)
		err := r.EachElement(s.Name, func(e nftables.SetElement) {
			if e.IntervalEnd {
				return
			}
			elements.add(i, e.Key)
			if sharedMaps[s.Name] && e.Comment != "" {
				services[nameHash(e.Comment)] = true
			}
			if isEndpoints && len(e.Key) == 4 {
				// The key's first 16 bits are the choice within the map,
				// id<<1|local modulo 2*endpointMapPorts (choiceKey).
				ep := endpoint{set: int32(i), port: e.Key[1] >> 1}
				copy(ep.data[:], e.Val)
				endpoints[ep] = true
			}
		})
		if err != nil {
			return total, fmt.Errorf("nftables: list %s set %s: %w", f.Name, s.Name, err)
		}
	}
	total.Rules += elements.count()
	total.Endpoints += len(endpoints)
	counts, err := r.RuleCounts()
	if err != nil {
		return total, err
	}
	for chain, n := range counts {
		total.Rules += n
		if strings.HasPrefix(chain, prefixEndpoint) && n > 0 {
			total.Endpoints++
		}
		// A port's chains always hold rules; a stale one is empty.
		if h := portHash(chain); h != "" && n > 0 {
			services[[hashLen]byte([]byte(h))] = true
		}
	}
	total.Services += len(services)
	return total, nil
}

// distinctElements counts the distinct elements a read-back lists, by
// set and key. A dump of a hash set that the kernel is resizing (its
// deferred rehash, right after a sync added elements) can list an
// element twice: rhashtable_walk_next starts the walk again when the
// table changes under it, and nf_tables' walk goes on. Counting what the
// dump lists would then report more elements than the sync wrote, and a
// switch's Verifying compares the two (TestKernelRandomModels, in CI, by
// 3 of 189). Interval sets are counted the same way, the kernel's
// publication of their lookup arrays after a commit being as asynchronous.
// Keys are hashed (maphash): a read-back of 10 000 services lists
// 120 000 of them.
type distinctElements struct {
	seed maphash.Seed
	seen map[distinctElement]struct{}
}

// distinctElement is one element: its set's index and its key's hash.
type distinctElement struct {
	set int
	key uint64
}

func newDistinctElements() *distinctElements {
	return &distinctElements{seed: maphash.MakeSeed(), seen: map[distinctElement]struct{}{}}
}

// add counts the element of the set numbered set whose key is key.
func (d *distinctElements) add(set int, key []byte) {
	d.seen[distinctElement{set, maphash.Bytes(d.seed, key)}] = struct{}{}
}

// count is the number of distinct elements added.
func (d *distinctElements) count() int { return len(d.seen) }

// Present says whether the proxyshift table exists in either family:
// whether this node has (or had, if it was never cleaned up) nftables
// mode programmed, as an agent starting up needs to know. A table of that
// name another program created is not proxyshift's and does not count
// (Sync, Programmed and Cleanup report it).
func (b *Backend) Present(context.Context) (bool, error) {
	return nft.TableExists(b.netns, TableName)
}

// Cleanup deletes the proxyshift table of both families, with everything
// in it, and returns one line per deleted table. Missing tables are not an
// error; a table of our name that another program created is left as it
// is and reported (*nft.ForeignTableError), after the other family is
// cleaned up. The next Sync is a full one.
func (b *Backend) Cleanup(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state = map[*family]*familyState{}
	b.stale = map[*family]map[string]bool{}
	b.genKnown = false
	var removed []string
	var errs []error
	for _, f := range families {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		line, err := nft.DeleteTable(b.netns, f, TableName)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables: %w", err))
		}
		if line != "" {
			removed = append(removed, line)
		}
	}
	return removed, errors.Join(errs...)
}

// sharedMaps are the maps whose elements belong to service ports.
var sharedMaps = map[string]bool{
	mapServiceIPs: true, mapServiceNodePorts: true, mapNoEndpointServices: true,
	mapNoEndpointNodePorts: true, mapFirewallIPs: true,
}

// counts are the sizes of a ruleset, as Programmed reads them back.
func (rs *ruleset) counts() dataplane.Counts {
	var c dataplane.Counts
	for _, ch := range rs.chains {
		c.Rules += len(ch.Rules)
	}
	for _, s := range rs.sets {
		c.Rules += len(s.elems)
	}
	c.Rules += rs.counted.len()
	for _, objs := range rs.ports {
		c = c.Plus(objs.counts())
	}
	return c
}

// counts are one port's share of its ruleset's counts (the counted sets
// aside, whose elements ports share).
func (objs *portObjects) counts() dataplane.Counts {
	var c dataplane.Counts
	shared := 0
	for _, sh := range objs.shared {
		shared += len(sh.elems)
	}
	if shared > 0 {
		c.Services++
	}
	c.Rules += shared + objs.endpointElemCount()
	c.Endpoints += objs.endpoints
	for _, ch := range objs.chains {
		c.Rules += len(ch.Rules)
	}
	for _, s := range objs.sets {
		c.Rules += len(s.elems)
	}
	return c
}

// familyKey is the model family a table family programs.
func familyKey(f *family) corev1.IPFamily { return f.Model }

// CheckOwned returns nil when table name of family fam (famName in
// messages: ip, ip6, inet) in network namespace netns carries
// proxyshift's mark or does not exist, and an error naming it when it
// exists without the mark: another program's look-alike, which
// proxyshift must leave alone (see nft.OwnerComment).
func CheckOwned(netns nsexec.NS, fam nftables.TableFamily, famName, name string) error {
	_, err := nft.CheckOwned(netns, fam, famName, name)
	return err
}
