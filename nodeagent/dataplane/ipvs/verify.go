package ipvs

import (
	"context"
	"fmt"
	"net/netip"

	libipvs "github.com/moby/ipvs"
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
// goes on from there: the helper table, the dummy interface's addresses
// and the virtual services it found as wanted stay verified
// (familyState.verified), except the virtual services an incremental
// sync has changed since, which are read again. Drift that came
// meanwhile to what was verified is found by the next periodic resync.

// verify compares family f in the kernel with st. It returns what differs
// first ("" when nothing does), or ctx's error when ctx ended before it
// was done.
func (kn *kernel) verify(ctx context.Context, f *family, st *familyState) (string, error) {
	why, err := kn.verifyFrom(ctx, f, st, &st.verified)
	if ctx.Err() == nil {
		// Done (or failed): the next verification starts afresh.
		st.verified = verifyProgress{}
	}
	return why, err
}

// verifyProgress is how far the verification of a family got before a
// change preempted it.
type verifyProgress struct {
	// table says the helper table and the dummy interface's addresses
	// were verified: the next attempt goes straight to the virtual
	// services.
	table bool
	// services are the virtual services found as wanted.
	services map[vsKey]bool
}

// verifyFrom is verify, skipping what p says is verified and recording in
// p what it verifies. Every read is checked for ctx between two.
func (kn *kernel) verifyFrom(ctx context.Context, f *family, st *familyState, p *verifyProgress) (string, error) {
	want := st.services()
	if !p.table {
		if why, err := kn.verifyTable(ctx, f, st, want); err != nil || why != "" {
			return why, err
		}
		p.table = true
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	all, err := kn.ipvs.GetServices()
	if err != nil {
		return "", fmt.Errorf("ipvs: list virtual services: %w", err)
	}
	listed := map[vsKey]*libipvs.Service{}
	for _, s := range all {
		k, ok := serviceKey(s)
		if s.AddressFamily != f.af || !ok {
			continue
		}
		if _, wanted := want[k]; wanted {
			listed[k] = s
		} else if st.addrRefs[k.addr] > 0 {
			// At an address the backend binds: the backend's (see
			// readServices), and no port's.
			return fmt.Sprintf("virtual service %s is the backend's but no service port's", k), nil
		}
	}
	if len(listed) != len(want) {
		return fmt.Sprintf("%d of %d virtual services are missing", len(want)-len(listed), len(want)), nil
	}
	if p.services == nil {
		p.services = map[vsKey]bool{}
	}
	for _, k := range sortedKeys(want) {
		if p.services[k] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
		have, err := kn.readService(f, k, listed[k])
		if err != nil {
			return "", err
		}
		_, update, _ := diffServices(map[vsKey]*virtualService{k: have}, map[vsKey]*virtualService{k: want[k]})
		if len(update) > 0 {
			return fmt.Sprintf("virtual service %s differs from the model's", k), nil
		}
		p.services[k] = true
	}
	return "", nil
}

// verifyTable compares the helper table (its element and rule counts,
// and the records of want) and the dummy interface's addresses with st.
func (kn *kernel) verifyTable(ctx context.Context, f *family, st *familyState, want map[vsKey]*virtualService) (string, error) {
	tc, err := kn.readTable(f, true)
	if err != nil {
		return "", err
	}
	if wantElems, wantRules := st.tableCounts(); tc.elements != wantElems || tc.rules != wantRules {
		return fmt.Sprintf("the helper table holds %d elements and %d rules, not %d and %d", tc.elements, tc.rules, wantElems, wantRules), nil
	}
	for k := range want {
		if _, ok := tc.records[k]; !ok {
			return fmt.Sprintf("the helper table does not record virtual service %s", k), nil
		}
	}
	if err := ctx.Err(); err != nil {
		return "", err
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
	return "", nil
}
