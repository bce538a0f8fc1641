package iptables

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// tables are the tables proxyshift programs, in the order a restore input
// lists them. On a sync the nat table commits first: a connection it
// starts to DNAT never matches the filter table's rejects and drops,
// which match only connections that were not DNATed.
var tables = []string{tableNAT, tableFilter}

// block is the part of a restore input about one group of chains (a
// service port's, or the fixed ones), written together in the order of
// the fields: chains are declared first (a declaration creates a chain,
// or flushes it if it exists), rules are deleted, inserted and appended,
// and flushed chains nothing refers to any longer are deleted last.
type block struct {
	declare []string
	del     []string
	insert  []string
	// append holds the rules to append, a chain's at a time: a full sync
	// at 10 000 services appends 120 000 rules, written out from the
	// rendered specs without a line of their own each.
	append []chainRules
	remove []string
}

// chainRules are rules to append to one chain, by their specs.
type chainRules struct {
	chain string
	specs []string
}

func (b *block) empty() bool {
	return len(b.declare)+len(b.del)+len(b.insert)+len(b.append)+len(b.remove) == 0
}

func (b *block) appendRules(chain string, specs ...string) {
	b.append = append(b.append, chainRules{chain: chain, specs: specs})
}

// tableInput is the part of an iptables-restore --noflush input for one
// table: a head block (the fixed chains and the jump rules), one block
// per service port in descending order of port prefix (see names.go for
// why), and a tail block (the fixed chains' own rules, after the ports'
// rules in them, and chains to delete that are not a port's).
type tableInput struct {
	name       string
	head, tail block
	ports      map[string]*block
}

func (t *tableInput) port(key string) *block {
	b := t.ports[key]
	if b == nil {
		b = &block{}
		t.ports[key] = b
	}
	return b
}

// stale adds a chain to flush and delete, in its port's block if it is a
// port's chain (nothing but the fixed chains and the port's own chains
// refers to it), else in the head and tail.
func (t *tableInput) stale(chain string) {
	if key, ok := blockKey(chain); ok {
		b := t.port(key)
		b.declare = append(b.declare, chain)
		b.remove = append(b.remove, chain)
		return
	}
	t.head.declare = append(t.head.declare, chain)
	t.tail.remove = append(t.tail.remove, chain)
}

// restoreInput is a whole iptables-restore --noflush input: one
// transaction per table, all in one run of the command.
type restoreInput []*tableInput

func newRestoreInput(names ...string) restoreInput {
	in := make(restoreInput, len(names))
	for i, n := range names {
		in[i] = &tableInput{name: n, ports: map[string]*block{}}
	}
	return in
}

// empty says whether the input holds nothing to do.
func (in restoreInput) empty() bool { return in.commits() == 0 }

// commits is the number of tables the input changes: each is one
// transaction (a COMMIT line) of its own.
func (in restoreInput) commits() int {
	n := 0
	for _, t := range in {
		if t.changes() {
			n++
		}
	}
	return n
}

// changes says whether any of the table's blocks holds something to do.
func (t *tableInput) changes() bool {
	if !t.head.empty() || !t.tail.empty() {
		return true
	}
	for _, bl := range t.ports {
		if !bl.empty() {
			return true
		}
	}
	return false
}

// writeTo writes the input in iptables-restore's format: for each table
// it changes, the head block, the ports' blocks in descending order of
// their keys, the tail block, then COMMIT. A restore reads it as it is
// written (runner.restore), so the Go side's writing and the command's
// parsing overlap.
func (in restoreInput) writeTo(out io.Writer) error {
	w := bufio.NewWriterSize(out, 64<<10)
	for _, t := range in {
		if !t.changes() {
			continue
		}
		blocks := []*block{&t.head}
		for _, key := range slices.Sorted(maps.Keys(t.ports)) {
			blocks = append(blocks, t.ports[key])
		}
		slices.Reverse(blocks[1:])
		blocks = append(blocks, &t.tail)
		w.WriteString("*" + t.name + "\n")
		for _, bl := range blocks {
			for _, c := range bl.declare {
				w.WriteString(":" + c + " - [0:0]\n")
			}
			for _, lines := range [][]string{bl.del, bl.insert} {
				for _, l := range lines {
					w.WriteString(l)
					w.WriteByte('\n')
				}
			}
			for _, cr := range bl.append {
				for _, spec := range cr.specs {
					w.WriteString("-A ")
					w.WriteString(cr.chain)
					w.WriteByte(' ')
					w.WriteString(spec)
					w.WriteByte('\n')
				}
			}
			for _, c := range bl.remove {
				w.WriteString("-X " + c + "\n")
			}
		}
		w.WriteString("COMMIT\n")
	}
	return w.Flush()
}

