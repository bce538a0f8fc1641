package ipvs

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
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

// tableSet describes one set or map of the helper table.
type tableSet struct {
	name    string
	keyType nftables.SetDatatype
	// ranges says the elements are ranges of a concatenation (each with a
	// key and an inclusive key end).
	ranges bool
	vmap   bool
}

// concatenated says whether the set's key is a concatenation.
func (s tableSet) concatenated() bool { return strings.Contains(s.keyType.Name, " . ") }

// tableSets are the family's sets and maps, sorted by name.
func tableSets(f *family) []tableSet {
	vsKeyType := nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService)
	sets := []tableSet{
		{name: setFirewall, keyType: vsKeyType},
		{name: setFirewallAllowed, keyType: nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService, f.addrType), ranges: true},
		{name: setHairpin, keyType: nftables.MustConcatSetType(f.addrType, f.addrType)},
		{name: mapNoEndpoint, keyType: vsKeyType, vmap: true},
		{name: setServiceIPs, keyType: f.addrType},
		{name: setServiceProtocols, keyType: nftables.TypeInetProto},
		{name: mapFromNode, keyType: vsKeyType, vmap: true},
		{name: mapFromOthers, keyType: vsKeyType, vmap: true},
		{name: mapFromPods, keyType: vsKeyType, vmap: true},
		{name: setVirtualServices, keyType: vsKeyType},
	}
	slices.SortFunc(sets, func(a, b tableSet) int { return cmp.Compare(a.name, b.name) })
	return sets
}

// tableChain is one chain of the helper table with its rules.
type tableChain struct {
	name string
	// hook is set for base chains.
	hook *chainHook
	// rules are the chain's rules, each with its nft text.
	rules []tableRule
}

type chainHook struct {
	typ      nftables.ChainType
	name     string
	num      nftables.ChainHook
	priority nftables.ChainPriority
}

type tableRule struct {
	text  string
	exprs []expr.Any
}

// fixedElements are the elements every table holds whatever the services.
func fixedElements() []element {
	var out []element
	for _, p := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP} {
		out = append(out, element{set: setServiceProtocols, key: []byte{p}}.identify(protoName(p)))
	}
	return sortedUnique(out)
}

// tableChains returns the family's chains, base chains first. They depend
// on the node's pod networks (one rule each) and masquerade mark only.
func tableChains(f *family, clusterCIDRs []netip.Prefix, mark uint32) []tableChain {
	r := &rules{f: f}
	checks := []tableRule{
		// Load-balancer IPs with source ranges drop other sources.
		r.join(r.matchKey(setFirewall, false), r.matchKeySaddr(setFirewallAllowed, true), r.verdict(verdictDrop)),
		// Refuse or drop what must not be served.
		r.vmapKey(mapNoEndpoint),
		// Ports of service IPs that no virtual service has would reach the
		// node's own sockets: refuse them.
		r.join(r.matchAddr("daddr", setServiceIPs), r.matchProto(setServiceProtocols), r.matchKey(setVirtualServices, true),
			r.verdict(gotoReject)),
	}
	for _, p := range clusterCIDRs {
		checks = append(checks, r.join(r.saddrIn(p), r.verdict(&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainFromPods})))
	}
	checks = append(checks,
		r.join(r.fibSaddrLocal(), r.verdict(&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainFromNode})),
		r.vmapKey(mapFromOthers))

	newOnly := func(chain string) []tableRule {
		return []tableRule{r.join(r.ctStateNew(), r.verdict(&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}))}
	}
	return []tableChain{
		{name: chainFilterInput, hook: &chainHook{nftables.ChainTypeFilter, "input", *nftables.ChainHookInput, priorityFilter}, rules: newOnly(chainChecks)},
		{name: chainFilterOutput, hook: &chainHook{nftables.ChainTypeFilter, "output", *nftables.ChainHookOutput, priorityFilter}, rules: newOnly(chainChecks)},
		{name: chainPostrouting, hook: &chainHook{nftables.ChainTypeNAT, "postrouting", *nftables.ChainHookPostrouting, prioritySNAT}, rules: []tableRule{
			r.join(r.matchPair(setHairpin), r.masquerade()),
			r.join(r.markUnset(mark), r.verdict(&expr.Verdict{Kind: expr.VerdictReturn})),
			r.markClear(mark),
			r.masquerade(),
		}},
		{name: chainChecks, rules: checks},
		{name: chainFromNode, rules: []tableRule{r.vmapKey(mapFromNode)}},
		{name: chainFromPods, rules: []tableRule{r.vmapKey(mapFromPods)}},
		{name: chainMarkMasq, rules: []tableRule{r.markSet(mark)}},
		{name: chainReject, rules: []tableRule{r.rejectTCP(), r.rejectICMP()}},
	}
}

// rules builds the helper table's rules, each as nft text and kernel
// expressions together. Keys are loaded the way nft loads a
// concatenation: the first field into NFT_REG_1, every further one into
// the next 32-bit register after the previous field.
type rules struct{ f *family }

