package nft

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// A rule that chooses among endpoints at random holds its endpoints in an
// anonymous map, as nft writes "numgen random mod 3 map { 0 : a, 1 : b,
// 2 : c }": the map is created, filled and bound to the rule in the
// rule's transaction, lives as long as the rule, and is listed inside
// it. Such a map cannot change once bound: a new set of endpoints is a
// new rule with a new map.

// anonMapName is the name an anonymous map is sent with; the kernel
// numbers it (__map0, __map1, ...), and the rule and the elements find
// it by its set id in the transaction.
const anonMapName = "__map%d"

// AnonMap is the anonymous map of a rule: the values of keys 0, 1, ...,
// n-1, each DataType.Bytes long, one after the other in Values.
type AnonMap struct {
	DataType nftables.SetDatatype
	Values   []byte
}

// Len is the number of keys of m.
func (m *AnonMap) Len() int { return len(m.Values) / int(m.DataType.Bytes) }

// DNATRandom DNATs protocol proto's packets to one of eps, each as likely
// as the others (at least one, at most numgen's 2^32 of them). When every endpoint has
// the same port the map holds addresses only and the port is the rule's:
// nft's "dnat to numgen random mod N map { 0 : addr, ... }:port"; else
// it holds address . port: "dnat ip to numgen random mod N map { 0 :
// addr . port, ... }".
func (r *Builder) DNATRandom(proto corev1.Protocol, eps []netip.AddrPort) *Builder {
	port := eps[0].Port()
	samePort := true
	for _, ep := range eps[1:] {
		samePort = samePort && ep.Port() == port
	}
	m := &AnonMap{DataType: r.f.AddrType}
	if !samePort {
		m.DataType = nftables.MustConcatSetType(r.f.AddrType, nftables.TypeInetService)
	}
	m.Values = make([]byte, 0, len(eps)*int(m.DataType.Bytes))
	// The text is most of what a sync keeps of the rule: built in one
	// buffer, copied once.
	text := make([]byte, 0, 64+24*len(eps))
	text = append(text, "meta l4proto "+ProtoName(ProtoNumber(proto))...)
	if samePort {
		text = append(text, " dnat to"...)
	} else {
		text = append(text, " dnat "+r.f.Name+" to"...)
	}
	text = strconv.AppendInt(append(text, " numgen random mod "...), int64(len(eps)), 10)
	text = append(text, " map { "...)
	for i, ep := range eps {
		if i > 0 {
			text = append(text, ", "...)
		}
		text = ep.Addr().AppendTo(append(strconv.AppendInt(text, int64(i), 10), " : "...))
		m.Values = r.f.AppendBytes(m.Values, ep.Addr())
		if !samePort {
			text = strconv.AppendUint(append(text, " . "...), uint64(ep.Port()), 10)
			// The port, padded to a register's four bytes.
			m.Values = append(binary.BigEndian.AppendUint16(m.Values, ep.Port()), 0, 0)
		}
	}
	text = append(text, " }"...)
	exprs := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{ProtoNumber(proto)}},
		&expr.Numgen{Register: reg1, Modulus: uint32(len(eps)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg1, SetName: anonMapName, IsDestRegSet: true, DestRegister: reg1},
	}
	protoReg := r.f.AfterAddr // the port follows the address in the value
	if samePort {
		text = strconv.AppendUint(append(text, ':'), uint64(port), 10)
		protoReg = unix.NFT_REG_2
		exprs = append(exprs, &expr.Immediate{Register: protoReg, Data: binary.BigEndian.AppendUint16(nil, port)})
	}
	exprs = append(exprs, &expr.NAT{Type: expr.NATTypeDestNAT, Family: r.f.NATFamily, RegAddrMin: reg1, RegProtoMin: protoReg, Specified: true})
	r.anon = m
	return r.Add(string(text), exprs...)
}

// AddRuleOf queues rule r at the end of chain in table on t, after its
// anonymous map (Rule.Anon), if it has one, which gets set id id (unique
// in t). It sets the id in r's lookup of the map.
func AddRuleOf(t *Txn, table *nftables.Table, chain string, r Rule, id uint32) error {
	if r.Anon == nil {
		return AddRule(t, table, chain, r.Exprs)
	}
	for _, e := range r.Exprs {
		if l, ok := e.(*expr.Lookup); ok && l.SetName == anonMapName {
			l.SetID = id
		}
	}
	if err := addAnonMap(t, table, r.Anon, id); err != nil {
		return err
	}
	return AddRule(t, table, chain, r.Exprs)
}

// nft's numbers for a set's key type (its TYPE_INTEGER) and for the
// byte order records of a set's user data (its enum byteorder).
const (
	nftTypeInteger      = 4
	nftByteOrderInvalid = 0
	nftByteOrderBig     = 2
)

// addAnonMap queues the creation of m (set id id) in table, and its
// elements, as nft sends them: the map's declared size is its number of
// keys (which the kernel sizes it by, and a read-back counts endpoints
// by), and its user data tells nft the keys are host-order integers (a
// numgen's) and how its values are ordered.
func addAnonMap(t *Txn, table *nftables.Table, m *AnonMap, id uint32) error {
	if err := t.Encode(); err != nil {
		return err
	}
	n := m.Len()
	dataOrder := uint32(nftByteOrderBig)
	if strings.Contains(m.DataType.Name, " . ") {
		dataOrder = nftByteOrderInvalid // a concatenation, as nft says of one
	}
	ud := udataU32(nil, udataSetKeyByteOrder, nftByteOrderHost)
	ud = udataU32(ud, udataSetDataByteOrder, dataOrder)
	ud = udataU32(ud, udataSetDataInterval, 0)
	w := t.writer(256)
	msg := w.beginMessage(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSET, netlink.Create, byte(table.Family))
	w.putString(unix.NFTA_SET_TABLE, table.Name)
	w.putString(unix.NFTA_SET_NAME, anonMapName)
	w.putUint32(unix.NFTA_SET_FLAGS, unix.NFT_SET_ANONYMOUS|unix.NFT_SET_CONSTANT|unix.NFT_SET_MAP)
	w.putUint32(unix.NFTA_SET_KEY_TYPE, nftTypeInteger)
	w.putUint32(unix.NFTA_SET_KEY_LEN, 4)
	w.putUint32(unix.NFTA_SET_DATA_TYPE, m.DataType.GetNFTMagic())
	w.putUint32(unix.NFTA_SET_DATA_LEN, m.DataType.Bytes)
	w.putUint32(unix.NFTA_SET_ID, id)
	desc := w.beginNested(unix.NFTA_SET_DESC)
	w.putUint32(unix.NFTA_SET_DESC_SIZE, uint32(n))
	w.endNested(desc)
	w.put(unix.NFTA_SET_USERDATA, ud)
	w.endMessage(msg)
	t.wrote()
	set := &nftables.Set{Table: table, Name: anonMapName, ID: id, Anonymous: true, Constant: true, IsMap: true,
		KeyType: nftables.TypeInteger, DataType: m.DataType}
	elems := make([]Element, n)
	keys := make([]byte, 4*n)
	size := int(m.DataType.Bytes)
	for i := range elems {
		key := keys[4*i : 4*i+4 : 4*i+4]
		binary.NativeEndian.PutUint32(key, uint32(i))
		elems[i] = Element{Key: key, Data: m.Values[i*size : (i+1)*size]}
	}
	return AddElements(t, set, func(e *Element) Element { return *e }, elems)
}
