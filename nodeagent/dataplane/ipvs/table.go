package ipvs

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
)

// The helper table: a fixed set of chains and rules per family, written
// whole by full syncs, and sets and maps whose elements carry everything
// that depends on services. Incremental syncs only add and delete
// elements. See the README for what each object is for.

// Base-chain priorities. Both filter chains run before IPVS, which takes
// packets at local input (priority 98 and 99) and local output (-98 and
// -97), and before kube-proxy's filter chains (-110), as the nftables
// backend's do; the masquerading chain runs before kube-proxy's and
// iptables' (100), which it leaves nothing to do for our connections.
const (
	priorityFilter = nftables.ChainPriority(-120)
	prioritySNAT   = nftables.ChainPriority(90)
)

// tableSets are the family's sets and maps, sorted by name.
func tableSets(f *family) []nft.Set {
	vsKeyType := nftables.MustConcatSetType(f.AddrType, nftables.TypeInetProto, nftables.TypeInetService)
	sets := []nft.Set{
		{Name: setFirewall, KeyType: vsKeyType, Concat: true},
		{Name: setFirewallAllowed, KeyType: nftables.MustConcatSetType(f.AddrType, nftables.TypeInetProto, nftables.TypeInetService, f.AddrType), Concat: true, Interval: true},
		{Name: setHairpin, KeyType: nftables.MustConcatSetType(f.AddrType, f.AddrType), Concat: true},
		{Name: mapNoEndpoint, KeyType: vsKeyType, Concat: true, VerdictMap: true},
		{Name: setServiceIPs, KeyType: f.AddrType},
		{Name: setServiceProtocols, KeyType: nftables.TypeInetProto},
		{Name: mapFromNode, KeyType: vsKeyType, Concat: true, VerdictMap: true},
		{Name: mapFromOthers, KeyType: vsKeyType, Concat: true, VerdictMap: true},
		{Name: mapFromPods, KeyType: vsKeyType, Concat: true, VerdictMap: true},
		{Name: setVirtualServices, KeyType: vsKeyType, Concat: true},
	}
	slices.SortFunc(sets, func(a, b nft.Set) int { return cmp.Compare(a.Name, b.Name) })
	return sets
}

// fixedElements are the elements every table holds whatever the services.
func fixedElements() []element {
	var out []element
	for _, p := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP} {
		out = append(out, element{set: setServiceProtocols, key: []byte{p}}.identify(nft.ProtoName(p)))
	}
	return sortedUnique(out)
}

// tableChains returns the family's chains, base chains first. They depend
// on the node's pod networks (one rule each) and masquerade mark only.
func tableChains(f *family, clusterCIDRs []netip.Prefix, mark uint32) []nft.Chain {
	r := func() *nft.Builder { return nft.NewRule(f.Family) }
	checks := []nft.Rule{
		// Load-balancer IPs with source ranges drop other sources.
		r().ServiceInSet(setFirewall, false).ServiceSaddrInSet(setFirewallAllowed, true).Verdict(verdictDrop).Rule(),
		// Refuse or drop what must not be served.
		r().VmapService(mapNoEndpoint).Rule(),
		// Ports of service IPs that no virtual service has would reach the
		// node's own sockets: refuse them.
		r().AddrInSet(nft.Daddr, false, setServiceIPs).ProtoInSet(setServiceProtocols).ServiceInSet(setVirtualServices, true).
			Verdict(gotoReject).Rule(),
	}
	for _, p := range clusterCIDRs {
		checks = append(checks, r().AddrIn(nft.Saddr, false, p).Goto(chainFromPods).Rule())
	}
	checks = append(checks,
		r().FibLocal(nft.Saddr).Goto(chainFromNode).Rule(),
		r().VmapService(mapFromOthers).Rule())

	newOnly := []nft.Rule{r().CtStateNew().Jump(chainChecks).Rule()}
	return []nft.Chain{
		{Name: chainFilterInput, Hook: &nft.Hook{Type: nftables.ChainTypeFilter, Name: "input", Num: *nftables.ChainHookInput, Priority: priorityFilter}, Rules: newOnly},
		{Name: chainFilterOutput, Hook: &nft.Hook{Type: nftables.ChainTypeFilter, Name: "output", Num: *nftables.ChainHookOutput, Priority: priorityFilter}, Rules: newOnly},
		{Name: chainPostrouting, Hook: &nft.Hook{Type: nftables.ChainTypeNAT, Name: "postrouting", Num: *nftables.ChainHookPostrouting, Priority: prioritySNAT}, Rules: []nft.Rule{
			r().AddrPairInSet(setHairpin).Masquerade().Rule(),
			r().MarkUnset(mark).Return().Rule(),
			r().MarkClear(mark).Rule(),
			r().Masquerade().Rule(),
		}},
		{Name: chainChecks, Rules: checks},
		{Name: chainFromNode, Rules: []nft.Rule{r().VmapService(mapFromNode).Rule()}},
		{Name: chainFromPods, Rules: []nft.Rule{r().VmapService(mapFromPods).Rule()}},
		{Name: chainMarkMasq, Rules: []nft.Rule{r().MarkSet(mark).Rule()}},
		{Name: chainReject, Rules: []nft.Rule{r().RejectTCP().Rule(), r().Reject().Rule()}},
	}
}

