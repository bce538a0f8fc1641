package iptables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// Backend is the iptables dataplane. It is safe for concurrent use: syncs
// and cleanups are serialized, Programmed only reads.
type Backend struct {
	run    runner
	policy map[*family]*dataplane.NodePolicy
	// procSys is where sysctls are read and written (WithProcSys).
	procSys string

	mu sync.Mutex
	// state is what the last successful sync of each family programmed;
	// without it the next sync of the family is a full one.
	state map[*family]*ruleset
	// swept says the other variant has been cleared of proxyshift's
	// objects since New or Cleanup.
	swept bool
	// gen, when genKnown (nft variant only), is a ruleset generation
	// (nft.Generation) at which the kernel was known to hold exactly the
	// state: set by a periodic resync that verified every family and saw
	// the generation stay, moved on by each restore of ours that follows
	// it directly. While the generation stays there, a resync has nothing
	// to verify.
	gen      uint32
	genKnown bool
	// fillMin is the fewest ports a full sync into empty tables fills in
	// parts (fillMinPorts; tests change it).
	fillMin int
}

var _ dataplane.Backend = (*Backend)(nil)

// detectTimeout bounds the iptables-save runs of New's detection.
const detectTimeout = time.Minute

// New returns a backend for the node cfg describes, programming the
// iptables variant the host uses (see Detect) unless WithVariant forces
// one. It fails if that variant's tools are missing: no silent fallback
// to the other.
//
// New does not change any rule: the rules a previous agent programmed keep
// working until the first Sync, a full one, replaces them in one
// iptables-restore transaction per family, so an agent restart never
// interrupts traffic.
func New(cfg dataplane.NodeConfig, opts ...Option) (*Backend, error) {
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("iptables: masquerade bit %d is not 0-31", cfg.MasqueradeBit)
	}
	o := newOptions(opts)
	switch o.variant {
	case Legacy, NFT:
	case "":
		ctx, cancel := context.WithTimeout(context.Background(), detectTimeout)
		defer cancel()
		v, err := detect(ctx, o.netns)
		if err != nil {
			return nil, err
		}
		o.variant = v
	default:
		return nil, fmt.Errorf("iptables: unknown variant %q (want %s or %s)", o.variant, Legacy, NFT)
	}
	b := &Backend{
		run:     runner{variant: o.variant, netns: o.netns},
		policy:  map[*family]*dataplane.NodePolicy{},
		procSys: o.procSys,
		state:   map[*family]*ruleset{},
		fillMin: fillMinPorts,
	}
	if ok, missing := b.run.installed(); !ok {
		return nil, fmt.Errorf("iptables: %s variant: %s %w", o.variant, missing, errNotInstalled)
	}
	for _, f := range families {
		np := dataplane.NewNodePolicy(cfg, f.model)
		if o.localhost {
			np.ServeLoopbackNodePorts(cfg)
		}
		b.policy[f] = &np
	}
	return b, nil
}

// Mode returns "iptables".
func (b *Backend) Mode() string { return "iptables" }

// Variant returns the iptables variant the backend programs.
func (b *Backend) Variant() Variant { return b.run.variant }

// Sync programs the model's families (those present in req.Model.Ports),
// one iptables-restore --noflush transaction per family (a large model
// into tables holding nothing of proxyshift's is written in parts: see
// fill).
//
// An incremental sync rewrites only the chains and rules of the service
// ports in req.Changed, from what the backend remembers programming. If
// the kernel rejects it (a rule it deletes is gone) it is retried at once
// as a full sync, which reads the tables back with iptables-save and
// rewrites every proxyshift chain and jump rule, repairing any drift.
// Callers should still ask for a full sync now and then, since drift that
// an incremental sync does not trip over (a flushed chain, a deleted jump
// rule) is only repaired by one. A periodic one (req.Resync) reads the
// tables back first and rewrites them only when they differ from what
// the backend programmed (see verify).
//
// The first successful sync after New or Cleanup also removes any
// proxyshift objects from the other iptables variant, so that rules are
// never split between the two.
func (b *Backend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	req, missing := dataplane.WithoutMissingFamilies(b.run.netns, "", req)
	var g0 uint32
	genErr := errNotInstalled
	if req.Resync && b.run.variant == NFT {
		g0, genErr = nft.Generation(b.run.netns)
		if genErr == nil && b.quiet(g0, req) {
			return b.counts(), missing
		}
	}
	var errs []error
	if err := dataplane.SyncFamilies(ctx, req, families, familyKey, func(f *family, ports map[model.ServicePortName]*model.ServicePort) error {
		return b.syncFamily(ctx, f, ports, req)
	}); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 && genErr == nil {
		// Every family verified (or repaired); if nothing committed
		// meanwhile, the kernel holds the state at generation g0.
		if g, err := nft.Generation(b.run.netns); err == nil && g == g0 {
			b.gen, b.genKnown = g0, true
		}
	}
	if len(errs) == 0 && !b.swept {
		if _, err := cleanupVariant(ctx, runner{variant: b.run.variant.other(), netns: b.run.netns}, nil, false); err != nil {
			errs = append(errs, fmt.Errorf("iptables: remove proxyshift's rules from the %s variant: %w", b.run.variant.other(), err))
		} else {
			b.swept = true
		}
	}
	errs = append(errs, missing)
	return b.counts(), errors.Join(errs...)
}

