package ipvs

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// familyState is what the backend programmed in one family: the objects
// of every service port and who holds which virtual service.
type familyState struct {
	rc     *renderConfig
	chains []nft.Chain
	ports  map[model.ServicePortName]*portObjects
	// owners maps each virtual service to the port holding it.
	owners map[vsKey]model.ServicePortName
	// foreign are the virtual services, found by the last full sync, that
	// are not the backend's: no port may take their keys.
	foreign map[vsKey]bool
	// elemRefs counts the ports holding each element, by id, and
	// addrRefs the ports binding each address: elements and addresses
	// are shared (a hairpin pair, an external IP of two services).
	elemRefs map[string]int
	addrRefs map[netip.Addr]int
	// totals are the ports' own counts (services, endpoints, virtual
	// services and real servers), kept up to date by add and remove.
	totals dataplane.Counts
	// conflicts are the keys the full sync that made the state left to
	// foreign virtual services; a resync that verifies the kernel
	// reports them again.
	conflicts []vsKey
	// verified is what a periodic resync that a change preempted has
	// verified already (see verify.go); commit forgets the virtual
	// services it changes.
	verified verifyProgress
}

// newState renders ports into a fresh state. Ports claim virtual
// services in name order: a key another port or a foreign virtual
// service holds is left out of the later port, and conflicts lists the
// keys left out because of foreign ones.
func newState(rc *renderConfig, ports map[model.ServicePortName]*model.ServicePort, foreign map[vsKey]bool) (st *familyState, conflicts []vsKey) {
	st = &familyState{
		rc:       rc,
		chains:   tableChains(rc.f, rc.policy.ClusterCIDRs, rc.policy.MasqueradeMark),
		ports:    make(map[model.ServicePortName]*portObjects, len(ports)),
		owners:   map[vsKey]model.ServicePortName{},
		foreign:  foreign,
		elemRefs: map[string]int{},
		addrRefs: map[netip.Addr]int{},
	}
	for _, name := range model.SortedNames(ports) {
		objs := renderPort(rc, ports[name])
		conflicts = append(conflicts, st.claim(name, objs, nil)...)
		st.add(name, objs)
	}
	return st, conflicts
}

// claim removes from objs the virtual services (and their elements) that
// belong to someone else: a foreign virtual service, or another port
// unless that port is in free (it is being rewritten). It returns the
// keys it removed for foreign ones.
func (st *familyState) claim(name model.ServicePortName, objs *portObjects, free map[model.ServicePortName]bool) (conflicts []vsKey) {
	lost := map[vsKey]bool{}
	objs.services = slices.DeleteFunc(objs.services, func(vs *virtualService) bool {
		owner, held := st.owners[vs.key]
		switch {
		case st.foreign[vs.key]:
			conflicts = append(conflicts, vs.key)
		case !held || owner == name || free[owner]:
			return false
		}
		lost[vs.key] = true
		return true
	})
	if len(lost) > 0 {
		objs.elems = slices.DeleteFunc(objs.elems, func(e element) bool { return lost[e.owner] })
	}
	return conflicts
}

// add records objs as name's.
func (st *familyState) add(name model.ServicePortName, objs *portObjects) {
	st.ports[name] = objs
	st.totals = plus(st.totals, objs.counts(), 1)
	for _, vs := range objs.services {
		st.owners[vs.key] = name
	}
	for _, e := range objs.elems {
		st.elemRefs[e.id()]++
	}
	for _, a := range objs.addrs {
		st.addrRefs[a]++
	}
}

// remove forgets name's objects.
func (st *familyState) remove(name model.ServicePortName) {
	objs := st.ports[name]
	if objs == nil {
		return
	}
	delete(st.ports, name)
	st.totals = plus(st.totals, objs.counts(), -1)
	for _, vs := range objs.services {
		if st.owners[vs.key] == name {
			delete(st.owners, vs.key)
		}
	}
	for _, e := range objs.elems {
		if st.elemRefs[e.id()]--; st.elemRefs[e.id()] == 0 {
			delete(st.elemRefs, e.id())
		}
	}
	for _, a := range objs.addrs {
		if st.addrRefs[a]--; st.addrRefs[a] == 0 {
			delete(st.addrRefs, a)
		}
	}
}

// services returns every virtual service of the state by key.
func (st *familyState) services() map[vsKey]*virtualService {
	out := make(map[vsKey]*virtualService, len(st.owners))
	for _, objs := range st.ports {
		for _, vs := range objs.services {
			out[vs.key] = vs
		}
	}
	return out
}

// elements returns every element of the state once, sorted by id.
func (st *familyState) elements() []element {
	n := 0
	for _, objs := range st.ports {
		n += len(objs.elems)
	}
	out := make([]element, 0, n)
	for _, objs := range st.ports {
		out = append(out, objs.elems...)
	}
	return sortedUnique(out)
}