// tableRef is the helper table of family f.
func tableRef(f *family) *nftables.Table {
	return &nftables.Table{Name: TableName, Family: f.Table}
}

// setRef returns the library's description of the set named name.
func setRef(f *family, name string) (*nftables.Set, error) {
	for _, s := range tableSets(f) {
		if s.Name == name {
			return s.Kernel(tableRef(f)), nil
		}
	}
	return nil, fmt.Errorf("ipvs: no set %q in the helper table", name)
}

// queueTable queues the replacement of the family's helper table, with
// everything in it, by the one described: chains, rules, sets, and elems
// with the fixed elements. The kernel applies the batch whole or not at
// all, so packets see either table.
func queueTable(txn *nft.Txn, f *family, chains []nft.Chain, elems []element) error {
	conn := txn.Conn()
	t := tableRef(f)
	// Adding first makes the deletion valid whether the table exists.
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	for _, s := range tableSets(f) {
		if err := conn.AddSet(s.Kernel(t), nil); err != nil {
			return fmt.Errorf("ipvs: add set %s: %w", s.Name, err)
		}
	}
	for i := range chains {
		conn.AddChain(chains[i].Kernel(t))
	}
	for _, c := range chains {
		for _, r := range c.Rules {
			if err := nft.AddRule(txn, t, c.Name, r.Exprs); err != nil {
				return err
			}
		}
	}
	return queueElements(txn, f, nil, append(fixedElements(), elems...))
}

// queueElements queues the deletion of del, then the addition of add,
// in as few messages as fit. It sorts both by set.
func queueElements(txn *nft.Txn, f *family, del, add []element) error {
	for _, op := range []struct {
		elems []element
		queue func(*nft.Txn, *nftables.Set, func(*element) nft.Element, ...[]element) error
	}{{del, nft.DeleteElements[element]}, {add, nft.AddElements[element]}} {
		slices.SortStableFunc(op.elems, func(a, b element) int { return cmp.Compare(a.set, b.set) })
		for rest := op.elems; len(rest) > 0; {
			name := rest[0].set
			n := 1
			for n < len(rest) && rest[n].set == name {
				n++
			}
			set, err := setRef(f, name)
			if err != nil {
				return err
			}
			if err := op.queue(txn, set, (*element).kernel, rest[:n]); err != nil {
				return err
			}
			rest = rest[n:]
		}
	}
	return nil
}

// kernel is the element as nft writes it to the kernel.
func (e *element) kernel() nft.Element {
	return nft.Element{Key: e.key, KeyEnd: e.keyEnd, Verdict: e.verdict, Comment: e.comment}
}

// decodeKey reads a virtual service's key from the helper table.
func decodeKey(f *family, b []byte) (vsKey, bool) {
	n := int(f.AddrLen)
	if len(b) < n+8 {
		return vsKey{}, false
	}
	addr, ok := netip.AddrFromSlice(b[:n])
	return vsKey{addr: addr, proto: b[n], port: binary.BigEndian.Uint16(b[n+4:])}, ok
}
