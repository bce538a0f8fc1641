package iptables

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// The periodic resync (dataplane.SyncRequest.Resync) verifies and
// repairs: it reads the family's nat and filter tables back (the chains
// and how many rules each has, and the rules of the built-in chains) and
// compares them with what the backend last programmed (the ruleset in
// its state). Only when they differ does it rewrite everything (full),
// which is what every periodic resync did before: at 5 000 services an
// iptables-restore of every chain takes seconds and holds up every
// change behind it. Reading writes nothing and stops as soon as ctx ends
// (a change is waiting): the netlink dumps of the nft variant close their
// socket then, and iptables-save (legacy) or iptables -S is killed.

// verify compares family f's tables in the kernel with rs. It returns
// what differs first ("" when nothing does), or ctx's error when ctx
// ended before it was done.
//
// In the nft variant a verification that ctx cut short is resumed by the
// next one (see verifyProgress): at 5 000 services it reads 55 000
// chains' rules for about a second, longer than the time between two
// changes 1.1 s apart, so without it every periodic resync yielded to
// the next change until, a sync period overdue, it ran without yielding
// and held a change up for a second (`make bench`, iptables at 5 000
// services: p99 1.04 s).
func (b *Backend) verify(ctx context.Context, f *family, rs *ruleset) (string, error) {
	if b.run.variant == Legacy {
		cur, err := b.run.read(ctx, f, nil, true)
		if err != nil {
			return "", ctxOr(ctx, err)
		}
		return compareTables(rs, cur, true), nil
	}
	p := b.verified[f]
	if p.rs != rs {
		p = verifyProgress{rs: rs}
	}
	why, err := b.verifyFrom(ctx, f, &p)
	if ctx.Err() != nil {
		b.verified[f] = p
	} else {
		delete(b.verified, f) // done (or failed): the next one starts afresh
	}
	return why, err
}

// verifyProgress is how far the verification of a family's ruleset rs
// got before a change preempted it. What it verified stays verified: the
// changes synced since were the backend's own writes, and drift that came
// meanwhile is found by the next periodic resync. A full sync makes
// another ruleset, and its verification starts afresh.
type verifyProgress struct {
	rs *ruleset
	// listed says the chains and the jump rules were verified.
	listed bool
	// table and chain name the last chain whose rules were counted, in
	// the order of tables, then by name ("" for none).
	table, chain string
}

// verifyChunk is how many chains' rules the nft variant's verification
// counts between two records of its progress.
const verifyChunk = 2000

// verifyFrom is verify for the nft variant, going on from p and recording
// in p what it verifies: first the chains and the jump rules (one listing
// of the family's chains), then the rules of each chain rs programs,
// verifyChunk chains at a time.
func (b *Backend) verifyFrom(ctx context.Context, f *family, p *verifyProgress) (string, error) {
	if !p.listed {
		cur, err := b.run.read(ctx, f, nil, false)
		if err != nil {
			return "", ctxOr(ctx, err)
		}
		if why := compareTables(p.rs, cur, false); why != "" {
			return why, nil
		}
		p.listed = true
	}
	for i, table := range tables {
		if p.table != "" && i < slices.Index(tables, p.table) {
			continue
		}
		want := wantRules(table, p.rs)
		names := slices.Sorted(maps.Keys(want))
		if table == p.table {
			n, found := slices.BinarySearch(names, p.chain)
			if found {
				n++
			}
			names = names[n:]
		}
		for len(names) > 0 {
			chunk := names[:min(len(names), verifyChunk)]
			counts, err := nftRuleCounts(ctx, b.run.netns, f, table, chunk)
			if err != nil {
				return "", ctxOr(ctx, err)
			}
			for _, c := range chunk {
				if counts[c] != want[c] {
					return fmt.Sprintf("%s chain %s has %d rules, not %d", table, c, counts[c], want[c]), nil
				}
			}
			p.table, p.chain = table, chunk[len(chunk)-1]
			names = names[len(chunk):]
		}
	}
	return "", nil
}

// ctxOr is ctx's error when ctx ended, err otherwise.
func ctxOr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}

// compareTables is compareTable for every table.
func compareTables(rs *ruleset, cur savedTables, counts bool) string {
	for _, table := range tables {
		if why := compareTable(table, rs, cur[table], counts); why != "" {
			return why
		}
	}
	return ""
}

// wantRules is how many rules rs puts into each of its chains of table.
func wantRules(table string, rs *ruleset) map[string]int {
	want := map[string]int{}
	for _, c := range rs.fixed {
		if c.table == table {
			want[c.name] += len(c.rules)
		}
	}
	for _, pr := range rs.ports {
		for _, c := range pr.chains {
			if c.table == table {
				want[c.name] += len(c.rules)
			}
		}
		for _, r := range pr.shared {
			if r.table == table {
				want[r.chain]++
			}
		}
	}
	return want
}

// compareTable says how the saved table differs from what rs puts in it
// ("" when it does not): a proxyshift chain missing or extra, with
// another number of rules (if counts: saved has them), or the jump rules
// into proxyshift's chains not exactly as a sync writes them.
func compareTable(table string, rs *ruleset, saved *savedTable, counts bool) string {
	want := wantRules(table, rs)
	if saved == nil {
		if len(want) > 0 {
			return "table " + table + " holds no proxyshift chain"
		}
		return ""
	}
	have := map[string]bool{}
	for _, c := range saved.chains {
		if saved.builtin[c] || !owned(c) {
			continue
		}
		have[c] = true
		n, ok := want[c]
		if !ok {
			return fmt.Sprintf("%s chain %s is not in the ruleset", table, c)
		}
		if counts && saved.counts[c] != n {
			return fmt.Sprintf("%s chain %s has %d rules, not %d", table, c, saved.counts[c], n)
		}
	}
	for c := range want {
		if !have[c] {
			return fmt.Sprintf("%s chain %s is missing", table, c)
		}
	}
	// The jump rules: what a full sync would delete or insert.
	t := &tableInput{name: table, ports: map[string]*block{}}
	t.hook(saved)
	if !t.head.empty() {
		return fmt.Sprintf("%s jump rules into proxyshift's chains differ (%d to delete, %d to insert)", table, len(t.head.del), len(t.head.insert))
	}
	return ""
}
