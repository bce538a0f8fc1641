package nft

import (
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/test/netlab"
)

func TestDNATRandom(t *testing.T) {
	ep := netip.MustParseAddrPort
	for _, tc := range []struct {
		name   string
		f      *Family
		eps    []netip.AddrPort
		text   string
		values string
	}{{
		name:   "one port",
		f:      IPv4,
		eps:    []netip.AddrPort{ep("198.18.0.1:8080"), ep("198.18.0.2:8080")},
		text:   "meta l4proto tcp dnat to numgen random mod 2 map { 0 : 198.18.0.1, 1 : 198.18.0.2 }:8080",
		values: "c6120001" + "c6120002",
	}, {
		name:   "ports differ",
		f:      IPv4,
		eps:    []netip.AddrPort{ep("198.18.0.1:80"), ep("198.18.0.2:8080")},
		text:   "meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 198.18.0.1 . 80, 1 : 198.18.0.2 . 8080 }",
		values: "c6120001" + "00500000" + "c6120002" + "1f900000",
	}, {
		name:   "IPv6",
		f:      IPv6,
		eps:    []netip.AddrPort{ep("[2001:db8::1]:53")},
		text:   "meta l4proto tcp dnat to numgen random mod 1 map { 0 : 2001:db8::1 }:53",
		values: "20010db8000000000000000000000001",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRule(tc.f).DNATRandom(corev1.ProtocolTCP, tc.eps).Rule()
			if r.Text != tc.text {
				t.Errorf("text %q, want %q", r.Text, tc.text)
			}
			if r.Anon == nil || r.Anon.Len() != len(tc.eps) || hex.EncodeToString(r.Anon.Values) != tc.values {
				t.Fatalf("map %+v, want %d values %s", r.Anon, len(tc.eps), tc.values)
			}
		})
	}
}

// TestKernelLargeAnonymousMap: a DNAT rule with more endpoints than one
// netlink attribute holds (its elements go in several messages, all
// before the rule binds the map) is taken by the kernel whole, and the
// map's declared size is its number of endpoints.
func TestKernelLargeAnonymousMap(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "anon")
	table := &nftables.Table{Name: "proxyshift-anon-test", Family: nftables.TableFamilyIPv4}
	const n = 5000 // about 150 KB of elements
	eps := make([]netip.AddrPort, n)
	for i := range eps {
		eps[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 8080)
	}
	r := NewRule(IPv4).DNATRandom(corev1.ProtocolTCP, eps).Rule()
	txn := NewTxn(ns.NS())
	txn.Conn().AddTable(table)
	txn.Conn().AddChain(&nftables.Chain{Name: "dnat", Table: table})
	if err := AddRuleOf(txn, table, "dnat", r, 1); err != nil {
		t.Fatal(err)
	}
	if err := txn.Commit(); err != nil {
		t.Fatalf("commit of a rule with %d endpoints: %v", n, err)
	}
	conn, err := Open(ns.NS())
	if err != nil {
		t.Fatal(err)
	}
	rules, err := conn.GetRules(table, &nftables.Chain{Name: "dnat", Table: table})
	if err != nil || len(rules) != 1 {
		t.Fatalf("rules: %d, %v", len(rules), err)
	}
	var name string
	for _, e := range rules[0].Exprs {
		if l, ok := e.(*expr.Lookup); ok {
			name = l.SetName
		}
	}
	sets, err := conn.GetSets(table)
	if err != nil || len(sets) != 1 || sets[0].Name != name || !sets[0].Anonymous || sets[0].Size != n {
		t.Fatalf("sets %+v (%v): want the rule's anonymous map %q of size %d", sets, err, name, n)
	}
	elems, err := conn.GetSetElements(sets[0])
	if err != nil || len(elems) != n {
		t.Errorf("the map holds %d elements (%v), want %d", len(elems), err, n)
	}
}