const reg1 = unix.NFT_REG_1

func (r *rules) join(parts ...tableRule) tableRule {
	var out tableRule
	var words []string
	for _, p := range parts {
		words = append(words, p.text)
		out.exprs = append(out.exprs, p.exprs...)
	}
	out.text = strings.Join(words, " ")
	return out
}

func (r *rules) addr(which string, reg uint32) expr.Any {
	off := r.f.daddrOffset
	if which == "saddr" {
		off = r.f.saddrOffset
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: r.f.addrLen}
}

// key loads "daddr . meta l4proto . th dport", a virtual service's key.
func (r *rules) key() (string, []expr.Any) {
	return r.f.name + " daddr . meta l4proto . th dport", []expr.Any{
		r.addr("daddr", reg1),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r.f.afterAddr},
		&expr.Payload{DestRegister: r.f.afterAddr + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

func lookup(set string, invert bool) (string, expr.Any) {
	op := "@"
	if invert {
		op = "!= @"
	}
	return op + set, &expr.Lookup{SourceRegister: reg1, SetName: set, Invert: invert}
}

// matchKey matches packets whose virtual-service key is (not) in set.
func (r *rules) matchKey(set string, invert bool) tableRule {
	text, exprs := r.key()
	op, l := lookup(set, invert)
	return tableRule{text: text + " " + op, exprs: append(exprs, l)}
}

// matchKeySaddr matches packets whose "key . saddr" is (not) in set.
func (r *rules) matchKeySaddr(set string, invert bool) tableRule {
	text, exprs := r.key()
	op, l := lookup(set, invert)
	return tableRule{
		text:  fmt.Sprintf("%s . %s saddr %s", text, r.f.name, op),
		exprs: append(exprs, r.addr("saddr", r.f.afterAddr+2), l),
	}
}

// matchPair matches packets whose "saddr . daddr" is in set.
func (r *rules) matchPair(set string) tableRule {
	op, l := lookup(set, false)
	return tableRule{
		text:  fmt.Sprintf("%s saddr . %s daddr %s", r.f.name, r.f.name, op),
		exprs: []expr.Any{r.addr("saddr", reg1), r.addr("daddr", r.f.afterAddr), l},
	}
}

func (r *rules) matchAddr(which, set string) tableRule {
	op, l := lookup(set, false)
	return tableRule{text: fmt.Sprintf("%s %s %s", r.f.name, which, op), exprs: []expr.Any{r.addr(which, reg1), l}}
}

func (r *rules) matchProto(set string) tableRule {
	op, l := lookup(set, false)
	return tableRule{text: "meta l4proto " + op, exprs: []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, l}}
}

func (r *rules) vmapKey(m string) tableRule {
	text, exprs := r.key()
	return tableRule{
		text:  text + " vmap @" + m,
		exprs: append(exprs, &expr.Lookup{SourceRegister: reg1, SetName: m, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT}),
	}
}

// saddrIn matches sources in p.
func (r *rules) saddrIn(p netip.Prefix) tableRule {
	p = p.Masked()
	mask := make([]byte, r.f.addrLen)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return tableRule{text: fmt.Sprintf("%s saddr %s", r.f.name, p), exprs: []expr.Any{
		r.addr("saddr", reg1),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: r.f.addrLen, Mask: mask, Xor: make([]byte, r.f.addrLen)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: r.f.bytes(p.Addr())},
	}}
}

func (r *rules) fibSaddrLocal() tableRule {
	return tableRule{text: "fib saddr type local", exprs: []expr.Any{
		&expr.Fib{Register: reg1, ResultADDRTYPE: true, FlagSADDR: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}}
}

func (r *rules) ctStateNew() tableRule {
	return tableRule{text: "ct state new", exprs: []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}}
}

func (r *rules) verdict(v *expr.Verdict) tableRule {
	text := "return"
	if v.Kind != expr.VerdictReturn {
		text = verdictText(v)
	}
	return tableRule{text: text, exprs: []expr.Any{v}}
}

// markSet ORs mark into the packet mark.
func (r *rules) markSet(mark uint32) tableRule {
	return r.setMark(fmt.Sprintf("meta mark set meta mark | 0x%08x", mark), ^mark, mark)
}

// markClear flips mark, known to be set, off.
func (r *rules) markClear(mark uint32) tableRule {
	return r.setMark(fmt.Sprintf("meta mark set meta mark ^ 0x%08x", mark), ^uint32(0), mark)
}

func (r *rules) setMark(text string, and, xor uint32) tableRule {
	return tableRule{text: text, exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(and), Xor: binaryutil.NativeEndian.PutUint32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}}
}

func (r *rules) markUnset(mark uint32) tableRule {
	return tableRule{text: fmt.Sprintf("meta mark & 0x%08x == 0", mark), exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mark), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 4)},
	}}
}