// counts adds up what every family programmed.
func (b *Backend) counts() dataplane.Counts {
	var c dataplane.Counts
	for _, rs := range b.state {
		c = c.Plus(rs.counts())
	}
	return c
}

// quiet says whether a periodic resync of req has nothing to do: nothing
// committed to nf_tables since the kernel was known to hold the state (at
// generation gen), and every family of the model has a state.
func (b *Backend) quiet(gen uint32, req dataplane.SyncRequest) bool {
	if !b.genKnown || gen != b.gen || req.Model == nil {
		return false
	}
	for _, f := range families {
		if _, ok := req.Model.Ports[f.model]; ok && b.state[f] == nil {
			return false
		}
	}
	return true
}

// restore runs one iptables-restore of input for family f. In the nft
// variant the known generation (Backend.gen) moves on with it when
// nothing else committed since and meanwhile (iptables-nft-restore
// commits each table of the input on its own); otherwise it is forgotten.
func (b *Backend) restore(ctx context.Context, f *family, input restoreInput) error {
	if b.run.variant != NFT {
		return b.run.restore(ctx, f, input)
	}
	before, genErr := nft.Generation(b.run.netns)
	follows := genErr == nil && b.genKnown && before == b.gen
	b.genKnown = false
	err := b.run.restore(ctx, f, input)
	if err != nil {
		return err
	}
	if after, gerr := nft.Generation(b.run.netns); follows && gerr == nil && after == before+uint32(input.commits()) {
		b.gen, b.genKnown = after, true
	}
	return nil
}

func (b *Backend) syncFamily(ctx context.Context, f *family, ports map[model.ServicePortName]*model.ServicePort, req dataplane.SyncRequest) error {
	rs := b.state[f]
	switch {
	case rs != nil && req.Resync:
		why, err := b.verify(ctx, f, rs)
		if err != nil || why == "" {
			return err
		}
		klog.InfoS("Periodic resync rewrites proxyshift's iptables chains", "tool", b.run.tool(f), "reason", why)
	case rs != nil && !req.Full:
		if err := b.incremental(ctx, f, rs, ports, req.Changed); err == nil {
			return nil
		}
	}
	return b.full(ctx, f, ports)
}

// full rewrites everything proxyshift owns in the family's tables.
// Rendering is pure, so it runs while the tables are read: at 10 000
// services each takes about a tenth of a second, and both come before
// the restore can start.
func (b *Backend) full(ctx context.Context, f *family, ports map[model.ServicePortName]*model.ServicePort) error {
	delete(b.state, f)
	rendered := make(chan *ruleset, 1)
	go func() { rendered <- render(b.policy[f], ports) }()
	cur, readErr := b.run.read(ctx, f, nil, false)
	rs := <-rendered
	if err := rs.collisions(); err != nil {
		return err
	}
	if readErr != nil {
		return readErr
	}
	if err := b.setSysctls(); err != nil {
		return err
	}
	var err error
	if b.fillsInParts(cur, rs) {
		err = b.fill(ctx, f, rs)
	} else {
		err = b.restore(ctx, f, fullRestore(rs, cur))
	}
	if err != nil {
		return err
	}
	b.state[f] = rs
	return nil
}

// fillParts is how many restores fill empty tables at once: one per CPU
// of a 2-CPU node, where a switch into iptables is slowest.
const fillParts = 2

// fillMinPorts is the fewest service ports for which empty tables are
// filled in parts: below it, the three more restores cost more than the
// parts save.
const fillMinPorts = 1000

