package nft

import (
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	corev1 "k8s.io/api/core/v1"
)

// TestRuleMessagesAreTheLibrarys writes rules of every kind the backends
// build (matches on sets and maps, verdict maps, numgen DNAT through a
// map, plain DNAT, marks, masquerade, rejects, jumps and gotos) with
// AddRule, in both families, and checks that the messages are
// google/nftables' for the same rules.
func TestRuleMessagesAreTheLibrarys(t *testing.T) {
	for _, f := range []*Family{IPv4, IPv6} {
		addr := netip.MustParseAddr("198.18.0.1")
		prefix := netip.MustParsePrefix("198.18.0.0/15")
		if f == IPv6 {
			addr, prefix = netip.MustParseAddr("2001:db8::1"), netip.MustParsePrefix("2001:db8::/32")
		}
		rules := []Rule{
			NewRule(f).CtStateNew().Jump("firewall-check").Rule(),
			NewRule(f).VmapService("service-ips").Rule(),
			NewRule(f).FibLocal("daddr").AddrIn("daddr", true, prefix).VmapProtoPort("service-nodeports").Rule(),
			NewRule(f).AddrInSet("daddr", false, "cluster-ips").AddrInSet("saddr", true, "cluster-cidrs").MarkSet(0x4000).Rule(),
			NewRule(f).ServiceInSet("virtual-servers", true).Drop().Rule(),
			NewRule(f).DNATRandom(corev1.ProtocolTCP, []netip.AddrPort{netip.AddrPortFrom(addr, 80), netip.AddrPortFrom(addr, 8080)}).Rule(),
			NewRule(f).DNATRandom(corev1.ProtocolTCP, []netip.AddrPort{netip.AddrPortFrom(addr, 80)}).Rule(),
			NewRule(f).AddrInSet("saddr", false, "affinity-x").Goto("endpoint-x").Rule(),
			NewRule(f).NumgenVmap(3, "numgen-x").Rule(),
			NewRule(f).UpdateSaddr("affinity-x").DNAT(corev1.ProtocolUDP, addr, 53).Rule(),
			NewRule(f).AddrPairInSet("hairpin-endpoints").MarkSet(0x4000).Rule(),
			NewRule(f).MarkUnset(0x4000).Return().Rule(),
			NewRule(f).MarkClear(0x4000).Masquerade().Rule(),
			NewRule(f).RejectTCP().Rule(),
			NewRule(f).Reject().Rule(),
			NewRule(f).Drop().Rule(),
		}
		table := &nftables.Table{Name: "proxyshift", Family: f.Table}
		txn := NewTxn(0)
		library := librarysMessages(t, func(conn *nftables.Conn) error {
			for _, r := range rules {
				if err := AddRule(txn, table, "a-chain", r.Exprs); err != nil {
					return err
				}
				conn.AddRule(&nftables.Rule{Table: table, Chain: &nftables.Chain{Name: "a-chain", Table: table}, Exprs: r.Exprs})
			}
			return nil
		})
		requireLibrarysMessages(t, f.Name, batchMessages(t, txn)[1:], library)
	}
}

// TestAddRuleRefusesXtables: the library adds a compatibility attribute
// to rules with x_tables matches and targets, which AddRule does not
// write; it says so and leaves the batch as it was.
func TestAddRuleRefusesXtables(t *testing.T) {
	txn := NewTxn(0)
	table := &nftables.Table{Name: "proxyshift", Family: nftables.TableFamilyIPv4}
	if err := AddRule(txn, table, "a-chain", []expr.Any{&expr.Match{Name: "conntrack"}}); err == nil {
		t.Fatal("AddRule wrote a rule with an x_tables match")
	}
	if n := len(batchMessages(t, txn)); n != 1 {
		t.Errorf("the batch holds %d messages after the refusal, want its begin only", n)
	}
}