// masquerade uses fully random source ports, so that concurrent
// connections never race for one.
func (r *rules) masquerade() tableRule {
	return tableRule{text: "masquerade fully-random", exprs: []expr.Any{&expr.Masq{FullyRandom: true}}}
}

// rejectTCP answers TCP with a reset: connect fails with ECONNREFUSED at
// once, in both families.
func (r *rules) rejectTCP() tableRule {
	return tableRule{text: "meta l4proto tcp reject with tcp reset", exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}}
}

// rejectICMP answers with ICMP (or ICMPv6) port unreachable.
func (r *rules) rejectICMP() tableRule {
	return tableRule{text: "reject", exprs: []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: r.f.rejectCode}}}
}

// tableRef is the helper table of family f.
func tableRef(f *family) *nftables.Table {
	return &nftables.Table{Name: TableName, Family: f.table}
}

// setRef returns the library's description of the set named name.
func setRef(f *family, name string) (*nftables.Set, error) {
	for _, s := range tableSets(f) {
		if s.name == name {
			return s.ref(tableRef(f)), nil
		}
	}
	return nil, fmt.Errorf("ipvs: no set %q in the helper table", name)
}

func (s tableSet) ref(t *nftables.Table) *nftables.Set {
	set := &nftables.Set{Table: t, Name: s.name, KeyType: s.keyType, Concatenation: s.concatenated(), Interval: s.ranges}
	if s.vmap {
		set.IsMap, set.DataType = true, nftables.TypeVerdict
	}
	return set
}

// queueTable queues the replacement of the family's helper table, with
// everything in it, by the one described: chains, rules, sets, and elems
// with the fixed elements. The kernel applies the batch whole or not at
// all, so packets see either table.
func queueTable(conn *nftables.Conn, f *family, chains []tableChain, elems []element) error {
	t := tableRef(f)
	// Adding first makes the deletion valid whether the table exists.
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	for _, s := range tableSets(f) {
		if err := conn.AddSet(s.ref(t), nil); err != nil {
			return fmt.Errorf("ipvs: add set %s: %w", s.name, err)
		}
	}
	for _, c := range chains {
		ch := &nftables.Chain{Name: c.name, Table: t}
		if c.hook != nil {
			num, prio := c.hook.num, c.hook.priority
			ch.Type, ch.Hooknum, ch.Priority = c.hook.typ, &num, &prio
		}
		conn.AddChain(ch)
	}
	for _, c := range chains {
		for _, r := range c.rules {
			conn.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: c.name, Table: t}, Exprs: r.exprs})
		}
	}
	return queueElements(conn, f, nil, append(fixedElements(), elems...))
}

// maxBatchBytes bounds the elements of one netlink message: its element
// list is one attribute, whose length must fit in 16 bits.
const maxBatchBytes = 48 << 10

// queueElements queues the deletion of del, then the addition of add,
// in as few messages as fit. It sorts both by set.
func queueElements(conn *nftables.Conn, f *family, del, add []element) error {
	for _, op := range []struct {
		elems []element
		queue func(*nftables.Set, []nftables.SetElement) error
	}{{del, conn.SetDeleteElements}, {add, conn.SetAddElements}} {
		slices.SortStableFunc(op.elems, func(a, b element) int { return cmp.Compare(a.set, b.set) })
		for rest := op.elems; len(rest) > 0; {
			name := rest[0].set
			n := 1
			for n < len(rest) && rest[n].set == name {
				n++
			}
			if err := queueSet(f, name, rest[:n], op.queue); err != nil {
				return err
			}
			rest = rest[n:]
		}
	}
	return nil
}

// queueSet queues elems, all of the set name, in messages that fit.
func queueSet(f *family, name string, elems []element, queue func(*nftables.Set, []nftables.SetElement) error) error {
	set, err := setRef(f, name)
	if err != nil {
		return err
	}
	chunk := make([]nftables.SetElement, 0, min(len(elems), 1024))
	size := 0
	for _, e := range elems {
		n := len(e.key) + len(e.keyEnd) + len(e.comment) + 64
		if size+n > maxBatchBytes {
			if err := queue(set, chunk); err != nil {
				return err
			}
			chunk, size = chunk[:0:0], 0
		}
		chunk = append(chunk, nftables.SetElement{Key: e.key, KeyEnd: e.keyEnd, VerdictData: e.verdict, Comment: e.comment})
		size += n
	}
	if len(chunk) > 0 {
		return queue(set, chunk)
	}
	return nil
}

// decodeKey reads a virtual service's key from the helper table.
func decodeKey(f *family, b []byte) (vsKey, bool) {
	n := int(f.addrLen)
	if len(b) < n+8 {
		return vsKey{}, false
	}
	addr, ok := netip.AddrFromSlice(b[:n])
	return vsKey{addr: addr, proto: b[n], port: binary.BigEndian.Uint16(b[n+4:])}, ok
}
