package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// A set whose keys are numgen results (the verdict map of ClientIP
// affinity's endpoint chains) has keys of no type nft can name: plain
// integers. nft itself describes such a set by the expressions its keys
// and values come from ("typeof numgen random mod 65536 : verdict"), in
// records of the set's user data that only nft reads; without them `nft
// list` shows the key as "type 0", which `nft -f` cannot read back, so a
// saved ruleset holding the table would not load. google/nftables v0.3.0
// writes none of these records, so Txn.AddSet replaces the user data of
// such a set's new-set message on its way out with the records nft
// writes for the same declaration (read with `nft --debug=mnl`, nftables
// 1.0.6). The kernel keeps user data without reading it.

// Records of a set's user data (libnftnl's NFTNL_UDATA_SET_*), and of a
// typeof description in it (NFTNL_UDATA_SET_TYPEOF_*).
const (
	udataSetKeyByteOrder  = 0
	udataSetDataByteOrder = 1
	udataSetKeyTypeof     = 3
	udataSetDataTypeof    = 4
	udataSetDataInterval  = 6
	udataTypeofExpr       = 0
	udataTypeofData       = 1
)

// nft's numbers for what a typeof description holds (its enum
// expr_types, enum byteorder, enum proto_desc_id and the indexes of the
// payload templates' fields), as nftables 1.0.6 writes them.
const (
	nftExprVerdict   = 1
	nftExprNumgen    = 23
	nftByteOrderHost = 1
)

// typeofExpr is an expression of a typeof description: its text in nft's
// syntax, and its records.
type typeofExpr struct {
	text string
	// records are the expression's type and its own data (a nested
	// record each).
	records []byte
}

// newTypeofExpr describes an expression of nft's type expr whose own
// records are data.
func newTypeofExpr(text string, expr uint32, data []byte) typeofExpr {
	return typeofExpr{text: text, records: udataNest(udataU32(nil, udataTypeofExpr, expr), udataTypeofData, data)}
}

// numgenTypeof is "numgen random mod modulus".
func numgenTypeof(modulus uint32) typeofExpr {
	// The numgen's own records: its type, modulus and offset.
	data := udataU32(udataU32(udataU32(nil, 0, unix.NFT_NG_RANDOM), 1, modulus), 2, 0)
	return newTypeofExpr(fmt.Sprintf("numgen random mod %d", modulus), nftExprNumgen, data)
}

// verdictTypeof is the values of a verdict map.
var verdictTypeof = newTypeofExpr("verdict", nftExprVerdict, nil)

// typeof returns how nft describes s, a set of numgen keys: the key's
// expression and the values'. Only the values proxyshift's numgen maps
// hold are known: verdicts.
func (s *Set) typeof() (key, values typeofExpr, err error) {
	if !s.VerdictMap {
		return key, values, fmt.Errorf("nft: set %s: no typeof description of values of type %s", s.Name, s.DataType.Name)
	}
	return numgenTypeof(s.NumgenKey), verdictTypeof, nil
}

// Typeof is the line `nft list` shows for the key and value types of a
// set of numgen keys, "numgen random mod 65536 : ip daddr . th dport"
// (after the word typeof); "" for any other set.
func (s *Set) Typeof() string {
	if s.NumgenKey == 0 {
		return ""
	}
	key, values, err := s.typeof()
	if err != nil {
		return ""
	}
	return key.text + " : " + values.text
}

// Userdata is the user data nft writes for s, a set of numgen keys, and
// Txn.AddSet gives it.
func (s *Set) Userdata() ([]byte, error) {
	key, values, err := s.typeof()
	if err != nil {
		return nil, err
	}
	b := udataU32(nil, udataSetKeyByteOrder, nftByteOrderHost)
	b = udataU32(b, udataSetDataByteOrder, 0)
	b = udataNest(b, udataSetKeyTypeof, key.records)
	b = udataNest(b, udataSetDataTypeof, values.records)
	return udataU32(b, udataSetDataInterval, 0), nil
}

