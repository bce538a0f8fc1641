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
	stale map[*family]map[tableChain]bool
	// forward reports chains of other programs that drop forwarded
	// packets by default, which this table cannot overrule.
	forward forwarddrop.Check
	// gen, when genKnown, is a ruleset generation (nft.Generation) at
	// which the kernel was known to hold exactly the state: set by a
	// periodic resync that verified every family and saw the generation
	// stay, or by a full sync that nothing else committed beside (from
	// its reading of the tables to its commits), moved on by each commit
	// of ours that follows it directly.
	// While the generation stays there, a resync has nothing to verify.
	gen      uint32
	genKnown bool
}

// tableChain names a chain of one of a family's tables.
type tableChain struct{ table, chain string }

// familyState is what the backend knows it programmed in one family.
type familyState struct {
	ts     tables
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
// first Sync replaces them, in one transaction per table, so an agent
// restart never interrupts traffic. The first Sync is always full.
func New(cfg dataplane.NodeConfig, opts ...Option) (*Backend, error) {
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("nftables: masquerade bit %d is not 0-31", cfg.MasqueradeBit)
	}
	b := &Backend{
		cfg:    cfg,
		policy: map[*family]*dataplane.NodePolicy{},
		state:  map[*family]*familyState{},
		stale:  map[*family]map[tableChain]bool{},
	}
	for _, f := range families {
		b.policy[f] = newNodePolicy(f, cfg)
	}
	for _, o := range opts {
		o(b)
	}
	b.forward = forwarddrop.Check{Mode: "nftables", NS: b.netns, Own: TableNames()}
	return b, nil
}

// Mode returns "nftables".
func (b *Backend) Mode() string { return "nftables" }

// Sync programs the model's families (those present in req.Model.Ports)
// into the tables of each, one transaction per table.
//
// An incremental sync rewrites only the objects of the service ports in
// req.Changed. If the kernel rejects it (something we expected to find
// is gone) it is retried at once as a full sync, which rewrites the whole
// tables from the model and so repairs any drift; a full sync that fails
// in place is retried as a replacement of the table. Callers should
// still ask for a full sync now and then, since drift that an incremental
// sync does not trip over (a flushed chain) is only repaired by one. A
// periodic one (req.Resync) reads the tables back first and rewrites
// them only when they differ from what the backend programmed (see
// verify).
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
		if st := b.state[f]; st == nil || rewriteReason(st.ts) != "" {
			return false
		}
	}
	return true
}

// syncFamily syncs one family, refusing (with a *nft.ForeignTableError)
// a table of one of our names that another program created.
func (b *Backend) syncFamily(ctx context.Context, f *family, ports map[model.ServicePortName]*model.ServicePort, req dataplane.SyncRequest) error {
	if _, err := nft.FindTables(b.netns, f, TableNames()); err != nil {
		delete(b.state, f)
		return fmt.Errorf("nftables: %w", err)
	}
	st := b.state[f]
	switch {
	case st != nil && req.Resync:
		why := rewriteReason(st.ts)
		if why == "" {
			var err error
			if why, err = b.verify(ctx, f, st); err != nil || why == "" {
				return err
			}
		}
		klog.InfoS("Periodic resync rewrites the nftables tables", "family", f.Name, "reason", why)
	case st != nil && !req.Full:
		if err := b.incremental(f, st, ports, req.Changed); err == nil {
			return nil
		}
	}
	return b.full(ctx, f, ports)
}

// rewriteReason says why a periodic resync must rewrite the tables
// whatever the kernel holds ("" when it need not): a port lost a shared
// key to another (ruleset.contested).
func rewriteReason(ts tables) string {
	if ts.main().contested {
		return "a service port waits for a key another one held"
	}
	return ""
}