// fillsInParts says whether a full sync of rs into the tables cur
// describes fills them in parts (fill): with the nft variant, whose
// restores of one table can run at once (a restore whose view went
// stale is refused by the kernel and commits again by itself), on a
// node with a CPU for each part, at fillMinPorts ports or more (the
// backend's fillMin), into tables holding nothing of proxyshift's (a
// rewrite stays one transaction per table, so traffic never meets it
// half done).
func (b *Backend) fillsInParts(cur savedTables, rs *ruleset) bool {
	return b.run.variant == NFT && runtime.GOMAXPROCS(0) >= fillParts &&
		len(rs.ports) >= b.fillMin && !cur.holdsOwned()
}

// fill writes rs into tables holding nothing of proxyshift's in the
// restores fillRestores gives, the ports' at once: the switch into
// iptables at 10 000 services is this restore, and one iptables-nft
// restore parses its input on one CPU before the kernel commits it. If
// a part fails the jump rules are not written: the chains written stay
// unreachable until the next sync, a full one, rewrites them.
func (b *Backend) fill(ctx context.Context, f *family, rs *ruleset) error {
	fixed, ports, hooks := fillRestores(rs, fillParts)
	b.genKnown = false
	restore := func(in restoreInput) error {
		if in.empty() {
			return nil
		}
		return b.run.restore(ctx, f, in)
	}
	if err := restore(fixed); err != nil {
		return err
	}
	errs := make([]error, len(ports))
	var wg sync.WaitGroup
	for i, in := range ports {
		wg.Go(func() { errs[i] = restore(in) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return restore(hooks)
}

// incremental rewrites the chains and rules of the changed service ports
// (a changed name absent from the model was deleted).
func (b *Backend) incremental(ctx context.Context, f *family, rs *ruleset, ports map[model.ServicePortName]*model.ServicePort, changed model.ChangeSet) error {
	var changes []portChange
	for _, name := range model.SortedNames(changed) {
		old, sp := rs.ports[name], ports[name]
		if old == nil && sp == nil {
			continue
		}
		ch := portChange{name: name, old: old}
		if sp != nil {
			ch.new = renderPort(b.policy[f], sp)
			if ch.new.clash != nil {
				return ch.new.clash
			}
		}
		changes = append(changes, ch)
	}
	keys := maps.Clone(rs.keys)
	for _, ch := range changes {
		keys.release(ch.name)
	}
	for _, ch := range changes {
		if ch.new != nil {
			if err := keys.claim(ch.name, ch.new.key); err != nil {
				return err
			}
		}
	}
	if input := incrementalRestore(changes); !input.empty() {
		if err := b.restore(ctx, f, input); err != nil {
			return err
		}
	}
	for _, ch := range changes {
		if ch.new == nil {
			delete(rs.ports, ch.name)
		} else {
			rs.ports[ch.name] = ch.new
		}
	}
	rs.keys = keys
	return nil
}

// Programmed reads back what the backend's variant holds in both
// families: Services counts the service ports named in the comments of
// the fixed chains' rules, Endpoints the DNAT rules of proxyshift's chains
// (one per endpoint each chain chooses among), Rules every rule of a
// proxyshift chain plus the jump rules into them.
//
// In the nft variant it first reads only the chains, with their use
// counts, and compares them with what the backend's last syncs
// programmed (programmedAsSynced); only when they differ does it count
// what the kernel holds rule by rule, for a report of what is there.
func (b *Backend) Programmed(ctx context.Context) (dataplane.Counts, error) {
	if b.run.variant == NFT {
		if c, ok, err := b.programmedAsSynced(ctx); err != nil || ok {
			return c, err
		}
	}
	var total dataplane.Counts
	for _, f := range families {
		cur, err := b.run.read(ctx, f, sharedChains, true)
		if err != nil {
			return total, err
		}
		total = total.Plus(countSaved(cur))
	}
	return total, nil
}

// programmedAsSynced is Programmed for the nft variant when the kernel
// holds what the backend's state says it programmed: the proxyshift
// chains of each family are exactly the state's, and each chain's use
// count (its rules plus the jumps to it) is what the state implies
// (compareChains). Then the counts are the state's, and ok is true. It
// is one dump of each family's chains (about a second for iptables-nft's
// 110 000 at 10 000 services), where counting the rules is a dump per
// chain besides (5.7 s in all: BenchmarkProgrammed/nft/10k). The lock is
// held only to take what the state implies: syncs go on while it reads.
func (b *Backend) programmedAsSynced(ctx context.Context) (dataplane.Counts, bool, error) {
	want := map[*family]map[string]map[string]int{}
	b.mu.Lock()
	for _, f := range families {
		want[f] = map[string]map[string]int{}
		for _, table := range tables {
			if rs := b.state[f]; rs != nil {
				want[f][table] = wantCounts(table, rs, true)
			}
		}
	}
	synced := b.counts()
	b.mu.Unlock()
	for _, f := range families {
		cur, err := nftTables(ctx, b.run.netns, f, false)
		if err != nil {
			return dataplane.Counts{}, false, fmt.Errorf("iptables: read %s's tables over netlink: %w", b.run.tool(f), err)
		}
		for _, table := range tables {
			if compareChains(table, want[f][table], cur[table], true) != "" {
				return dataplane.Counts{}, false, nil
			}
		}
	}
	return synced, true, nil
}

// Present says whether the kernel holds proxyshift's rules in the
// backend's variant, in either family: whether a fixed chain that every
// sync creates is there (holdsPresenceChain). An agent deciding what its
// node runs asks it between a switch's steps; it looks up two chains,
// where Programmed reads every chain back (28 s for iptables-nft at
// 10 000 services).
func (b *Backend) Present(ctx context.Context) (bool, error) {
	for _, f := range families {
		ok, err := b.run.holdsPresenceChain(ctx, f)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// Cleanup removes every proxyshift chain, and the jump rules into them,
// from both iptables variants and both families, and returns one line per
// removed object. Nothing else is touched. The next Sync is a full one.
func (b *Backend) Cleanup(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	programmed := b.state
	b.state = map[*family]*ruleset{}
	b.swept = false
	b.genKnown = false
	removed, err := cleanupVariant(ctx, b.run, programmed, true)
	if err != nil {
		return removed, err
	}
	other, err := cleanupVariant(ctx, runner{variant: b.run.variant.other(), netns: b.run.netns}, nil, false)
	removed = append(removed, other...)
	if err != nil {
		return removed, err
	}
	reset, err := b.resetSysctls()
	return append(removed, reset...), err
}

// cleanupVariant removes proxyshift's objects from one variant, both
// families; programmed holds, per family, the ruleset the backend last
// synced into r's variant (nil or missing when unknown). A variant whose
// tools are missing holds nothing to remove; a family whose tables cannot
// be read is an error only if strict (for the variant the backend
// programs): in the other variant it means the variant does not work
// here, so no rule of it can be in the way.
func cleanupVariant(ctx context.Context, r runner, programmed map[*family]*ruleset, strict bool) ([]string, error) {
	if ok, _ := r.installed(); !ok {
		return nil, nil
	}
	var removed []string
	for _, f := range families {
		lines, err := r.cleanup(ctx, f, programmed[f], strict)
		removed = append(removed, lines...)
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// cleanup removes proxyshift's objects from family f of r's variant:
// iptables-nft's over netlink, in one transaction (removeNFT),
// iptables-legacy's with one iptables-restore. Tables that cannot be
// read are an error only if strict (see cleanupVariant).
//
// With programmed (the ruleset the backend last synced there, nil when
// unknown), iptables-nft's chains are first removed by name, without
// listing them: the kernel lists a table's chains in pieces and walks the
// table from its first chain for each piece, so listing 110 000 chains
// (10 000 services, when each endpoint had a chain) took about a second of the 1.7 s a cleanup took
// (BenchmarkCleanup/nft/10k). The listing that follows, to remove what
// the backend did not know of (drift, an earlier agent's chains), then
// meets a table without them. When the removal by name fails (a chain
// already gone, say), nothing of it was applied, and the listing finds
// every chain as before.
func (r runner) cleanup(ctx context.Context, f *family, programmed *ruleset, strict bool) ([]string, error) {
	unreadable := func(err error) ([]string, error) {
		if strict {
			return nil, err
		}
		return nil, nil
	}
	if r.variant == NFT {
		var removed []string
		if programmed != nil {
			cur, err := programmedTables(r.netns, f, programmed)
			var lines []string
			if err == nil {
				lines, err = removeNFT(r.netns, f, cur, r.tool(f))
			}
			if err != nil {
				klog.V(2).InfoS("Could not remove the chains the backend programmed by name; listing them", "tool", r.tool(f), "err", err)
			}
			removed = lines
		}
		// Only the chains: removeNFT finds the jump rules by verdict.
		cur, err := nftTables(ctx, r.netns, f, false)
		if err != nil {
			return unreadable(fmt.Errorf("iptables: read %s's tables over netlink: %w", r.tool(f), err))
		}
		lines, err := removeNFT(r.netns, f, cur, r.tool(f))
		return append(removed, lines...), err
	}
	cur, err := r.read(ctx, f, nil, false)
	if err != nil {
		return unreadable(err)
	}
	input, lines := cleanupRestore(cur, r.tool(f))
	if input.empty() {
		return nil, nil
	}
	if err := r.restore(ctx, f, input); err != nil {
		return nil, err
	}
	return lines, nil
}

// sharedChains are the fixed chains whose rules belong to service ports.
var sharedChains = map[string]bool{
	chainServices: true, chainNodePorts: true, chainFirewall: true,
	chainEndpointsCheck: true, chainNodePortsCheck: true,
}

// countSaved counts what Programmed reports in one family's tables.
func countSaved(cur savedTables) dataplane.Counts {
	var c dataplane.Counts
	services := map[string]bool{}
	for _, table := range tables {
		t := cur[table]
		if t == nil {
			continue
		}
		for _, name := range t.chains {
			switch {
			case t.builtin[name]:
				for _, s := range t.rules[name] {
					if owned(target(s)) {
						c.Rules++
					}
				}
			case owned(name):
				c.Rules += t.counts[name]
				c.Endpoints += t.dnats[name]
				if sharedChains[name] {
					for _, s := range t.rules[name] {
						if id := commentPort(s); id != "" {
							services[id] = true
						}
					}
				}
			}
		}
	}
	c.Services = len(services)
	return c
}

// counts are the sizes of a ruleset, as Programmed reads them back.
func (rs *ruleset) counts() dataplane.Counts {
	c := dataplane.Counts{Rules: len(jumps)}
	for _, ch := range rs.fixed {
		c.Rules += len(ch.rules)
	}
	for _, pr := range rs.ports {
		if len(pr.shared) > 0 {
			c.Services++
		}
		c.Rules += len(pr.shared)
		c.Endpoints += pr.endpoints
		for _, ch := range pr.chains {
			c.Rules += len(ch.rules)
		}
	}
	return c
}

// familyKey is the model family a table family programs.
func familyKey(f *family) corev1.IPFamily { return f.model }

// routeLocalnet is the sysctl that lets the node route packets to and
// from 127.0.0.0/8 over other interfaces than lo: what DNAT of a
// connection to 127.0.0.1:<NodePort> to a pod needs. It is per network
// namespace ("all" applies to every interface).
const routeLocalnet = "net.ipv4.conf.all.route_localnet"

// sysctls are the settings the backend sets: route_localnet=1 when
// NodePorts answer on 127.0.0.1 (WithLocalhostNodePorts), else none.
// Cleanup sets it back to 0 (see resetSysctls).
func (b *Backend) sysctls() []dataplane.KernelSetting {
	for _, np := range b.policy {
		if np.LocalhostNodePorts {
			return []dataplane.KernelSetting{{Name: routeLocalnet, Want: "1"}}
		}
	}
	return nil
}

// setSysctls writes the backend's sysctls that differ from what it
// wants, in its network namespace.
func (b *Backend) setSysctls() error {
	settings := b.sysctls()
	if len(settings) == 0 {
		return nil
	}
	return b.run.netns.Do(func() error { return dataplane.SetSysctls("iptables", b.procSys, settings) })
}

// resetSysctls sets route_localnet back to 0 when the backend sets it to
// 1, for Cleanup: without the martian drop that Cleanup removes with the
// chains, route_localnet=1 would let other hosts reach what listens on
// the node's loopback addresses. Only "all" is reset: a CNI that needs
// it on one interface (the portmap plugin on its bridge) sets it there,
// which the kernel ORs with "all". It describes what it changed.
func (b *Backend) resetSysctls() ([]string, error) {
	settings := b.sysctls()
	if len(settings) == 0 {
		return nil, nil
	}
	var removed []string
	err := b.run.netns.Do(func() error {
		dataplane.ReadSysctls(b.procSys, settings)
		var reset []dataplane.KernelSetting
		for _, s := range settings {
			if s.Value == s.Want {
				reset = append(reset, dataplane.KernelSetting{Name: s.Name, Want: "0"})
				removed = append(removed, "sysctl "+s.Name+"="+s.Want+" (set back to 0)")
			}
		}
		return dataplane.SetSysctls("iptables", b.procSys, reset)
	})
	return removed, err
}

var _ dataplane.SettingsReporter = (*Backend)(nil)

// KernelSettings reads back the sysctls the backend sets, for the node's
// status (dataplane.SettingsReporter): route_localnet with localhost
// NodePorts, else none.
func (b *Backend) KernelSettings() ([]dataplane.KernelSetting, error) {
	settings := b.sysctls()
	if len(settings) == 0 {
		return nil, nil
	}
	err := b.run.netns.Do(func() error {
		dataplane.ReadSysctls(b.procSys, settings)
		return nil
	})
	return settings, err
}
