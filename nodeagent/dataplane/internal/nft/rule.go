package nft

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// Rule is one rule of a chain: the kernel expressions and the same rule
// in nft's syntax, built together by a Builder so that they cannot
// disagree. The text is what golden files and diffs compare.
type Rule struct {
	Text  string
	Exprs []expr.Any
	// Anon is the anonymous map the rule looks up, if any (see
	// DNATRandom): AddRuleOf creates it with the rule.
	Anon *AnonMap
}

// Builder appends matches and statements to a rule, each as nft text and
// as expressions. Register use: NFT_REG_1 for single values; a
// concatenated key starts at NFT_REG_1 and continues in the 32-bit
// registers from Family.AfterAddr on, as nft loads one.
type Builder struct {
	f     *Family
	words []string
	exprs []expr.Any
	anon  *AnonMap
}

// NewRule starts a rule of a chain of family f.
func NewRule(f *Family) *Builder { return &Builder{f: f} }

// Add appends a match or statement: its text and its expressions.
func (r *Builder) Add(text string, exprs ...expr.Any) *Builder {
	r.words = append(r.words, text)
	r.exprs = append(r.exprs, exprs...)
	return r
}

// Rule returns the rule built so far.
func (r *Builder) Rule() Rule {
	return Rule{Text: strings.Join(r.words, " "), Exprs: r.exprs, Anon: r.anon}
}

// Addr names one of a packet's addresses.
type Addr string

// The addresses of a packet.
const (
	Saddr Addr = "saddr"
	Daddr Addr = "daddr"
)

const reg1 = unix.NFT_REG_1

// load loads the packet's address which into register reg.
func (r *Builder) load(which Addr, reg uint32) expr.Any {
	off := r.f.DaddrOffset
	if which == Saddr {
		off = r.f.SaddrOffset
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: r.f.AddrLen}
}

// service loads "daddr . meta l4proto . th dport": the key of a service
// (address, protocol, port), in NFT_REG_1 and the two registers after it.
func (r *Builder) service() (string, []expr.Any) {
	return r.f.Name + " daddr . meta l4proto . th dport", []expr.Any{
		r.load(Daddr, reg1),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r.f.AfterAddr},
		&expr.Payload{DestRegister: r.f.AfterAddr + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

// lookup looks the key in NFT_REG_1 up in set (negated: not in it).
func lookup(set string, negate bool) (string, expr.Any) {
	op := "@"
	if negate {
		op = "!= @"
	}
	return op + set, &expr.Lookup{SourceRegister: reg1, SetName: set, Invert: negate}
}

// vmap looks the key in NFT_REG_1 up in verdict map m and takes the
// verdict found.
func vmap(m string) (string, expr.Any) {
	return "vmap @" + m, &expr.Lookup{SourceRegister: reg1, SetName: m, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT}
}

// CtStateNew matches the first packet of a connection.
func (r *Builder) CtStateNew() *Builder {
	return r.Add("ct state new",
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)})
}

// ipsDstNAT is IPS_DST_NAT (linux/netfilter/nf_conntrack_common.h): the
// connection's destination was translated.
const ipsDstNAT = 1 << 5

// CtStatusDNAT matches connections whose destination was translated.
func (r *Builder) CtStatusDNAT() *Builder {
	return r.Add("ct status dnat",
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)})
}

// AddrIs matches address which against one address (negated: !=).
func (r *Builder) AddrIs(which Addr, negate bool, addr netip.Addr) *Builder {
	return r.AddrIn(which, negate, netip.PrefixFrom(addr, addr.BitLen()))
}

// AddrIn matches address which against a prefix (negated: !=).
func (r *Builder) AddrIn(which Addr, negate bool, p netip.Prefix) *Builder {
	p = p.Masked()
	op, neg := expr.CmpOpEq, ""
	if negate {
		op, neg = expr.CmpOpNeq, "!= "
	}
	text := p.String()
	if p.IsSingleIP() {
		text = p.Addr().String()
	}
	exprs := []expr.Any{r.load(which, reg1)}
	if !p.IsSingleIP() {
		exprs = append(exprs, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: r.f.AddrLen,
			Mask: prefixMask(p), Xor: make([]byte, r.f.AddrLen)})
	}
	exprs = append(exprs, &expr.Cmp{Op: op, Register: reg1, Data: r.f.Bytes(p.Addr())})
	return r.Add(fmt.Sprintf("%s %s %s%s", r.f.Name, which, neg, text), exprs...)
}