// full rewrites the family's tables from the model, one transaction per
// table, the main table first (see commit). The state of the previous
// sync is let go first: a full sync does not read it, and at 10k
// services it is as large as the rulesets rendered now. Should the sync
// fail, the next one is a full one without it, as it would be.
func (b *Backend) full(ctx context.Context, f *family, ports map[model.ServicePortName]*model.ServicePort) error {
	delete(b.state, f)
	ts, claims := render(f, ports, b.policy[f])
	listedAt, genErr := nft.Generation(b.netns)
	kts, err := b.list(ctx, f)
	if err != nil {
		return err
	}
	stale := map[tableChain]bool{}
	commits := uint32(0)
	for _, rs := range ts {
		ops, staleChains := fullPlan(rs, kts[rs.name])
		if err := b.commit(f, tablePlan{table: rs.name, ops: ops}); err != nil {
			// Drift the plan did not see: replace the table.
			if err2 := b.commit(f, tablePlan{table: rs.name, ops: replacePlan(rs, kts[rs.name] != nil)}); err2 != nil {
				return fmt.Errorf("nftables: sync %s table %s: %w", f.Name, rs.name, errors.Join(err, err2))
			}
			staleChains = nil
		}
		commits++
		for _, c := range staleChains {
			stale[tableChain{rs.name, c}] = true
		}
	}
	if after, err := nft.Generation(b.netns); genErr == nil && err == nil && after == listedAt+commits {
		// Nothing else committed from the listing the plans were made
		// from to their commits: the tables are what was planned, and
		// the next periodic resync has nothing to verify.
		b.gen, b.genKnown = after, true
	}
	var counts dataplane.Counts
	for _, rs := range ts {
		rs.written()
		counts = counts.Plus(rs.counts())
	}
	b.state[f] = &familyState{ts: ts, claims: claims, counts: counts}
	b.stale[f] = stale
	b.deleteStale(f)
	return nil
}

// incremental rewrites the objects of the changed service ports, in
// the tables that hold them, one transaction per table (see commit).
func (b *Backend) incremental(f *family, st *familyState, ports map[model.ServicePortName]*model.ServicePort, changed model.ChangeSet) error {
	changes, lostKey := planChanges(f, st, ports, changed, b.policy[f])
	var plans []tablePlan
	stale := map[tableChain]bool{}
	for i, rs := range st.ts {
		if len(changes[i]) == 0 {
			continue
		}
		ops, staleChains := incrementalPlan(changes[i], rs.counted)
		plans = append(plans, tablePlan{table: rs.name, ops: ops})
		for _, c := range staleChains {
			stale[tableChain{rs.name, c}] = true
		}
	}
	for _, p := range plans {
		if err := b.commit(f, p); err != nil {
			return err
		}
	}
	for i, rs := range st.ts {
		for _, ch := range changes[i] {
			if ch.new != nil {
				ch.new.written()
			}
		}
		st.counts.Rules -= rs.counted.len()
		for _, ch := range changes[i] {
			if ch.old != nil {
				st.claims.release(ch.name, ch.old)
				rs.counted.add(ch.old, -1)
				st.counts = st.counts.Minus(ch.old.counts())
			}
		}
		for _, ch := range changes[i] {
			if ch.new == nil {
				delete(rs.ports, ch.name)
				continue
			}
			st.claims.claim(ch.name, ch.new)
			rs.ports[ch.name] = ch.new
			rs.counted.add(ch.new, 1)
			st.counts = st.counts.Plus(ch.new.counts())
		}
		st.counts.Rules += rs.counted.len()
		// A chain flushed by an earlier sync may be wanted again: it
		// exists, empty, and this sync has refilled it.
		for _, ch := range changes[i] {
			if ch.new != nil {
				for _, c := range ch.new.chains {
					delete(b.stale[f], tableChain{rs.name, c.Name})
				}
			}
		}
	}
	st.ts.main().contested = st.ts.main().contested || lostKey
	maps.Copy(b.stale[f], stale)
	b.deleteStale(f)
	return nil
}

// planChanges renders the changed ports (a changed name absent from the
// model was deleted) and pairs, in each table, what they hold there now
// with what was programmed for them: changes[i] are those of st.ts[i].
// A key of a shared map that an unchanged port holds stays with it;
// lostKey says a changed port lost one (see ruleset.contested).
func planChanges(f *family, st *familyState, ports map[model.ServicePortName]*model.ServicePort, changed model.ChangeSet, np *dataplane.NodePolicy) (changes [][]portChange, lostKey bool) {
	changes = make([][]portChange, len(st.ts))
	batch := claimIndex{}
	for _, name := range model.SortedNames(changed) {
		i := 1 + namesFor(name).table // its service table's index in st.ts
		oldMain, oldService := st.ts.main().ports[name], st.ts[i].ports[name]
		sp := ports[name]
		if sp == nil && oldMain == nil && oldService == nil {
			continue
		}
		var newMain, newService *portObjects
		if sp != nil {
			nw := renderPort(f, sp, np)
			for i := range nw.shared {
				sh := &nw.shared[i]
				kept := sh.elems[:0]
				for _, e := range sh.elems {
					if owner, ok := st.claims[sh.set][e.keyText()]; ok && owner != name {
						if _, alsoChanged := changed[owner]; !alsoChanged {
							lostKey = true
							continue
						}
					}
					kept = append(kept, e)
				}
				sh.elems = kept
			}
			if batch.claim(name, nw) {
				lostKey = true
			}
			newMain, newService = split(nw)
		}
		changes[0] = append(changes[0], portChange{name: name, old: oldMain, new: newMain})
		changes[i] = append(changes[i], portChange{name: name, old: oldService, new: newService})
	}
	return changes, lostKey
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
	byTable := map[string][]string{}
	for tc := range b.stale[f] {
		byTable[tc.table] = append(byTable[tc.table], tc.chain)
	}
	for _, table := range slices.Sorted(maps.Keys(byTable)) {
		chains := byTable[table]
		slices.Sort(chains)
		ops := make([]op, len(chains))
		for i, c := range chains {
			ops[i] = op{kind: opDelChain, name: c}
		}
		if b.commit(f, tablePlan{table: table, ops: ops}) == nil {
			for _, c := range chains {
				delete(b.stale[f], tableChain{table, c})
			}
		}
	}
}

