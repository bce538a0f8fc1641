package nfttest

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Foreign creates, in network namespace ns, table name of family fam as
// another program would: without proxyshift's mark, with a base chain, a
// rule and a set of its own. It returns the table's Snapshot.
func Foreign(t testing.TB, ns nsexec.NS, fam nftables.TableFamily, name string) string {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(ns.FD()))
	if err != nil {
		t.Fatal(err)
	}
	tb := conn.AddTable(&nftables.Table{Name: name, Family: fam})
	ch := conn.AddChain(&nftables.Chain{Name: "services", Table: tb, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	conn.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}}})
	if err := conn.AddSet(&nftables.Set{Table: tb, Name: "service-ips", KeyType: nftables.TypeInetService}, []nftables.SetElement{{Key: []byte{0, 80}}}); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatalf("create the foreign table %s: %v", name, err)
	}
	return Snapshot(t, ns, fam, name)
}

// Snapshot is what the kernel holds of table name of family fam: the
// table, its chains, rules and sets as the kernel's netlink dumps encode
// them (without the ruleset generation each answer carries), one object
// a line. Two snapshots are equal when nothing in the table changed.
func Snapshot(t testing.TB, ns nsexec.NS, fam nftables.TableFamily, name string) string {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: ns.FD()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	for _, req := range []struct {
		msg, attr uint16
	}{{unix.NFT_MSG_GETTABLE, unix.NFTA_TABLE_NAME}, {unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE}, {unix.NFT_MSG_GETRULE, unix.NFTA_RULE_TABLE}, {unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE}} {
		ae := netlink.NewAttributeEncoder()
		ae.String(req.attr, name)
		attrs, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | req.msg), Flags: netlink.Request | netlink.Dump},
			Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, attrs...),
		})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			t.Fatalf("dump table %s: %v", name, err)
		}
		for _, m := range msgs {
			// A table dump lists every table of the family: keep ours.
			if len(m.Data) > 4 && (req.msg != unix.NFT_MSG_GETTABLE || strings.Contains(string(m.Data), name+"\x00")) {
				b.WriteString(hex.EncodeToString(m.Data[4:]) + "\n")
			}
		}
	}
	return b.String()
}

// RequireForeign fails the test unless err is (or wraps) a
// *nft.ForeignTableError naming table name of family family, whose
// message says it was not proxyshift's.
func RequireForeign(t testing.TB, what string, err error, family, name string) {
	t.Helper()
	var fe *nft.ForeignTableError
	if !errors.As(err, &fe) || fe.Family != family || fe.Table != name {
		t.Errorf("%s: error %v, want one saying table %s %s is not proxyshift's", what, err, family, name)
		return
	}
	if !strings.Contains(err.Error(), "nftables table "+family+" "+name+" was not created by proxyshift") {
		t.Errorf("%s: the error %q does not name the table", what, err)
	}
}
