package nftables

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
)

// The periodic resync (dataplane.SyncRequest.Resync) verifies and
// repairs: it reads the family's tables back, one object at a time, and
// compares it with what the backend last programmed (familyState). Only
// when they differ does it rewrite the table (full), which is what every
// periodic resync did before: a rewrite at 10 000 services takes about a
// second and holds up every change behind it. Reading writes nothing and
// stops between two objects as soon as ctx ends (a change is waiting),
// so a change waits for no read: the reads go over one netlink socket
// (nft.Reader), which is closed the moment ctx ends, a dump under way
// included.

// verify compares family f's tables in the kernel with st. It returns
// what differs first ("" when nothing does), or ctx's error when ctx
// ended before it was done.
func (b *Backend) verify(ctx context.Context, f *family, st *familyState) (string, error) {
	why, err := b.verifyFrom(ctx, f, st, &st.verified)
	if ctx.Err() == nil {
		// Done (or failed): the next verification starts afresh.
		st.verified = verifyProgress{}
	}
	return why, err
}

// verifyProgress is how far the verification of a family got before a
// change preempted it: the next one goes on from there, so that a
// verification longer than the time between two changes still ends.
// What it verified before stays verified: the changes synced since were
// the backend's own writes, and drift that came meanwhile is found by
// the next periodic resync.
type verifyProgress struct {
	// table is the index in familyState.ts of the table under
	// verification: those before it are verified.
	table int
	// chains says the table's chains and their rule counts were
	// verified.
	chains bool
	// set is the table's last set verified, in name order ("" for none).
	set string
}

// verifyFrom is verify, skipping what p says is verified and recording in
// p what it verifies.
func (b *Backend) verifyFrom(ctx context.Context, f *family, st *familyState, p *verifyProgress) (string, error) {
	exist, err := nft.FindTables(b.netns, f, TableNames())
	if err != nil {
		return "", fmt.Errorf("nftables: %w", err)
	}
	// One dump of the family's chains serves every table: the kernel
	// sends all of them whatever table is asked for (iptables-nft's
	// 110 000 during a switch at 10 000 services included).
	var chains map[string]map[string]*nftables.Chain
	for ; p.table < len(st.ts); p.table, p.chains, p.set = p.table+1, false, "" {
		rs := st.ts[p.table]
		if !exist[rs.name] {
			return "table " + rs.name + " is missing", nil
		}
		if !p.chains && chains == nil {
			if chains, err = b.readChains(ctx, f); err != nil {
				return "", err
			}
		}
		if why, err := b.verifyTable(ctx, f, rs, chains[rs.name], p); err != nil || why != "" {
			return why, err
		}
	}
	return "", nil
}

// readChains reads the chains of the family's tables (ownChains).
func (b *Backend) readChains(ctx context.Context, f *family) (map[string]map[string]*nftables.Chain, error) {
	r, err := nft.NewReader(ctx, b.netns, f.Table, TableName)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return ownChains(r, f)
}

// verifyTable compares one table with rs, going on from p; have are the
// table's chains in the kernel.
func (b *Backend) verifyTable(ctx context.Context, f *family, rs *ruleset, have map[string]*nftables.Chain, p *verifyProgress) (string, error) {
	conn, err := nft.Open(b.netns)
	if err != nil {
		return "", err
	}
	want := rs.objects()
	r, err := nft.NewReader(ctx, b.netns, f.Table, rs.name)
	if err != nil {
		return "", err
	}
	defer r.Close()
	if !p.chains {
		if why, err := b.verifyChains(r, f, rs.name, have, want); err != nil || why != "" {
			return why, err
		}
		p.chains = true
	}
	return verifySets(ctx, conn, r, &nftables.Table{Name: rs.name, Family: f.Table}, f, want, p)
}

// verifyChains compares the chains of table (have, as the kernel listed
// them), their hooks and their rule counts (read with r) with want.
func (b *Backend) verifyChains(r *nft.Reader, f *family, table string, have map[string]*nftables.Chain, want wanted) (string, error) {
	for name, c := range want.chains {
		k := have[name]
		if k == nil {
			// The counts tell one lost chain from a listing cut short.
			return fmt.Sprintf("chain %s of %s is missing (the kernel listed %d chains of the table, %d expected)", name, table, len(have), len(want.chains)), nil
		}
		if !c.SameHook(k) {
			return "chain " + name + " of " + table + " has another hook", nil
		}
	}
	for name := range have {
		if want.chains[name] == nil && !b.stale[f][tableChain{table, name}] {
			return "chain " + name + " of " + table + " is not ours", nil
		}
	}
	counts, err := r.RuleCounts()
	if err != nil {
		return "", err
	}
	for name := range have {
		wantRules := 0
		if c := want.chains[name]; c != nil {
			wantRules = len(c.Rules)
		}
		if counts[name] != wantRules {
			return fmt.Sprintf("chain %s of %s has %d rules, not %d", name, table, counts[name], wantRules), nil
		}
	}
	return "", nil
}

// verifySets compares the table's sets, their definitions and their
// elements with want, in name order after p.set, recording in p.set each
// one verified.
func verifySets(ctx context.Context, conn *nftables.Conn, r *nft.Reader, t *nftables.Table, f *family, want wanted, p *verifyProgress) (string, error) {
	sets, err := conn.GetSets(t)
	if err != nil {
		return "", fmt.Errorf("nftables: list %s sets: %w", f.Name, err)
	}
	haveSets := map[string]*nftables.Set{}
	for _, s := range sets {
		if !s.Anonymous {
			haveSets[s.Name] = s
		}
	}
	for name := range haveSets {
		if want.sets[name] == nil {
			return "set " + name + " of " + t.Name + " is not ours", nil
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.sets)) {
		if name <= p.set {
			continue
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
		s, k := want.sets[name], haveSets[name]
		if k == nil {
			return "set " + name + " of " + t.Name + " is missing", nil
		}
		if !s.sameDefinition(k) {
			return "set " + name + " of " + t.Name + " has another definition", nil
		}
		if s.dynamic() {
			continue // the packet path fills it
		}
		elems, err := r.ElementTexts(name)
		if err != nil {
			return "", err
		}
		if why := compareElements(s, want.elems[name], elems); why != "" {
			return "set " + name + " of " + t.Name + " " + why, nil
		}
		p.set = name
	}
	return "", nil
}

// compareElements says how the elements the kernel listed for s differ
// from the pieces of elements written to it ("" when they do not).
func compareElements(s *set, pieces [][]element, listed []string) string {
	ks := s.kernel(nil)
	want := map[string]bool{}
	for _, p := range pieces {
		for _, text := range nft.ElementTexts(ks, p, (*element).kernel) {
			want[text] = true
		}
	}
	have := make(map[string]bool, len(listed))
	for _, text := range listed {
		if !want[text] {
			return "holds an element not ours: " + nft.ElementString(text)
		}
		have[text] = true
	}
	if len(have) != len(want) {
		return fmt.Sprintf("lacks %d elements", len(want)-len(have))
	}
	return ""
}