// counts are the sizes of the state, as Programmed reads them back.
func (st *familyState) counts() dataplane.Counts {
	c := st.totals
	elements, rules := st.tableCounts()
	c.Rules += elements + rules
	return c
}

// tableCounts are the elements (of every set and map) and the rules the
// helper table holds for the state.
func (st *familyState) tableCounts() (elements, rules int) {
	for _, ch := range st.chains {
		rules += len(ch.Rules)
	}
	return len(st.elemRefs) + len(fixedElements()), rules
}

// plus returns a + sign*b.
func plus(a, b dataplane.Counts, sign int) dataplane.Counts {
	a.Services += sign * b.Services
	a.Endpoints += sign * b.Endpoints
	a.Rules += sign * b.Rules
	return a
}

// counts are the port's service (1 if it has a virtual service), its
// distinct endpoints, and its virtual services and real servers (its
// elements are counted once per table, since ports share some).
func (objs *portObjects) counts() dataplane.Counts {
	var c dataplane.Counts
	if len(objs.services) == 0 {
		return c
	}
	c.Services = 1
	endpoints := map[netip.AddrPort]bool{}
	for _, vs := range objs.services {
		c.Rules += 1 + len(vs.dests)
		for d := range vs.dests {
			endpoints[d] = true
		}
	}
	c.Endpoints = len(endpoints)
	return c
}

// plan is the kernel work of one sync of one family, in the order apply
// does it: first the helper table, so that filtering and masquerading
// are in place before a new virtual service takes traffic; then virtual
// services and real servers; then the dummy interface's addresses, so
// that an address is bound only once its virtual services exist and
// unbound before they go; then the deletion of virtual services; last the
// removal of what the helper table held for them.
type plan struct {
	// replace, if set, rewrites the whole helper table with elems; else
	// preDel and add change elements (deletions first).
	replace      bool
	elems        []element
	preDel, add  []element
	create       []*virtualService
	update       []serviceUpdate
	ensureLink   bool
	bind, unbind []netip.Addr
	remove       []vsKey
	postDel      []element
}

// empty says the plan has nothing to do.
func (p *plan) empty() bool {
	return !p.replace && !p.ensureLink && len(p.preDel)+len(p.add)+len(p.create)+len(p.update)+len(p.bind)+
		len(p.unbind)+len(p.remove)+len(p.postDel) == 0
}

// serviceUpdate is the change of one existing virtual service.
type serviceUpdate struct {
	want *virtualService
	// attrs says the scheduler or persistence changed.
	attrs bool
	// add and set are real servers to add and to give another weight
	// (want.dests has the weight); del real servers to delete.
	add, set, del []netip.AddrPort
}

// diffServices compares virtual services and returns what to create,
// update and delete to go from have to want, each sorted.
func diffServices(have, want map[vsKey]*virtualService) (create []*virtualService, update []serviceUpdate, remove []vsKey) {
	for _, k := range sortedKeys(want) {
		w := want[k]
		h, ok := have[k]
		if !ok {
			create = append(create, w)
			continue
		}
		u := serviceUpdate{want: w, attrs: !h.sameAttrs(w)}
		for _, d := range sortedAddrPorts(w.dests) {
			weight, ok := h.dests[d]
			switch {
			case !ok:
				u.add = append(u.add, d)
			case weight != w.dests[d]:
				u.set = append(u.set, d)
			}
		}
		for _, d := range sortedAddrPorts(h.dests) {
			if _, ok := w.dests[d]; !ok {
				u.del = append(u.del, d)
			}
		}
		if u.attrs || len(u.add)+len(u.set)+len(u.del) > 0 {
			update = append(update, u)
		}
	}
	for _, k := range sortedKeys(have) {
		if _, ok := want[k]; !ok {
			remove = append(remove, k)
		}
	}
	return create, update, remove
}

// kernelView is what a full sync reads from the kernel for one family.
type kernelView struct {
	// services are the backend's virtual services with their real
	// servers; foreign the keys of everyone else's.
	services map[vsKey]*virtualService
	foreign  map[vsKey]bool
	// addrs are the addresses on the dummy interface.
	addrs []netip.Addr
}

// fullPlan rewrites the helper table and brings the virtual services and
// the dummy interface from what the kernel holds to st. Virtual services
// of ours that st lacks are deleted; until they are, the helper table
// keeps their records, so that a sync cut short leaves them recognisable.
// Those in an excluded CIDR are not deleted but forgotten: the new table
// does not record them.
func fullPlan(st *familyState, kv *kernelView) *plan {
	want := st.services()
	p := &plan{replace: true, ensureLink: true}
	p.create, p.update, p.remove = diffServices(kv.services, want)
	p.remove = deletable(st.rc.exclude, p.remove)
	p.elems = st.elements()
	for _, k := range p.remove {
		rec := keyElement(st.rc.f, setVirtualServices, k, nil, "")
		p.elems = append(p.elems, rec)
		p.postDel = append(p.postDel, rec)
	}
	have := map[netip.Addr]bool{}
	for _, a := range kv.addrs {
		have[a] = true
		if st.addrRefs[a] == 0 {
			p.unbind = append(p.unbind, a)
		}
	}
	for _, a := range sortedAddrs(st.addrRefs) {
		if !have[a] {
			p.bind = append(p.bind, a)
		}
	}
	return p
}