// fullRestore returns the input that makes the kernel hold exactly rs in
// the nat and filter tables, given what iptables-save found there (nil if
// nothing): every proxyshift chain is declared (created, or flushed) and
// written again, chains no longer wanted are flushed and deleted, and
// missing jump rules are inserted at the top of their built-in chains
// (duplicates and jumps to chains no longer wanted are deleted).
func fullRestore(rs *ruleset, cur savedTables) restoreInput {
	in := newRestoreInput(tables...)
	for _, t := range in {
		wanted := map[string]bool{}
		for _, c := range rs.fixed {
			if c.table == t.name {
				t.head.declare = append(t.head.declare, c.name)
				t.tail.appendRules(c.name, c.rules...)
				wanted[c.name] = true
			}
		}
		for _, name := range model.SortedNames(rs.ports) {
			pr := rs.ports[name]
			b := t.port(pr.key)
			for _, c := range pr.chains {
				if c.table == t.name {
					b.declare = append(b.declare, c.name)
					b.appendRules(c.name, c.rules...)
					wanted[c.name] = true
				}
			}
			// After the port's own chains, which its rules here lead to.
			for _, r := range pr.shared {
				if r.table == t.name {
					b.appendRules(r.chain, r.spec)
				}
			}
		}
		saved := cur[t.name]
		if saved != nil {
			for _, c := range saved.chains {
				if owned(c) && !wanted[c] {
					t.stale(c)
				}
			}
		}
		t.hook(saved)
	}
	return in
}

// fillRestores splits the input that fills tables holding nothing of
// proxyshift's with rs into restores run one after the other, the middle
// ones at once: fixed declares the fixed chains with their own rules;
// ports[i] (parts of them) creates and fills the chains of a share of
// the service ports, in sorted order, and inserts their rules into the
// fixed chains at the top, as an incremental sync does (their order
// among themselves does not matter: no two ports claim one destination,
// see model.Refusal; the fixed chains' own rules stay last); hooks
// inserts the jump rules from the built-in chains, so nothing leads into
// the chains before they are complete. What the kernel holds after all
// of them is what fullRestore(rs, nil) writes, but for the order of the
// ports' rules in the fixed chains.
func fillRestores(rs *ruleset, parts int) (fixed restoreInput, ports []restoreInput, hooks restoreInput) {
	fixed, hooks = newRestoreInput(tables...), newRestoreInput(tables...)
	ports = make([]restoreInput, parts)
	for i := range ports {
		ports[i] = newRestoreInput(tables...)
	}
	names := model.SortedNames(rs.ports)
	for ti, table := range tables {
		for _, c := range rs.fixed {
			if c.table == table {
				fixed[ti].head.declare = append(fixed[ti].head.declare, c.name)
				fixed[ti].tail.appendRules(c.name, c.rules...)
			}
		}
		for i, name := range names {
			pr := rs.ports[name]
			b := ports[i*parts/len(names)][ti].port(pr.key)
			for _, c := range chainsIn(pr, table) {
				b.declare = append(b.declare, c.name)
				b.appendRules(c.name, c.rules...)
			}
			for _, r := range sharedIn(pr, table) {
				b.insert = append(b.insert, "-I "+r.chain+" 1 "+r.spec)
			}
		}
		hooks[ti].hook(nil)
	}
	return fixed, ports, hooks
}

// hook makes the table's jump rules exist exactly once each: it keeps the
// first rule of a built-in chain that is exactly a wanted jump (iptables
// prints them back as written), deletes every other rule of a built-in
// chain that leads into a proxyshift chain (duplicates, jumps changed by
// hand, jumps to chains no longer wanted), and inserts missing jumps at
// the top of their chains.
func (t *tableInput) hook(saved *savedTable) {
	kept := map[jumpRule]bool{}
	if saved != nil {
		for _, c := range saved.chains {
			if !saved.builtin[c] {
				continue
			}
			for _, spec := range saved.rules[c] {
				tgt := target(spec)
				if !owned(tgt) {
					continue
				}
				j := jumpRule{table: t.name, chain: c, target: tgt, spec: spec}
				if slices.Contains(jumps, j) && !kept[j] {
					kept[j] = true
					continue
				}
				t.head.del = append(t.head.del, "-D "+c+" "+spec)
			}
		}
	}
	for _, j := range jumps {
		if j.table == t.name && !kept[j] {
			t.head.insert = append(t.head.insert, "-I "+j.chain+" 1 "+j.spec)
		}
	}
}