// prefixMask returns the netmask of p in network byte order.
func prefixMask(p netip.Prefix) []byte {
	mask := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return mask
}

// AddrInSet matches address which against a named set (negated: !=).
func (r *Builder) AddrInSet(which Addr, negate bool, set string) *Builder {
	text, l := lookup(set, negate)
	return r.Add(fmt.Sprintf("%s %s %s", r.f.Name, which, text), r.load(which, reg1), l)
}

// AddrPairInSet matches packets whose "saddr . daddr" is in set.
func (r *Builder) AddrPairInSet(set string) *Builder {
	text, l := lookup(set, false)
	return r.Add(fmt.Sprintf("%s saddr . %s daddr %s", r.f.Name, r.f.Name, text),
		r.load(Saddr, reg1), r.load(Daddr, r.f.AfterAddr), l)
}

// ProtoInSet matches packets whose transport protocol is in set.
func (r *Builder) ProtoInSet(set string) *Builder {
	text, l := lookup(set, false)
	return r.Add("meta l4proto "+text, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, l)
}

// ServiceInSet matches packets whose "daddr . l4proto . dport" is in set
// (negated: is not).
func (r *Builder) ServiceInSet(set string, negate bool) *Builder {
	text, exprs := r.service()
	op, l := lookup(set, negate)
	return r.Add(text+" "+op, append(exprs, l)...)
}

// ServiceSaddrInSet matches packets whose "daddr . l4proto . dport .
// saddr" is in set (negated: is not).
func (r *Builder) ServiceSaddrInSet(set string, negate bool) *Builder {
	text, exprs := r.service()
	op, l := lookup(set, negate)
	return r.Add(fmt.Sprintf("%s . %s saddr %s", text, r.f.Name, op), append(exprs, r.load(Saddr, r.f.AfterAddr+2), l)...)
}

// FibLocal matches packets whose address which is an address of this
// host.
func (r *Builder) FibLocal(which Addr) *Builder {
	return r.Add(fmt.Sprintf("fib %s type local", which),
		&expr.Fib{Register: reg1, ResultADDRTYPE: true, FlagSADDR: which == Saddr, FlagDADDR: which == Daddr},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
}

// VmapService dispatches on "daddr . l4proto . dport" with verdict map
// m.
func (r *Builder) VmapService(m string) *Builder {
	text, exprs := r.service()
	vtext, l := vmap(m)
	return r.Add(text+" "+vtext, append(exprs, l)...)
}

// VmapProtoPort dispatches on "l4proto . dport" with verdict map m.
func (r *Builder) VmapProtoPort(m string) *Builder {
	vtext, l := vmap(m)
	return r.Add("meta l4proto . th dport "+vtext,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Payload{DestRegister: unix.NFT_REG32_01, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		l)
}

// NumgenVmap picks one of n verdicts of map m at random.
func (r *Builder) NumgenVmap(n int, m string) *Builder {
	vtext, l := vmap(m)
	return r.Add(fmt.Sprintf("numgen random mod %d %s", n, vtext),
		&expr.Numgen{Register: reg1, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM}, l)
}

// DNAT rewrites the destination to addr:port for protocol proto.
func (r *Builder) DNAT(proto corev1.Protocol, addr netip.Addr, port int32) *Builder {
	return r.Add(fmt.Sprintf("meta l4proto %s dnat to %s", ProtoName(ProtoNumber(proto)), netip.AddrPortFrom(addr, uint16(port))),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{ProtoNumber(proto)}},
		&expr.Immediate{Register: reg1, Data: r.f.Bytes(addr)},
		&expr.Immediate{Register: unix.NFT_REG_2, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: r.f.NATFamily, RegAddrMin: reg1, RegProtoMin: unix.NFT_REG_2, Specified: true})
}

// UpdateSaddr adds the source address to a timeout set, or refreshes its
// timeout if it is there.
func (r *Builder) UpdateSaddr(set string) *Builder {
	return r.Add(fmt.Sprintf("update @%s { %s saddr }", set, r.f.Name),
		r.load(Saddr, reg1),
		&expr.Dynset{SrcRegKey: reg1, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE})
}

// MarkSet ORs bit into the packet mark.
func (r *Builder) MarkSet(bit uint32) *Builder {
	return r.setMark(fmt.Sprintf("meta mark set meta mark | 0x%08x", bit), ^bit, bit)
}

// MarkClear clears bit, known to be set, from the packet mark.
func (r *Builder) MarkClear(bit uint32) *Builder {
	return r.setMark(fmt.Sprintf("meta mark set meta mark ^ 0x%08x", bit), ^uint32(0), bit)
}

// setMark sets the mark to (mark & and) ^ xor.
func (r *Builder) setMark(text string, and, xor uint32) *Builder {
	return r.Add(text,
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(and), Xor: binaryutil.NativeEndian.PutUint32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1})
}

