package nftables

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// opKind is the kind of one step of a transaction.
type opKind int

const (
	opAddTable opKind = iota
	opDelTable
	opAddChain
	opFlushChain
	opDelChain
	opAddRule
	opAddSet
	opFlushSet
	opDelSet
	opAddElems
	opDelElems
)

// op is one step of a transaction, in the order the kernel must see it.
// Plans are lists of ops computed by pure functions, so that what a sync
// would do can be tested without a kernel.
type op struct {
	kind opKind
	// name is the chain or set the op is about.
	name string
	// chain is the definition for opAddChain; rule the rule for opAddRule.
	chain *chain
	rule  rule
	// set is the definition for opAddSet and the set elements are written
	// to or deleted from; elems are those elements, in pieces (a full
	// sync's are gathered from every port without copying them).
	set   *set
	elems [][]element
}

// String renders the op in nft's command syntax, without the family and
// table.
func (o op) String() string {
	setKind := func() string {
		if o.set != nil && o.set.isMap() {
			return "map"
		}
		return "set"
	}
	elems := func() string {
		var s []string
		for _, p := range o.elems {
			for _, e := range p {
				s = append(s, e.String())
			}
		}
		return "{ " + strings.Join(s, ", ") + " }"
	}
	switch o.kind {
	case opAddTable:
		return "add table"
	case opDelTable:
		return "delete table"
	case opAddChain:
		return "add chain " + o.name
	case opFlushChain:
		return "flush chain " + o.name
	case opDelChain:
		return "delete chain " + o.name
	case opAddRule:
		return "add rule " + o.name + " " + o.rule.Text
	case opAddSet:
		return "add " + setKind() + " " + o.name
	case opFlushSet:
		return "flush " + setKind() + " " + o.name
	case opDelSet:
		return "delete " + setKind() + " " + o.name
	case opAddElems:
		return "add element " + o.name + " " + elems()
	case opDelElems:
		return "delete element " + o.name + " " + elems()
	}
	return fmt.Sprintf("op(%d) %s", o.kind, o.name)
}

// kernelTable is what a listing of our table in the kernel found: chain
// and named-set definitions by name. A nil *kernelTable means the table
// does not exist.
type kernelTable struct {
	chains map[string]*nftables.Chain
	sets   map[string]*nftables.Set
	// userdata is the sets' user data (see nft.Set.HasUserdata).
	userdata map[string][]byte
}

// fullPlan rewrites the whole table from rs, in place: existing chains
// and maps are flushed and refilled rather than deleted, so that the
// table, its base chains and the affinity sets (whose contents are the
// kernel's, never written by us) survive. Everything existing but not in
// rs is flushed and then deleted, except chains, whose deletion is left
// to a later transaction and returned as stale (see deleteStale).
func fullPlan(rs *ruleset, kt *kernelTable) (ops []op, stale []string) {
	if kt == nil {
		kt = &kernelTable{}
	}
	want, allChains := rs.objects(), rs.allChains()
	chains, sets := want.chains, want.sets
	setNames := slices.Sorted(maps.Keys(sets))

	ops = append(ops, op{kind: opAddTable})
	// Drop every reference first: rules (jumps, set lookups) and map
	// elements (gotos). Then nothing stands in the way of deletions.
	for _, name := range slices.Sorted(maps.Keys(kt.chains)) {
		ops = append(ops, op{kind: opFlushChain, name: name})
	}
	keep := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(kt.sets)) {
		s := sets[name]
		switch {
		case s == nil || !s.sameDefinition(kt.sets[name]) || !s.hasUserdata(kt.userdata[name]):
			ops = append(ops, op{kind: opDelSet, name: name, set: s})
		case s.dynamic():
			keep[name] = true
		default:
			keep[name] = true
			ops = append(ops, op{kind: opFlushSet, name: name, set: s})
		}
	}
	keepChain := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(kt.chains)) {
		c := chains[name]
		switch {
		case c == nil:
			stale = append(stale, name)
		case !c.SameHook(kt.chains[name]):
			ops = append(ops, op{kind: opDelChain, name: name})
		default:
			keepChain[name] = true
		}
	}
	for _, name := range setNames {
		if !keep[name] {
			ops = append(ops, op{kind: opAddSet, name: name, set: sets[name]})
		}
	}
	for _, c := range allChains {
		if !keepChain[c.Name] {
			ops = append(ops, op{kind: opAddChain, name: c.Name, chain: c})
		}
	}
	for _, c := range allChains {
		ops = appendRules(ops, c)
	}
	for _, name := range setNames {
		if s := sets[name]; !s.dynamic() && len(want.elems[name]) > 0 {
			ops = append(ops, op{kind: opAddElems, name: name, set: s, elems: want.elems[name]})
		}
	}
	return ops, stale
}

