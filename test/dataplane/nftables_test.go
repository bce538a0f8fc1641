package dataplane_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/nftables"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The nftables backend's row helpers. They talk netlink to the node
// namespace directly (the lab has no nft binary to lean on) and read or
// damage only the table the backend owns.

// nftConn opens an nftables netlink connection inside node.
func nftConn(node *netlab.NetNS) (*gnft.Conn, error) {
	return gnft.New(gnft.WithNetNSFd(node.FD()))
}

// newNFTables creates the nftables backend programming node.
func newNFTables(t *testing.T, node *netlab.NetNS, cfg dataplane.NodeConfig) dataplane.Backend {
	t.Helper()
	b, err := nftables.New(cfg, nftables.WithNetNS(node.NS()))
	if err != nil {
		t.Fatalf("nftables.New: %v", err)
	}
	return b
}

// skipWithoutNFTables skips unless the kernel answers nftables netlink
// requests in node.
func skipWithoutNFTables(t *testing.T, node *netlab.NetNS) {
	t.Helper()
	c, err := nftConn(node)
	if err == nil {
		_, err = c.ListTablesOfFamily(gnft.TableFamilyIPv4)
	}
	if err != nil {
		t.Skipf("needs nf_tables in the kernel (listing nftables tables failed: %v)", err)
	}
}

// nftFamily is the nftables table family of fam, and its name in nft.
func nftFamily(fam ipFamily) (gnft.TableFamily, string) {
	if fam.model == ipv6.model {
		return gnft.TableFamilyIPv6, "ip6"
	}
	return gnft.TableFamilyIPv4, "ip"
}

// nftDeleteTable deletes the backend's table of family fam (ip or ip6)
// behind its back.
func nftDeleteTable(t *testing.T, node *netlab.NetNS, fam ipFamily) {
	t.Helper()
	c, err := nftConn(node)
	if err != nil {
		t.Fatal(err)
	}
	family, name := nftFamily(fam)
	c.DelTable(&gnft.Table{Name: nftables.TableName, Family: family})
	if err := c.Flush(); err != nil {
		t.Fatalf("delete table %s %s: %v", name, nftables.TableName, err)
	}
}

// nftDump renders the ip and ip6 tables in node as the kernel reports
// them: chains with their rules' expressions, and sets and maps with
// their elements.
func nftDump(node *netlab.NetNS) string {
	return nftDumpFamily(node, ipv4) + nftDumpFamily(node, ipv6)
}

// nftDumpFamily renders the tables of fam's nftables family in node.
func nftDumpFamily(node *netlab.NetNS, fam ipFamily) string {
	c, err := nftConn(node)
	if err != nil {
		return err.Error()
	}
	family, familyName := nftFamily(fam)
	tables, err := c.ListTablesOfFamily(family)
	if err != nil {
		return "list tables: " + err.Error()
	}
	chains, err := c.ListChainsOfTableFamily(family)
	if err != nil {
		return "list chains: " + err.Error()
	}
	var b strings.Builder
	for _, table := range tables {
		fmt.Fprintf(&b, "table %s %s\n", familyName, table.Name)
		for _, ch := range chains {
			if ch.Table.Name != table.Name {
				continue
			}
			fmt.Fprintf(&b, "  chain %s", ch.Name)
			if ch.Hooknum != nil {
				fmt.Fprintf(&b, " (type %s hook %d priority %d)", ch.Type, *ch.Hooknum, *ch.Priority)
			}
			b.WriteString("\n")
			rules, err := c.GetRules(table, ch)
			if err != nil {
				fmt.Fprintf(&b, "    rules: %v\n", err)
			}
			for _, r := range rules {
				parts := make([]string, 0, len(r.Exprs))
				for _, e := range r.Exprs {
					parts = append(parts, nftExpr(e))
				}
				fmt.Fprintf(&b, "    [%d] %s\n", r.Handle, strings.Join(parts, " "))
			}
		}
		sets, err := c.GetSets(table)
		if err != nil {
			fmt.Fprintf(&b, "  sets: %v\n", err)
		}
		for _, s := range sets {
			kind := "set"
			if s.IsMap {
				kind = "map"
			}
			fmt.Fprintf(&b, "  %s %s\n", kind, s.Name)
			elems, err := c.GetSetElements(s)
			if err != nil {
				fmt.Fprintf(&b, "    elements: %v\n", err)
			}
			for _, e := range elems {
				fmt.Fprintf(&b, "    %s", nftKey(e.Key))
				if e.IntervalEnd {
					b.WriteString(" (interval end)")
				}
				switch {
				case e.VerdictData != nil:
					fmt.Fprintf(&b, " : %s", nftExpr(e.VerdictData))
				case len(e.Val) > 0:
					fmt.Fprintf(&b, " : %s", nftData(e.Val))
				}
				b.WriteString("\n")
			}
		}
	}
	return b.String()
}

// nftExpr renders one expression: a verdict as nft writes it, anything
// else as its type and fields.
func nftExpr(e expr.Any) string {
	if v, ok := e.(*expr.Verdict); ok {
		return nftVerdict(v.Kind, v.Chain)
	}
	return strings.TrimPrefix(fmt.Sprintf("%T%+v", e, e), "*expr.")
}

func nftVerdict(kind expr.VerdictKind, chain string) string {
	names := map[expr.VerdictKind]string{
		expr.VerdictReturn: "return", expr.VerdictGoto: "goto", expr.VerdictJump: "jump",
		expr.VerdictBreak: "break", expr.VerdictContinue: "continue",
		expr.VerdictDrop: "drop", expr.VerdictAccept: "accept",
	}
	name, ok := names[kind]
	if !ok {
		name = fmt.Sprintf("verdict(%d)", kind)
	}
	if chain != "" {
		name += " " + chain
	}
	return name
}

// nftKey renders a set key as its 4-byte registers in hex, joined as nft
// joins concatenations; a 4-byte key is also shown as an IPv4 address,
// since it may be one (or a number in host order).
func nftKey(key []byte) string {
	if len(key) == 4 {
		return fmt.Sprintf("%x (%s)", key, netip.AddrFrom4([4]byte(key)))
	}
	var words []string
	for len(key) > 4 {
		words = append(words, fmt.Sprintf("%x", key[:4]))
		key = key[4:]
	}
	words = append(words, fmt.Sprintf("%x", key))
	return strings.Join(words, " . ")
}

// nftData renders a map element's data. The library leaves a verdict map's
// data as the netlink attributes of the verdict (NFTA_VERDICT_CODE, then
// NFTA_VERDICT_CHAIN), which this decodes; other data is shown in hex.
func nftData(val []byte) string {
	const attrCode, attrChain = 1, 2
	var code expr.VerdictKind
	var chain string
	rest := val
	for len(rest) >= 4 {
		n := int(binary.LittleEndian.Uint16(rest))
		typ := binary.LittleEndian.Uint16(rest[2:]) &^ unix.NLA_F_NESTED
		if n < 4 || n > len(rest) {
			return fmt.Sprintf("%x", val)
		}
		switch data := rest[4:n]; {
		case typ == attrCode && len(data) == 4:
			code = expr.VerdictKind(int32(binary.BigEndian.Uint32(data)))
		case typ == attrChain:
			chain = strings.TrimRight(string(data), "\x00")
		default:
			return fmt.Sprintf("%x", val)
		}
		rest = rest[min((n+3)&^3, len(rest)):]
	}
	return nftVerdict(code, chain)
}