// portChange pairs what a service port had programmed with what it should
// have now; nil for none.
type portChange struct {
	name     model.ServicePortName
	old, new *portRules
}

// incrementalRestore returns the input that moves the changed ports from
// their old rules to their new ones and touches nothing else: chains
// whose rules changed are declared (flushed) and written again, new ones
// created, chains no longer wanted flushed and deleted; rules in the
// fixed chains are deleted by their text and inserted at the top (their
// order among themselves does not matter, and the NodePort dispatch stays
// last). It is empty when nothing changed.
func incrementalRestore(changes []portChange) restoreInput {
	in := newRestoreInput(tables...)
	for _, t := range in {
		for _, ch := range changes {
			b := t.port(namesFor(ch.name).key)
			oldChains, newChains := chainsOf(ch.old, t.name), chainsOf(ch.new, t.name)
			for _, c := range chainsIn(ch.new, t.name) {
				if o := oldChains[c.name]; o == nil || !slices.Equal(o.rules, c.rules) {
					b.declare = append(b.declare, c.name)
					b.appendRules(c.name, c.rules...)
				}
			}
			for _, c := range chainsIn(ch.old, t.name) {
				if newChains[c.name] == nil {
					b.declare = append(b.declare, c.name)
					b.remove = append(b.remove, c.name)
				}
			}
			oldShared, newShared := sharedOf(ch.old, t.name), sharedOf(ch.new, t.name)
			for _, r := range sharedIn(ch.old, t.name) {
				if !newShared[r] {
					b.del = append(b.del, "-D "+r.chain+" "+r.spec)
				}
			}
			for _, r := range sharedIn(ch.new, t.name) {
				if !oldShared[r] {
					b.insert = append(b.insert, "-I "+r.chain+" 1 "+r.spec)
				}
			}
		}
	}
	return in
}

// chainsIn returns pr's chains in table, in order (none for nil).
func chainsIn(pr *portRules, table string) []*chain {
	if pr == nil {
		return nil
	}
	var out []*chain
	for _, c := range pr.chains {
		if c.table == table {
			out = append(out, c)
		}
	}
	return out
}

func chainsOf(pr *portRules, table string) map[string]*chain {
	m := map[string]*chain{}
	for _, c := range chainsIn(pr, table) {
		m[c.name] = c
	}
	return m
}

func sharedIn(pr *portRules, table string) []sharedRule {
	if pr == nil {
		return nil
	}
	var out []sharedRule
	for _, r := range pr.shared {
		if r.table == table {
			out = append(out, r)
		}
	}
	return out
}

func sharedOf(pr *portRules, table string) map[sharedRule]bool {
	m := map[sharedRule]bool{}
	for _, r := range sharedIn(pr, table) {
		m[r] = true
	}
	return m
}

// removedRule and removedChain say what a cleanup removed: a rule of a
// built-in chain that led into proxyshift's chain target, or one of
// proxyshift's chains, as the iptables tool tool names them.
func removedRule(tool, table, chain, target string) string {
	return fmt.Sprintf("%s %s rule %s -> %s", tool, table, chain, target)
}

func removedChain(tool, table, chain string) string {
	return fmt.Sprintf("%s %s chain %s", tool, table, chain)
}

// cleanupRestore returns the input that removes every proxyshift object
// from the tables cur describes: the rules of built-in chains that lead
// into a proxyshift chain, and every proxyshift chain (flushed, then
// deleted). It also describes each removed object, one line each, named
// after tool (such as "iptables-nft"). The input is empty when there is
// nothing to remove.
func cleanupRestore(cur savedTables, tool string) (restoreInput, []string) {
	var names []string
	for n := range cur {
		names = append(names, n)
	}
	slices.Sort(names)
	in := newRestoreInput(names...)
	var removed []string
	for _, t := range in {
		saved := cur[t.name]
		for _, c := range saved.chains {
			if saved.builtin[c] {
				for _, spec := range saved.rules[c] {
					if tgt := target(spec); owned(tgt) {
						t.head.del = append(t.head.del, "-D "+c+" "+spec)
						removed = append(removed, removedRule(tool, t.name, c, tgt))
					}
				}
			} else if owned(c) {
				t.stale(c)
				removed = append(removed, removedChain(tool, t.name, c))
			}
		}
	}
	return in, removed
}