// replacePlan deletes the table, if it exists, and creates it anew from
// rs in the same transaction: the repair of last resort when fullPlan
// fails on drift it cannot see (it loses the affinity sets' contents).
func replacePlan(rs *ruleset, exists bool) []op {
	var ops []op
	if exists {
		ops = append(ops, op{kind: opAddTable}, op{kind: opDelTable})
	}
	fresh, _ := fullPlan(rs, nil)
	return append(ops, fresh...)
}

func appendRules(ops []op, c *chain) []op {
	for _, r := range c.Rules {
		ops = append(ops, op{kind: opAddRule, name: c.Name, rule: r})
	}
	return ops
}

// portChange is one service port's objects before and after a sync; nil
// means absent.
type portChange struct {
	name     model.ServicePortName
	old, new *portObjects
}

// incrementalPlan rewrites only the objects of the changed ports: their
// elements in the shared maps, their chains whose rules changed, their
// own maps and sets, and the elements of the counted sets whose count
// (counted, as programmed before the changes) drops to zero or rises
// from it. Chains
// that disappear are flushed here and returned as stale, to be deleted
// by a later transaction.
func incrementalPlan(changes []portChange, counted countedElems) (ops []op, stale []string) {
	var delElems, flushChains, setOps, addSets, addChains, addRules, addElems, addCounted []op
	for _, name := range countedSets {
		before, ok := counted[name]
		if !ok {
			continue // a service table: no counted sets
		}
		del, add := countedChanges(changes, name, before)
		if len(del) > 0 {
			delElems = append(delElems, op{kind: opDelElems, name: name, set: &set{name: name}, elems: [][]element{del}})
		}
		if len(add) > 0 {
			addCounted = append(addCounted, op{kind: opAddElems, name: name, set: &set{name: name}, elems: [][]element{add}})
		}
	}
	for _, ch := range changes {
		old, nw := ch.old, ch.new
		if old == nil {
			old = &portObjects{}
		}
		if nw == nil {
			nw = &portObjects{}
		}
		// Shared maps: delete what goes away or changes, add what is new
		// or changed. Comparing whole elements (key, verdict, comment)
		// turns a changed verdict into a delete and an add.
		for _, m := range old.shared.sets() {
			if gone := missing(old.shared.of(m), nw.shared.of(m)); len(gone) > 0 {
				delElems = append(delElems, op{kind: opDelElems, name: m, set: sharedMap(m), elems: [][]element{gone}})
			}
		}
		for _, m := range nw.shared.sets() {
			if added := missing(nw.shared.of(m), old.shared.of(m)); len(added) > 0 {
				addElems = append(addElems, op{kind: opAddElems, name: m, set: sharedMap(m), elems: [][]element{added}})
			}
		}

		// Own sets and maps. A set whose definition changes is deleted
		// and created again, and then every chain of the port is
		// rewritten, because rules referring to it by name do not change.
		oldSets := byName(old.sets, func(s *set) string { return s.name })
		newSets := byName(nw.sets, func(s *set) string { return s.name })
		redefined := false
		for _, s := range old.sets {
			n := newSets[s.name]
			switch {
			case n == nil:
				setOps = append(setOps, op{kind: opDelSet, name: s.name, set: s})
			case !sameSet(s, n):
				redefined = true
				setOps = append(setOps, op{kind: opDelSet, name: s.name, set: s})
			case !n.dynamic() && !elementsEqual(s.elems, n.elems):
				setOps = append(setOps, op{kind: opFlushSet, name: s.name, set: s})
				addElems = append(addElems, op{kind: opAddElems, name: n.name, set: n, elems: [][]element{n.elems}})
			}
		}
		for _, n := range nw.sets {
			if s := oldSets[n.name]; s == nil || !sameSet(s, n) {
				addSets = append(addSets, op{kind: opAddSet, name: n.name, set: n})
				if !n.dynamic() && len(n.elems) > 0 {
					addElems = append(addElems, op{kind: opAddElems, name: n.name, set: n, elems: [][]element{n.elems}})
				}
			}
		}

		// Chains: create the new ones, rewrite the changed ones, flush
		// the ones that go away.
		newChains := byName(nw.chains, func(c *chain) string { return c.Name })
		oldChains := byName(old.chains, func(c *chain) string { return c.Name })
		for _, c := range old.chains {
			n := newChains[c.Name]
			if n == nil {
				flushChains = append(flushChains, op{kind: opFlushChain, name: c.Name})
				stale = append(stale, c.Name)
			} else if redefined || !rulesEqual(c.Rules, n.Rules) {
				flushChains = append(flushChains, op{kind: opFlushChain, name: c.Name})
				addRules = appendRules(addRules, n)
			}
		}
		for _, n := range nw.chains {
			if oldChains[n.Name] == nil {
				addChains = append(addChains, op{kind: opAddChain, name: n.Name, chain: n})
				addRules = appendRules(addRules, n)
			}
		}
	}
	// Release references (elements, then rules) before deleting sets;
	// create sets and chains before the rules and elements naming them.
	for _, part := range [][]op{delElems, flushChains, setOps, addSets, addChains, addRules, addElems, addCounted} {
		ops = append(ops, part...)
	}
	return ops, stale
}