// MarkUnset matches packets whose mark lacks bit.
func (r *Builder) MarkUnset(bit uint32) *Builder {
	return r.Add(fmt.Sprintf("meta mark & 0x%08x == 0", bit),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bit), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 4)})
}

// Masquerade source-NATs to the outgoing interface's address, with fully
// random source ports so that concurrent connections never race for one.
func (r *Builder) Masquerade() *Builder {
	return r.Add("masquerade fully-random", &expr.Masq{FullyRandom: true})
}

// Reject answers with ICMP (or ICMPv6) port unreachable: a UDP client
// sees ECONNREFUSED on its next read.
func (r *Builder) Reject() *Builder {
	return r.Add("reject", &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: r.f.RejectCode})
}

// RejectTCP answers a TCP packet with a reset: the client's connect fails
// with ECONNREFUSED at once.
func (r *Builder) RejectTCP() *Builder {
	return r.Add("meta l4proto tcp reject with tcp reset",
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
}

// Verdict ends the rule with v.
func (r *Builder) Verdict(v *Verdict) *Builder { return r.Add(v.String(), v.Expr()) }

// Jump ends the rule with a jump to chain.
func (r *Builder) Jump(chain string) *Builder { return r.Verdict(JumpTo(chain)) }

// Goto ends the rule with a goto to chain.
func (r *Builder) Goto(chain string) *Builder { return r.Verdict(GotoChain(chain)) }

// Drop ends the rule dropping the packet.
func (r *Builder) Drop() *Builder { return r.Verdict(Drop) }

// Return ends the rule returning from the chain.
func (r *Builder) Return() *Builder { return r.Verdict(Return) }

// Verdict is a verdict: of a rule, or the value of a verdict map's
// element.
type Verdict struct {
	Kind  expr.VerdictKind
	Chain string
}

// The verdicts without a chain.
var (
	Drop   = &Verdict{Kind: expr.VerdictDrop}
	Return = &Verdict{Kind: expr.VerdictReturn}
)

// GotoChain is "goto chain".
func GotoChain(chain string) *Verdict { return &Verdict{Kind: expr.VerdictGoto, Chain: chain} }

// JumpTo is "jump chain".
func JumpTo(chain string) *Verdict { return &Verdict{Kind: expr.VerdictJump, Chain: chain} }

// String renders the verdict as nft writes it.
func (v *Verdict) String() string {
	switch v.Kind {
	case expr.VerdictGoto:
		return "goto " + v.Chain
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictAccept:
		return "accept"
	}
	return fmt.Sprintf("verdict %d %s", v.Kind, v.Chain)
}

// Expr is the verdict as an expression.
func (v *Verdict) Expr() *expr.Verdict { return &expr.Verdict{Kind: v.Kind, Chain: v.Chain} }

// ProtoNumber is a Service protocol's IP protocol number.
func ProtoNumber(p corev1.Protocol) byte {
	switch p {
	case corev1.ProtocolUDP:
		return unix.IPPROTO_UDP
	case corev1.ProtocolSCTP:
		return unix.IPPROTO_SCTP
	default:
		return unix.IPPROTO_TCP
	}
}

// ProtoName is an IP protocol's name as nft writes it.
func ProtoName(p byte) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}
