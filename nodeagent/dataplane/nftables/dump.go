package nftables

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// String dumps the ruleset in nft's syntax, deterministically: sets and
// maps by name, then the base chains in hook order, then the other chains
// by name. It is what golden files hold and what `nft list table` would
// show, comments aside.
func (rs *ruleset) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", rs.f.Name, TableName)
	for _, s := range rs.allSets() {
		s.dump(&b)
	}
	for _, c := range rs.allChains() {
		c.Dump(&b)
	}
	b.WriteString("}\n")
	return b.String()
}

// allSets returns every set and map of the table, the shared maps, the
// service-endpoints maps and the hairpin set with the elements of all
// ports, sorted by name.
func (rs *ruleset) allSets() []*set {
	// The elements are counted first, so that each set's are gathered
	// in one allocation (at 10k services 100 000 endpoint elements).
	counts := map[string]int{}
	for _, objs := range rs.ports {
		for m, elems := range objs.shared {
			counts[m] += len(elems)
		}
		counts[setHairpin] += len(objs.hairpin)
		if m := objs.endpointMap; m != nil {
			counts[m.name] += len(objs.endpointElems)
		}
	}
	shared := map[string][]element{}
	endpointMaps := map[string]*set{}
	var sets []*set
	for _, objs := range rs.ports {
		for m, elems := range objs.shared {
			if shared[m] == nil {
				shared[m] = make([]element, 0, counts[m])
			}
			shared[m] = append(shared[m], elems...)
		}
		if shared[setHairpin] == nil {
			shared[setHairpin] = make([]element, 0, counts[setHairpin])
		}
		shared[setHairpin] = append(shared[setHairpin], objs.hairpin...)
		sets = append(sets, objs.sets...)
		if m := objs.endpointMap; m != nil {
			if endpointMaps[m.name] == nil {
				c := *m
				c.elems = make([]element, 0, counts[m.name])
				endpointMaps[m.name] = &c
				sets = append(sets, &c)
			}
			endpointMaps[m.name].elems = append(endpointMaps[m.name].elems, objs.endpointElems...)
		}
	}
	for _, m := range endpointMaps {
		slices.SortFunc(m.elems, func(a, b element) int { return cmp.Compare(a.keyText(), b.keyText()) })
	}
	for _, s := range rs.sets {
		if elems, ok := shared[s.name]; ok {
			c := *s
			c.elems = append(elems, s.elems...)
			slices.SortFunc(c.elems, func(a, b element) int { return cmp.Compare(a.keyText(), b.keyText()) })
			// Hairpin elements are shared by every port with the endpoint.
			c.elems = slices.CompactFunc(c.elems, func(a, b element) bool { return a.keyText() == b.keyText() })
			s = &c
		}
		sets = append(sets, s)
	}
	slices.SortFunc(sets, func(a, b *set) int { return cmp.Compare(a.name, b.name) })
	return sets
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

func (s *set) dump(b *strings.Builder) {
	kind, typ := "set", s.keyText
	switch {
	case s.verdictMap:
		kind, typ = "map", s.keyText+" : verdict"
	case s.dataMap():
		kind, typ = "map", s.keyText+" : "+s.dataText
	}
	fmt.Fprintf(b, "\t%s %s {\n\t\ttype %s\n", kind, s.name, typ)
	switch {
	case s.interval:
		b.WriteString("\t\tflags interval\n")
	case s.dynamic():
		fmt.Fprintf(b, "\t\tflags dynamic,timeout\n\t\ttimeout %ds\n", int64(s.timeout.Seconds()))
	}
	if len(s.elems) > 0 {
		b.WriteString("\t\telements = {\n")
		for _, e := range s.elems {
			fmt.Fprintf(b, "\t\t\t%s,\n", e)
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}\n")
}