// countedChanges returns the elements of the counted set name that the
// changes remove from it (their count falls to zero) and add to it (it
// rises from zero), given the counts before the changes.
func countedChanges(changes []portChange, name string, before refCounts) (del, add []element) {
	delta := refCounts{}
	elems := map[string]element{}
	count := func(objs *portObjects, d int) {
		if objs == nil {
			return
		}
		for _, e := range objs.counted.of(name) {
			delta[e.keyText()] += d
			elems[e.keyText()] = e
		}
	}
	for _, ch := range changes {
		count(ch.old, -1)
		count(ch.new, 1)
	}
	for _, text := range slices.Sorted(maps.Keys(delta)) {
		was := before[text]
		switch now := was + delta[text]; {
		case was > 0 && now <= 0:
			del = append(del, elems[text])
		case was <= 0 && now > 0:
			add = append(add, elems[text])
		}
	}
	return del, add
}

// sameSet compares two set definitions of ours.
func sameSet(a, b *set) bool {
	return a.keyText == b.keyText && a.verdictMap == b.verdictMap && a.dataText == b.dataText &&
		a.interval == b.interval && a.timeout == b.timeout
}

// sharedMap returns the definition of a shared map; elements of the
// shared maps are written with it. The definitions do not depend on the
// family beyond the key length, which writing elements does not use.
func sharedMap(name string) *set {
	return &set{name: name, verdictMap: true}
}

// missing returns the elements of a that b lacks.
func missing(a, b []element) []element {
	have := make(map[string]bool, len(b))
	for _, e := range b {
		have[e.String()] = true
	}
	var out []element
	for _, e := range a {
		if !have[e.String()] {
			out = append(out, e)
		}
	}
	return out
}

func byName[T any](xs []T, name func(T) string) map[string]T {
	m := make(map[string]T, len(xs))
	for _, x := range xs {
		m[name(x)] = x
	}
	return m
}
