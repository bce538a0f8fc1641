package nftables

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// rule is one rule of a chain: the kernel expressions and the same rule
// in nft's syntax, built together by ruleBuilder so that they cannot
// disagree. The text is what golden files and diffs compare.
type rule struct {
	text  string
	exprs []expr.Any
}

// ruleBuilder appends matches and statements to a rule, each as nft text
// and as expressions. Register use: NFT_REG_1 for single values; a
// concatenated key starts at NFT_REG_1 and continues in the 32-bit
// registers the family names.
type ruleBuilder struct {
	f     *family
	words []string
	exprs []expr.Any
}

func newRule(f *family) *ruleBuilder { return &ruleBuilder{f: f} }

func (r *ruleBuilder) add(text string, exprs ...expr.Any) *ruleBuilder {
	r.words = append(r.words, text)
	r.exprs = append(r.exprs, exprs...)
	return r
}

func (r *ruleBuilder) build() rule {
	return rule{text: strings.Join(r.words, " "), exprs: r.exprs}
}

const reg1 = unix.NFT_REG_1

// ctStateNew matches the first packet of a connection.
func (r *ruleBuilder) ctStateNew() *ruleBuilder {
	return r.add("ct state new",
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)})
}

func (r *ruleBuilder) loadAddr(which string, reg uint32) expr.Any {
	off := r.f.daddrOffset
	if which == "saddr" {
		off = r.f.saddrOffset
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: r.f.addrLen}
}

// addrIs matches "saddr" or "daddr" against one address (negated: !=).
func (r *ruleBuilder) addrIs(which string, negate bool, addr netip.Addr) *ruleBuilder {
	return r.addrIn(which, negate, netip.PrefixFrom(addr, addr.BitLen()))
}

// addrIn matches "saddr" or "daddr" against a prefix (negated: !=).
func (r *ruleBuilder) addrIn(which string, negate bool, p netip.Prefix) *ruleBuilder {
	p = p.Masked()
	op, neg := expr.CmpOpEq, ""
	if negate {
		op, neg = expr.CmpOpNeq, "!= "
	}
	text := p.String()
	if p.IsSingleIP() {
		text = p.Addr().String()
	}
	exprs := []expr.Any{r.loadAddr(which, reg1)}
	if !p.IsSingleIP() {
		exprs = append(exprs, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: r.f.addrLen,
			Mask: prefixMask(p), Xor: make([]byte, r.f.addrLen)})
	}
	exprs = append(exprs, &expr.Cmp{Op: op, Register: reg1, Data: r.f.bytes(p.Addr())})
	return r.add(fmt.Sprintf("%s %s %s%s", r.f.name, which, neg, text), exprs...)
}

// prefixMask returns the netmask of p in network byte order.
func prefixMask(p netip.Prefix) []byte {
	mask := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return mask
}

// addrInSet matches "saddr" or "daddr" against a named set (negated: !=).
func (r *ruleBuilder) addrInSet(which string, negate bool, set string) *ruleBuilder {
	neg := ""
	if negate {
		neg = "!= "
	}
	return r.add(fmt.Sprintf("%s %s %s@%s", r.f.name, which, neg, set),
		r.loadAddr(which, reg1),
		&expr.Lookup{SourceRegister: reg1, SetName: set, Invert: negate})
}

// fibLocal matches packets whose "saddr" or "daddr" is an address of
// this host.
func (r *ruleBuilder) fibLocal(which string) *ruleBuilder {
	return r.add(fmt.Sprintf("fib %s type local", which),
		&expr.Fib{Register: reg1, ResultADDRTYPE: true, FlagSADDR: which == "saddr", FlagDADDR: which == "daddr"},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
}

// vmapAddrProtoPort dispatches on destination address . protocol . port.
func (r *ruleBuilder) vmapAddrProtoPort(m string) *ruleBuilder {
	return r.add(fmt.Sprintf("%s daddr . meta l4proto . th dport vmap @%s", r.f.name, m),
		r.loadAddr("daddr", reg1),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r.f.concatProto},
		&expr.Payload{DestRegister: r.f.concatPort, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg1, SetName: m, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT})
}

// vmapProtoPort dispatches on protocol . destination port.
func (r *ruleBuilder) vmapProtoPort(m string) *ruleBuilder {
	return r.add(fmt.Sprintf("meta l4proto . th dport vmap @%s", m),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Payload{DestRegister: unix.NFT_REG32_01, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg1, SetName: m, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT})
}

// numgenVmap picks one of n verdicts of map m at random.
func (r *ruleBuilder) numgenVmap(n int, m string) *ruleBuilder {
	return r.add(fmt.Sprintf("numgen random mod %d vmap @%s", n, m),
		&expr.Numgen{Register: reg1, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg1, SetName: m, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT})
}

// numgenRange is the modulus of dnatNumgenMap's random number: fixed, so
// that the rule never changes when endpoints come and go; the map splits
// [0, numgenRange) among the endpoints.
const numgenRange = 65536

