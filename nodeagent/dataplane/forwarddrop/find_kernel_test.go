package forwarddrop

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// forwardDropNS is a namespace whose iptables-nft filter FORWARD policy
// is DROP, holding extra empty chains in iptables-nft's nat table, and
// nftables tables "own" (with a forward chain that drops, as the caller's
// own table would), "fw" (a firewall whose forward chain has a name of
// its own) and "kp" (a forward chain named filter-forward).
func forwardDropNS(t testing.TB, extraChains int) *netlab.NetNS {
	t.Helper()
	netlab.RequireRoot(t)
	restore, err := exec.LookPath("iptables-nft-restore")
	if err != nil {
		t.Skip("needs iptables-nft-restore (Debian package iptables)")
	}
	ns := netlab.NewNetNS(t, "fwd")
	var in strings.Builder
	in.WriteString("*nat\n")
	for i := range extraChains {
		fmt.Fprintf(&in, ":PROXYSHIFT-SEP-%08d - [0:0]\n", i)
	}
	in.WriteString("COMMIT\n*filter\n:FORWARD DROP [0:0]\nCOMMIT\n")
	if _, err := ns.NS().Output(context.Background(), []byte(in.String()), restore); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(ns.NS().FD()))
	if err != nil {
		t.Fatal(err)
	}
	drop := nftables.ChainPolicyDrop
	for table, chain := range map[string]string{"own": "filter-forward", "fw": "fw-forward", "kp": "filter-forward"} {
		tb := c.AddTable(&nftables.Table{Name: table, Family: nftables.TableFamilyIPv4})
		c.AddChain(&nftables.Chain{Name: chain, Table: tb, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	return ns
}

// Find lists every chain of a family whose tables are small, and finds
// the forward chains of large ones by the names programs give them.
func TestFindListsSmallFamiliesAndLooksUpLargeOnes(t *testing.T) {
	ns := forwardDropNS(t, 100)
	for _, tc := range []struct {
		name   string
		listed int
		want   []string
	}{
		{"listed", listedChains, []string{"nftables ip filter FORWARD", "nftables ip fw fw-forward", "nftables ip kp filter-forward"}},
		// fw's chain has a name of its own: not seen.
		{"looked up by name", 50, []string{"nftables ip filter FORWARD", "nftables ip kp filter-forward"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(was int) { listedChains = was }(listedChains)
			listedChains = tc.listed
			got, err := Find(context.Background(), ns.NS(), "own")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("found %q, want %q", got, tc.want)
			}
		})
	}
}

// BenchmarkFindBesideIPTables10k looks for forward-dropping chains in a
// namespace whose iptables-nft nat table holds 110 000 chains, as an
// iptables mode at 10 000 services leaves it while a node switches from
// it to nftables, whose first sync looks.
func BenchmarkFindBesideIPTables10k(b *testing.B) {
	ns := forwardDropNS(b, 110000)
	for b.Loop() {
		found, err := Find(context.Background(), ns.NS(), "own")
		if err != nil {
			b.Fatal(err)
		}
		if len(found) != 2 {
			b.Fatalf("found %q", found)
		}
	}
}