// portChange is one changed service port: what it had, what it gets
// (nil when it is deleted).
type portChange struct {
	name     model.ServicePortName
	old, new *portObjects
}

// changesFor renders the changed ports of the model (a name absent from
// it was deleted) against st. A virtual service an unchanged port or a
// foreign one holds stays theirs; conflicts lists the keys left out for
// foreign ones.
func changesFor(st *familyState, ports map[model.ServicePortName]*model.ServicePort, changed model.ChangeSet) (changes []portChange, conflicts []vsKey) {
	free := map[model.ServicePortName]bool{}
	for name := range changed {
		free[name] = true
	}
	batch := map[vsKey]bool{}
	for _, name := range model.SortedNames(changed) {
		ch := portChange{name: name, old: st.ports[name]}
		if sp := ports[name]; sp != nil {
			ch.new = renderPort(st.rc, sp)
			conflicts = append(conflicts, st.claim(name, ch.new, free)...)
			// Two changed ports wanting one key: the first by name.
			ch.new.services = slices.DeleteFunc(ch.new.services, func(vs *virtualService) bool {
				if batch[vs.key] {
					ch.new.elems = slices.DeleteFunc(ch.new.elems, func(e element) bool { return e.owner == vs.key })
					return true
				}
				batch[vs.key] = true
				return false
			})
		}
		if ch.old != nil || ch.new != nil {
			changes = append(changes, ch)
		}
	}
	return changes, conflicts
}

// incrementalPlan changes what the changed ports had into what they get,
// and nothing else. Shared elements and addresses are added when their
// first holder appears and removed when their last goes. A virtual
// service in an excluded CIDR that no port wants any more stays in the
// kernel, without its elements and record.
func incrementalPlan(st *familyState, changes []portChange) *plan {
	have, want := map[vsKey]*virtualService{}, map[vsKey]*virtualService{}
	elemDelta, addrDelta := map[string]int{}, map[netip.Addr]int{}
	elems := map[string]element{}
	for _, ch := range changes {
		for sign, objs := range map[int]*portObjects{-1: ch.old, 1: ch.new} {
			if objs == nil {
				continue
			}
			for _, vs := range objs.services {
				if sign < 0 {
					have[vs.key] = vs
				} else {
					want[vs.key] = vs
				}
			}
			for _, e := range objs.elems {
				elemDelta[e.id()] += sign
				elems[e.id()] = e
			}
			for _, a := range objs.addrs {
				addrDelta[a] += sign
			}
		}
	}
	p := &plan{}
	p.create, p.update, p.remove = diffServices(have, want)
	p.remove = deletable(st.rc.exclude, p.remove)
	for _, id := range slices.Sorted(maps.Keys(elemDelta)) {
		before := st.elemRefs[id]
		after := before + elemDelta[id]
		e := elems[id]
		switch {
		case before == 0 && after > 0:
			p.add = append(p.add, e)
		case before > 0 && after == 0 && want[e.owner] != nil:
			// Its virtual service stays: change the element with the
			// others, before the virtual services change.
			p.preDel = append(p.preDel, e)
		case before > 0 && after == 0:
			p.postDel = append(p.postDel, e)
		}
	}
	for _, a := range slices.SortedFunc(maps.Keys(addrDelta), netip.Addr.Compare) {
		before := st.addrRefs[a]
		switch after := before + addrDelta[a]; {
		case before == 0 && after > 0:
			p.bind = append(p.bind, a)
		case before > 0 && after == 0:
			p.unbind = append(p.unbind, a)
		}
	}
	return p
}

// commit records changes, which the kernel now holds, in st.
func (st *familyState) commit(changes []portChange) {
	for _, ch := range changes {
		for _, objs := range []*portObjects{ch.old, ch.new} {
			if objs != nil {
				for _, vs := range objs.services {
					delete(st.verified.services, vs.key)
				}
			}
		}
		st.remove(ch.name)
	}
	for _, ch := range changes {
		if ch.new != nil {
			st.add(ch.name, ch.new)
		}
	}
}

func sortedKeys[V any](m map[vsKey]V) []vsKey {
	return slices.SortedFunc(maps.Keys(m), compareKeys)
}

func sortedAddrPorts[V any](m map[netip.AddrPort]V) []netip.AddrPort {
	return slices.SortedFunc(maps.Keys(m), netip.AddrPort.Compare)
}

func sortedAddrs[V any](m map[netip.Addr]V) []netip.Addr {
	return slices.SortedFunc(maps.Keys(m), netip.Addr.Compare)
}