// dnatNumgenMap DNATs protocol proto's packets to the address and port
// that data map m holds for the key "choice . n", n a random number in
// [0, numgenRange). The map's keys are intervals, which the kernel
// compares as big-endian bytes, so n (host byte order) is converted
// first, as nft itself does for "typeof numgen ..."; choice is written
// big-endian to begin with.
func (r *ruleBuilder) dnatNumgenMap(proto corev1.Protocol, choice uint32, m string) *ruleBuilder {
	return r.add(fmt.Sprintf("meta l4proto %s dnat %s to %d . numgen random mod %d map @%s", protoName(proto), r.f.name, choice, numgenRange, m),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{protoNumber(proto)}},
		&expr.Immediate{Register: reg1, Data: binaryutil.BigEndian.PutUint32(choice)},
		&expr.Numgen{Register: unix.NFT_REG32_01, Modulus: numgenRange, Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: unix.NFT_REG32_01, DestRegister: unix.NFT_REG32_01, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Lookup{SourceRegister: reg1, SetName: m, IsDestRegSet: true, DestRegister: reg1},
		// The map's value is address . port: the port sits in the
		// register after the address, as in a concatenated key.
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: r.f.natFamily, RegAddrMin: reg1, RegProtoMin: r.f.concatProto, Specified: true})
}

// ctDNATAddrPairInSet matches connections that were DNATed and whose
// source . destination address pair is in set.
func (r *ruleBuilder) ctDNATAddrPairInSet(set string) *ruleBuilder {
	return r.add(fmt.Sprintf("ct status dnat %s saddr . %s daddr @%s", r.f.name, r.f.name, set),
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
		r.loadAddr("saddr", reg1),
		r.loadAddr("daddr", r.f.concatProto),
		&expr.Lookup{SourceRegister: reg1, SetName: set})
}

// ipsDstNAT is IPS_DST_NAT (linux/netfilter/nf_conntrack_common.h): the
// connection's destination was translated.
const ipsDstNAT = 1 << 5

// updateSaddr adds the source address to a timeout set, or refreshes its
// timeout if it is there.
func (r *ruleBuilder) updateSaddr(set string) *ruleBuilder {
	return r.add(fmt.Sprintf("update @%s { %s saddr }", set, r.f.name),
		r.loadAddr("saddr", reg1),
		&expr.Dynset{SrcRegKey: reg1, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE})
}

// dnat rewrites the destination to addr:port for protocol proto.
func (r *ruleBuilder) dnat(proto corev1.Protocol, addr netip.Addr, port int32) *ruleBuilder {
	return r.add(fmt.Sprintf("meta l4proto %s dnat to %s", protoName(proto), netip.AddrPortFrom(addr, uint16(port))),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{protoNumber(proto)}},
		&expr.Immediate{Register: reg1, Data: r.f.bytes(addr)},
		&expr.Immediate{Register: unix.NFT_REG_2, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: r.f.natFamily, RegAddrMin: reg1, RegProtoMin: unix.NFT_REG_2, Specified: true})
}

// markSet ORs bit into the packet mark.
func (r *ruleBuilder) markSet(bit uint32) *ruleBuilder {
	return r.add(fmt.Sprintf("meta mark set meta mark | 0x%08x", bit),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^bit), Xor: binaryutil.NativeEndian.PutUint32(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1})
}

// markClear clears bit, known to be set, from the packet mark.
func (r *ruleBuilder) markClear(bit uint32) *ruleBuilder {
	return r.add(fmt.Sprintf("meta mark set meta mark ^ 0x%08x", bit),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^uint32(0)), Xor: binaryutil.NativeEndian.PutUint32(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1})
}

// markUnset matches packets whose mark lacks bit.
func (r *ruleBuilder) markUnset(bit uint32) *ruleBuilder {
	return r.add(fmt.Sprintf("meta mark & 0x%08x == 0", bit),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bit), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 4)})
}

// masquerade source-NATs to the outgoing interface's address, with fully
// random source ports so that concurrent connections never race for one.
func (r *ruleBuilder) masquerade() *ruleBuilder {
	return r.add("masquerade fully-random", &expr.Masq{FullyRandom: true})
}

// reject answers with ICMP (or ICMPv6) port unreachable: a UDP client
// sees ECONNREFUSED on its next read.
func (r *ruleBuilder) reject() *ruleBuilder {
	return r.add("reject", &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: r.f.rejectCode})
}

// rejectTCP answers a TCP packet with a reset: the client's connect fails
// with ECONNREFUSED at once.
func (r *ruleBuilder) rejectTCP() *ruleBuilder {
	return r.add("meta l4proto tcp reject with tcp reset",
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
}

func (r *ruleBuilder) jump(chain string) *ruleBuilder {
	return r.add("jump "+chain, &expr.Verdict{Kind: expr.VerdictJump, Chain: chain})
}

func (r *ruleBuilder) goTo(chain string) *ruleBuilder {
	return r.add("goto "+chain, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain})
}

func (r *ruleBuilder) drop() *ruleBuilder {
	return r.add("drop", &expr.Verdict{Kind: expr.VerdictDrop})
}

func (r *ruleBuilder) ret() *ruleBuilder {
	return r.add("return", &expr.Verdict{Kind: expr.VerdictReturn})
}

func protoName(p corev1.Protocol) string { return strings.ToLower(string(p)) }

func protoNumber(p corev1.Protocol) byte {
	switch p {
	case corev1.ProtocolUDP:
		return unix.IPPROTO_UDP
	case corev1.ProtocolSCTP:
		return unix.IPPROTO_SCTP
	default:
		return unix.IPPROTO_TCP
	}
}