// udataU32 appends record typ holding v (host byte order, as libnftnl
// writes numbers in user data).
func udataU32(b []byte, typ byte, v uint32) []byte {
	return binary.NativeEndian.AppendUint32(append(b, typ, 4), v)
}

// udataNest appends record typ holding records.
func udataNest(b []byte, typ byte, records []byte) []byte {
	return append(append(b, typ, byte(len(records))), records...)
}

// setRef names a set of a table.
type setRef struct {
	family nftables.TableFamily
	table  string
	set    string
}

// AddSet queues the creation of set s (ID id, unique in the transaction)
// in table: conn.AddSet, with the user data nft writes when s has numgen
// keys.
func (t *Txn) AddSet(table *nftables.Table, s *Set, id uint32) error {
	k := s.Kernel(table)
	k.ID = id
	if s.NumgenKey > 0 {
		ud, err := s.Userdata()
		if err != nil {
			return err
		}
		if t.setUserdata == nil {
			t.setUserdata = map[setRef][]byte{}
		}
		t.setUserdata[setRef{table.Family, table.Name, s.Name}] = ud
	}
	return t.conn.AddSet(k, nil)
}

// newSet is the header type of a new-set message.
const newSet = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSET)

// describeSets gives the new-set messages of batch for the sets of
// userdata their user data.
func describeSets(batch []netlink.Message, userdata map[setRef][]byte) {
	if len(userdata) == 0 {
		return
	}
	for i := range batch {
		m := &batch[i]
		if m.Header.Type != newSet || len(m.Data) < 4 {
			continue
		}
		ref := setRef{family: nftables.TableFamily(m.Data[0])}
		a := newAttrs(m.Data[4:])
		for a.next() {
			switch a.typ {
			case unix.NFTA_SET_TABLE:
				ref.table = a.str()
			case unix.NFTA_SET_NAME:
				ref.set = a.str()
			}
		}
		ud, ok := userdata[ref]
		if !ok {
			continue
		}
		m.Data = withSetUserdata(m.Data, ud)
	}
}

// withSetUserdata is the body of a new-set message (nfgenmsg, then
// attributes) with its user data attribute replaced by ud.
func withSetUserdata(body, ud []byte) []byte {
	out := append(make([]byte, 0, len(body)+unix.NLA_HDRLEN+len(ud)+3), body[:4]...)
	for rest := body[4:]; len(rest) >= unix.NLA_HDRLEN; {
		n := min(nlmsgAlign(int(binary.NativeEndian.Uint16(rest))), len(rest))
		if n < unix.NLA_HDRLEN {
			break
		}
		if binary.NativeEndian.Uint16(rest[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) != unix.NFTA_SET_USERDATA {
			out = append(out, rest[:n]...)
		}
		rest = rest[n:]
	}
	return appendAttr(out, unix.NFTA_SET_USERDATA, ud)
}

// SetUserdata returns the user data of every named set of table (family
// fam) in network namespace netns, by set name; sets without any are
// absent. google/nftables does not read it.
func SetUserdata(netns nsexec.NS, fam nftables.TableFamily, table string) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := dump(netns, fam, unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE, table, func(a *attrs) {
		var name string
		var ud []byte
		for a.next() {
			switch a.typ {
			case unix.NFTA_SET_NAME:
				name = a.str()
			case unix.NFTA_SET_USERDATA:
				ud = bytes.Clone(a.val)
			}
		}
		if ud != nil {
			out[name] = ud
		}
	})
	if err != nil {
		return nil, fmt.Errorf("nft: list the sets of %s: %w", table, err)
	}
	return out, nil
}

// HasUserdata says whether ud, a set's user data in the kernel, is what
// Txn.AddSet gives s: for a set of numgen keys, nft's description of it;
// for any other set, whatever google/nftables wrote. A map of numgen keys
// created before proxyshift wrote the description (nft lists it as "type
// 0") is not, and is best created anew.
func (s *Set) HasUserdata(ud []byte) bool {
	if s.NumgenKey == 0 {
		return true
	}
	want, err := s.Userdata()
	return err == nil && bytes.Equal(ud, want)
}