// commit sends p as one transaction on its table. The known generation
// (Backend.gen) moves on with it when nothing else committed since and
// meanwhile; otherwise it is forgotten.
//
// A sync writes each table in a transaction of its own, not all of them
// in one: the kernel, binding an anonymous map to its rule, walks every
// step of the transaction so far (nft_set_trans_bind), so one
// transaction of the 10 000 DNAT rules of 10 000 services took 7 s to
// commit, and sixteen of 625 take 0.4 s. Each table is whole at every
// moment; between two of a sync's transactions, a port's objects in the
// main table can be a sync behind those in its service table for a few
// milliseconds, which changes nothing a packet sees but whether a
// service port that just lost (or found) its endpoints rejects or DNATs
// it, as it did a moment before.
func (b *Backend) commit(f *family, p tablePlan) error {
	if len(p.ops) == 0 {
		return nil
	}
	before, genErr := nft.Generation(b.netns)
	follows := genErr == nil && b.genKnown && before == b.gen
	b.genKnown = false
	t := nft.NewTxn(b.netns)
	if err := queue(t, f, p); err != nil {
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

// ownChains reads the chains of the family's tables, by table name,
// then by name, with r (nft.Reader: one dump of the family's chains,
// read in large batches). The kernel sends every chain of the family,
// and iptables-nft's tables beside ours can hold 110 000 (kube-proxy's
// or proxyshift's iptables mode at 10 000 services, during a switch),
// which google/nftables' listing read in 10 s.
func ownChains(r *nft.Reader, f *family) (map[string]map[string]*nftables.Chain, error) {
	chains := map[string]map[string]*nftables.Chain{}
	for _, name := range TableNames() {
		chains[name] = map[string]*nftables.Chain{}
	}
	err := r.EachChain(func(c *nftables.Chain) {
		if own := chains[c.Table.Name]; own != nil {
			own[c.Name] = c
		}
	})
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s chains: %w", f.Name, err)
	}
	return chains, nil
}

// list reads the definitions of the chains and named sets of the
// family's tables, by table name; a table that does not exist has none.
func (b *Backend) list(ctx context.Context, f *family) (map[string]*kernelTable, error) {
	exist, err := nft.FindTables(b.netns, f, TableNames())
	if err != nil || len(exist) == 0 {
		return nil, err
	}
	conn, err := nft.Open(b.netns)
	if err != nil {
		return nil, err
	}
	chains, err := b.readChains(ctx, f)
	if err != nil {
		return nil, err
	}
	kts := map[string]*kernelTable{}
	for name := range exist {
		kt := &kernelTable{chains: chains[name], sets: map[string]*nftables.Set{}}
		sets, err := conn.GetSets(&nftables.Table{Name: name, Family: f.Table})
		if err != nil {
			return nil, fmt.Errorf("nftables: list %s %s sets: %w", f.Name, name, err)
		}
		for _, s := range sets {
			if !s.Anonymous {
				kt.sets[s.Name] = s
			}
		}
		if kt.userdata, err = nft.SetUserdata(b.netns, f.Table, name); err != nil {
			return nil, err
		}
		kts[name] = kt
	}
	return kts, nil
}

// Programmed reads back what the kernel holds in both families' tables:
// Services counts the service ports with elements in the shared maps
// or chains, Endpoints the endpoints the ports' rules choose among (the
// anonymous maps' sizes, plus the endpoint chains with rules of ClientIP
// affinity), Rules every rule plus every element of the maps and sets a
// sync writes (not the affinity sets, which the packet path fills).
func (b *Backend) Programmed(ctx context.Context) (dataplane.Counts, error) {
	return dataplane.SumFamilies(ctx, families, func(f *family) (dataplane.Counts, error) { return b.programmed(ctx, f) })
}

// programmed reads back what the kernel holds in family f's tables; a
// table of one of our names that is not ours is a *nft.ForeignTableError.
func (b *Backend) programmed(ctx context.Context, f *family) (dataplane.Counts, error) {
	var total dataplane.Counts
	exist, err := nft.FindTables(b.netns, f, TableNames())
	if err != nil {
		return total, fmt.Errorf("nftables: %w", err)
	}
	conn, err := nft.Open(b.netns)
	if err != nil {
		return total, err
	}
	// services holds the name hashes of the service ports seen.
	services := map[[hashLen]byte]bool{}
	for _, name := range TableNames() {
		if !exist[name] {
			continue
		}
		c, err := b.programmedTable(ctx, conn, f, name, services)
		if err != nil {
			return total, err
		}
		total = total.Plus(c)
	}
	total.Services = len(services)
	return total, nil
}

// programmedTable is programmed for one table, adding the name hashes of
// the service ports it sees to services.
func (b *Backend) programmedTable(ctx context.Context, conn *nftables.Conn, f *family, table string, services map[[hashLen]byte]bool) (dataplane.Counts, error) {
	var total dataplane.Counts
	sets, err := conn.GetSets(&nftables.Table{Name: table, Family: f.Table})
	if err != nil {
		return total, fmt.Errorf("nftables: list %s %s sets: %w", f.Name, table, err)
	}
	r, err := nft.NewReader(ctx, b.netns, f.Table, table)
	if err != nil {
		return total, err
	}
	defer r.Close()
	// elements holds the distinct elements seen (see distinctElements).
	elements := newDistinctElements()
	for i, s := range sets {
		switch {
		case s.Anonymous && kernelDataMap(s):
			// A DNAT rule's endpoints: as many as the map was created
			// with, which nothing can change while the rule lives.
			total.Endpoints += int(s.Size)
			total.Rules += int(s.Size)
			continue
		case s.Anonymous || s.HasTimeout:
			continue
		}
		err := r.EachElement(s.Name, func(e nftables.SetElement) {
			if e.IntervalEnd {
				return
			}
			elements.add(i, e.Key)
			if sharedMaps[s.Name] && e.Comment != "" {
				services[nameHash(e.Comment)] = true
			}
		})
		if err != nil {
			return total, fmt.Errorf("nftables: list %s %s set %s: %w", f.Name, table, s.Name, err)
		}
	}
	total.Rules += elements.count()
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

// Present says whether the proxyshift main table exists in either
// family: whether this node has (or had, if it was never cleaned up)
// nftables mode programmed, as an agent starting up needs to know. A
// table of that name another program created is not proxyshift's and
// does not count (Sync, Programmed and Cleanup report it).
func (b *Backend) Present(context.Context) (bool, error) {
	return nft.TableExists(b.netns, TableName)
}

// Cleanup deletes the proxyshift tables of both families, with everything
// in them, one transaction per family, and returns one line per family
// whose tables it deleted. Missing tables are not an error; a table of
// one of our names that another program created is left as it is and
// reported (*nft.ForeignTableError), after the others are cleaned up.
// The next Sync is a full one.
func (b *Backend) Cleanup(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state = map[*family]*familyState{}
	b.stale = map[*family]map[tableChain]bool{}
	b.genKnown = false
	var removed []string
	var errs []error
	for _, f := range families {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		found, foreign := nft.FindTables(b.netns, f, TableNames())
		if foreign != nil {
			errs = append(errs, fmt.Errorf("nftables: %w", foreign))
		}
		if len(found) == 0 {
			continue
		}
		t := nft.NewTxn(b.netns)
		for _, name := range TableNames() {
			if found[name] {
				t.Conn().DelTable(&nftables.Table{Name: name, Family: f.Table})
			}
		}
		if err := t.Commit(); err != nil {
			errs = append(errs, fmt.Errorf("nftables: delete the %s tables: %w", f.Name, err))
			continue
		}
		removed = append(removed, removedLine(f, found))
	}
	return removed, errors.Join(errs...)
}

// removedLine says which of a family's tables Cleanup deleted.
func removedLine(f *family, found map[string]bool) string {
	services := fmt.Sprintf("%s*", serviceTablePrefix)
	if !found[TableName] {
		return fmt.Sprintf("nftables %s service tables %s (%d)", f.Name, services, len(found))
	}
	line := "nftables table " + f.Name + " " + TableName
	if n := len(found) - 1; n > 0 {
		line += fmt.Sprintf(" and its %d service tables %s", n, services)
	}
	return line
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
// aside, whose elements ports share): the part of the port in one table.
func (objs *portObjects) counts() dataplane.Counts {
	var c dataplane.Counts
	shared := 0
	for _, sh := range objs.shared {
		shared += len(sh.elems)
	}
	if objs.countsPort {
		c.Services++
	}
	c.Rules += shared + objs.anonElems
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
