package nftables

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// String dumps the ruleset in nft's syntax, deterministically: sets and
// maps by name, each with its elements by key, then the base chains in
// hook order, then the other chains by name. It is what golden files
// hold and what `nft list table` would show, comments aside.
func (rs *ruleset) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", rs.f.Name, rs.name)
	objs := rs.objects()
	for _, name := range slices.Sorted(maps.Keys(objs.sets)) {
		elems := slices.Concat(objs.elems[name]...)
		slices.SortFunc(elems, func(a, b element) int { return cmp.Compare(a.keyText(), b.keyText()) })
		objs.sets[name].dump(&b, elems)
	}
	for _, c := range rs.allChains() {
		c.Dump(&b)
	}
	b.WriteString("}\n")
	return b.String()
}

// String dumps the tables in nft's syntax: the main table, then each
// service table that holds a port's objects (the others hold only the
// fixed objects every service table has).
func (ts tables) String() string {
	var b strings.Builder
	b.WriteString(ts.main().String())
	for _, rs := range ts[1:] {
		if rs.holdsPorts() {
			b.WriteString("\n" + rs.String())
		}
	}
	return b.String()
}

// holdsPorts says whether some port has objects in rs.
func (rs *ruleset) holdsPorts() bool {
	for _, objs := range rs.ports {
		if len(objs.chains)+len(objs.sets)+len(objs.shared) > 0 {
			return true
		}
	}
	return false
}

// wanted are the chains and sets a ruleset puts in the kernel, and each
// set's elements in pieces (its own, then each port's), gathered without
// copying an element: a full sync writes them and a resync compares them.
type wanted struct {
	chains map[string]*chain
	sets   map[string]*set
	elems  map[string][][]element
}

// objects gathers what rs puts in the kernel. The ports' pieces come in
// no particular order (the kernel needs none, String sorts, and a resync
// that runs every 30 s need not sort 10 000 names). Each counted set's
// elements are one piece, each once: ports with an endpoint (or a
// service) in common hold the same element.
func (rs *ruleset) objects() wanted {
	w := wanted{chains: map[string]*chain{}, sets: map[string]*set{}, elems: map[string][][]element{}}
	add := func(s *set) {
		w.sets[s.name] = s
		if len(s.elems) > 0 {
			w.elems[s.name] = append(w.elems[s.name], s.elems)
		}
	}
	for _, c := range rs.chains {
		w.chains[c.Name] = c
	}
	for _, s := range rs.sets {
		add(s)
	}
	counted := map[string][]element{}
	seen := map[string]map[string]bool{}
	for name := range rs.counted {
		seen[name] = map[string]bool{}
	}
	for _, objs := range rs.ports {
		for _, c := range objs.chains {
			w.chains[c.Name] = c
		}
		for _, s := range objs.sets {
			add(s)
		}
		for _, sh := range objs.shared {
			w.elems[sh.set] = append(w.elems[sh.set], sh.elems)
		}
		for _, sh := range objs.counted {
			for _, e := range sh.elems {
				if !seen[sh.set][e.keyText()] {
					seen[sh.set][e.keyText()] = true
					counted[sh.set] = append(counted[sh.set], e)
				}
			}
		}
	}
	for name, elems := range counted {
		w.elems[name] = append(w.elems[name], elems)
	}
	return w
}

// allChains returns every chain: the base chains first, then the others
// sorted by name.
func (rs *ruleset) allChains() []*chain {
	var base, regular []*chain
	for _, c := range rs.chains {
		if c.Hook != nil {
			base = append(base, c)
		} else {
			regular = append(regular, c)
		}
	}
	for _, objs := range rs.ports {
		regular = append(regular, objs.chains...)
	}
	slices.SortFunc(regular, func(a, b *chain) int { return cmp.Compare(a.Name, b.Name) })
	return append(base, regular...)
}

// dump writes s's definition and elems in nft's syntax.
func (s *set) dump(b *strings.Builder, elems []element) {
	kind, typ := "set", s.keyText
	switch {
	case s.verdictMap:
		kind, typ = "map", s.keyText+" : verdict"
	case s.dataMap():
		kind, typ = "map", s.keyText+" : "+s.dataText
	}
	word := "type"
	if d := s.def(); d.NumgenKey > 0 {
		word, typ = "typeof", d.Typeof()
	}
	fmt.Fprintf(b, "\t%s %s {\n\t\t%s %s\n", kind, s.name, word, typ)
	switch {
	case s.interval:
		b.WriteString("\t\tflags interval\n")
	case s.dynamic():
		fmt.Fprintf(b, "\t\tflags dynamic,timeout\n\t\ttimeout %ds\n", int64(s.timeout.Seconds()))
	}
	if len(elems) > 0 {
		b.WriteString("\t\telements = {\n")
		for _, e := range elems {
			fmt.Fprintf(b, "\t\t\t%s,\n", e)
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}\n")
}
