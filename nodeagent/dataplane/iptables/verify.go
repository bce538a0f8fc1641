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
//
// The nft variant does not count rules: the one dump of the family's
// chains gives each chain's use count, which the kernel keeps as its
// rules plus the jumps to it, and that is compared with what the ruleset
// implies (compareChains). Counting the rules took a dump per chain,
// 110 000 of them at 10 000 services (3 to 4 s; a change preempted it at
// 5 000 services, so it had to resume where it stopped), where the chain
// dump alone takes about a second at 10 000 and a quarter of that at
// 5 000.

// verify compares family f's tables in the kernel with rs. It returns
// what differs first ("" when nothing does), or ctx's error when ctx
// ended before it was done.
func (b *Backend) verify(ctx context.Context, f *family, rs *ruleset) (string, error) {
	cur, err := b.run.read(ctx, f, nil, false)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
		return "", err
	}
	for _, table := range tables {
		if why := compareTable(table, rs, cur[table]); why != "" {
			return why, nil
		}
	}
	return "", nil
}

// wantCounts is, for each chain rs puts in table, how many rules it
// holds, and if byUse the use count the kernel keeps for it instead: its
// rules plus the rules rs puts in table that jump to it, the jump rules
// in the built-in chains included.
func wantCounts(table string, rs *ruleset, byUse bool) map[string]int {
	want := map[string]int{}
	// jumpsTo counts the rules by target, whatever it is (a chain, ACCEPT,
	// DNAT...); only the chains of want are looked up at the end.
	jumpsTo := map[string]int{}
	rule := func(chain, spec string) {
		want[chain]++
		if byUse {
			jumpsTo[target(spec)]++
		}
	}
	chainRules := func(c *chain) {
		if c.table != table {
			return
		}
		want[c.name] += 0 // a chain without rules is one of rs's too
		for _, spec := range c.rules {
			rule(c.name, spec)
		}
	}
	for _, c := range rs.fixed {
		chainRules(c)
	}
	for _, pr := range rs.ports {
		for _, c := range pr.chains {
			chainRules(c)
		}
		for _, r := range pr.shared {
			if r.table == table {
				rule(r.chain, r.spec)
			}
		}
	}
	if byUse {
		for _, j := range jumps {
			if j.table == table {
				jumpsTo[j.target]++
			}
		}
		for c := range want {
			want[c] += jumpsTo[c]
		}
	}
	return want
}

// compareTable says how the saved table differs from what rs puts in it
// ("" when it does not): a proxyshift chain missing or extra, with
// another number of rules (a table read over netlink: another use count,
// see compareChains), or the jump rules into proxyshift's chains not
// exactly as a sync writes them.
func compareTable(table string, rs *ruleset, saved *savedTable) string {
	byUse := saved != nil && saved.uses != nil
	if why := compareChains(table, wantCounts(table, rs, byUse), saved, byUse); why != "" || saved == nil {
		return why
	}
	// The jump rules: what a full sync would delete or insert.
	t := &tableInput{name: table, ports: map[string]*block{}}
	t.hook(saved)
	if !t.head.empty() {
		return fmt.Sprintf("%s jump rules into proxyshift's chains differ (%d to delete, %d to insert)", table, len(t.head.del), len(t.head.insert))
	}
	return ""
}

// compareChains says how the proxyshift chains of the saved table (nil:
// there is no such table) differ from want, which maps each chain a
// ruleset puts in it to a count: its rules, or if byUse (a table read
// over netlink) its use count, the kernel's count of its rules and of
// the jumps to it (wantCounts). By use, one dump of the chains verifies
// every chain's rules without reading one: a rule deleted or added
// changes its chain's count, and a jump rule its target's too.
func compareChains(table string, want map[string]int, saved *savedTable, byUse bool) string {
	if saved == nil {
		if len(want) > 0 {
			return "table " + table + " holds no proxyshift chain"
		}
		return ""
	}
	have := saved.counts
	if byUse {
		have = saved.uses
	}
	seen := 0
	for _, c := range saved.chains {
		if saved.builtin[c] || !owned(c) {
			continue
		}
		n, ok := want[c]
		switch {
		case !ok:
			return fmt.Sprintf("%s chain %s is not in the ruleset", table, c)
		case have[c] != n && byUse:
			return fmt.Sprintf("%s chain %s has a use count (rules and jumps to it) of %d, not %d", table, c, have[c], n)
		case have[c] != n:
			return fmt.Sprintf("%s chain %s has %d rules, not %d", table, c, have[c], n)
		}
		seen++
	}
	if seen < len(want) {
		listed := make(map[string]bool, len(saved.chains))
		for _, c := range saved.chains {
			listed[c] = true
		}
		for _, c := range slices.Sorted(maps.Keys(want)) {
			if !listed[c] {
				return fmt.Sprintf("%s chain %s is missing", table, c)
			}
		}
	}
	return ""
}
