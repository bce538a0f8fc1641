package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
)

// The periodic resync (dataplane.SyncRequest.Resync) verifies and
// repairs, as the nftables and iptables backends' do: it reads the
// family's objects back and compares them with what the backend last
// programmed (familyState); only when they differ does it run a full
// sync, which reads everything again and rewrites what differs. A full
// sync on every resync rewrote the helper table each time and, IPVS
// having no dump of all real servers, made one netlink round trip per
// virtual service while every change waited: under the test VM's
// emulation about 30 s at 1 000 services, which held up one endpoint
// change in ten by as much (make bench-vm).
//
// The reads write nothing, so verification stops between two virtual
// services as soon as ctx ends (a change is waiting), and the next one
// goes on from there: the virtual services it found as wanted stay
// verified (familyState.verified), except those an incremental sync has
// changed since, which are read again. Drift that came meanwhile to a
// verified one is found by the next periodic resync.

// verify compares family f in the kernel with st. It returns what differs
// first ("" when nothing does), or ctx's error when ctx ended before it
// was done.
func (kn *kernel) verify(ctx context.Context, f *family, st *familyState) (string, error) {
	why, err := kn.verifyFrom(ctx, f, st)
	if ctx.Err() == nil {
		// Done (or failed): the next verification starts afresh.
		st.verified = nil
	}
	return why, err
}

func (kn *kernel) verifyFrom(ctx context.Context, f *family, st *familyState) (string, error) {
	tc, err := kn.readTable(f, true)
	if err != nil {
		return "", err
	}
	wantRules := 0
	for _, ch := range st.chains {
		wantRules += len(ch.Rules)
	}
	if wantElems := len(st.elemRefs) + len(fixedElements()); tc.elements != wantElems || tc.rules != wantRules {
		return fmt.Sprintf("the helper table holds %d elements and %d rules, not %d and %d", tc.elements, tc.rules, wantElems, wantRules), nil
	}
	want := st.services()
	for k := range want {
		if _, ok := tc.records[k]; !ok {
			return fmt.Sprintf("the helper table does not record virtual service %s", k), nil
		}
	}
	addrs, err := kn.dummyAddrs(f)
	if err != nil {
		return "", err
	}
	bound := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		bound[a] = true
		if st.addrRefs[a] == 0 {
			return fmt.Sprintf("%s is bound to %s", a, DummyInterface), nil
		}
	}
	if len(bound) != len(st.addrRefs) {
		return fmt.Sprintf("%d addresses are bound to %s, not %d", len(bound), DummyInterface, len(st.addrRefs)), nil
	}

	all, err := kn.ipvs.GetServices()
	if err != nil {
		return "", fmt.Errorf("ipvs: list virtual services: %w", err)
	}
	found := map[vsKey]bool{}
	var read []vsKey
	kernel := map[vsKey]int{}
	for i, s := range all {
		k, ok := serviceKey(s)
		if s.AddressFamily != f.af || !ok {
			continue
		}
		_, recorded := tc.records[k]
		switch _, wanted := want[k]; {
		case wanted:
			found[k] = true
			kernel[k] = i
			if !st.verified[k] {
				read = append(read, k)
			}
		case recorded || bound[k.addr]:
			return fmt.Sprintf("virtual service %s is the backend's but no service port's", k), nil
		}
	}
	if len(found) != len(want) {
		return fmt.Sprintf("%d of %d virtual services are missing", len(want)-len(found), len(want)), nil
	}
	slices.SortFunc(read, compareKeys)
	if st.verified == nil {
		st.verified = map[vsKey]bool{}
	}
	for _, k := range read {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		have, err := kn.readService(f, k, all[kernel[k]])
		if err != nil {
			return "", err
		}
		_, update, _ := diffServices(map[vsKey]*virtualService{k: have}, map[vsKey]*virtualService{k: want[k]})
		if len(update) > 0 {
			return fmt.Sprintf("virtual service %s differs from the model's", k), nil
		}
		st.verified[k] = true
	}
	return "", nil
}
