package iptables

import (
	"context"
	"fmt"
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
func (b *Backend) verify(ctx context.Context, f *family, rs *ruleset) (string, error) {
	cur, err := b.run.read(ctx, f, nil, true)
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

// compareTable says how the saved table differs from what rs puts in it
// ("" when it does not): a proxyshift chain missing, extra or with
// another number of rules, or the jump rules into proxyshift's chains
// not exactly as a sync writes them.
func compareTable(table string, rs *ruleset, saved *savedTable) string {
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
		if saved.counts[c] != n {
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
