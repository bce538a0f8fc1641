package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/proxyshift/proxyshift/nodeagent/cleanup"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/ipvs"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// In ipvs mode every cluster IP is bound to proxyshift's dummy interface,
// and during a takeover from kube-proxy's IPVS mode to kube-ipvs0 too.
// With a nodePortAddresses CIDR that covers the service range as well as
// the node network, NodePorts must still answer on the node's address
// alone, not on every cluster IP.
func TestNodePortIPsLeaveOutServiceAddressInterfaces(t *testing.T) {
	ns := netlab.NewNetNS(t, "localaddrs")
	links := []struct {
		name string
		addr netip.Prefix
	}{
		{"eth0", netip.MustParsePrefix("198.18.0.5/24")},
		{ipvs.DummyInterface, netip.MustParsePrefix("198.19.0.10/32")},
		{cleanup.KubeProxyIPVSLink, netip.MustParsePrefix("198.19.0.11/32")},
	}
	err := ns.Do(func() error {
		for i, l := range links {
			// This kernel has no dummy interface type: a veth stands in
			// (addresses are listed alike whatever the link type).
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.name}, PeerName: fmt.Sprintf("peer%d", i)}
			if err := netlink.LinkAdd(veth); err != nil {
				return err
			}
			addr, err := netlink.ParseAddr(l.addr.String())
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(veth, addr); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	local, err := localAddrs(ns.NS())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(local, links[0].addr.Addr()) {
		t.Errorf("local addresses %v lack the node's %v", local, links[0].addr.Addr())
	}
	got, err := NodePortIPs([]string{"198.18.0.0/15"}, nil, local)
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{links[0].addr.Addr()}; !slices.Equal(got, want) {
		t.Errorf("NodePort addresses %v, want %v: the addresses of %s and %s are Services', not the node's", got, want, ipvs.DummyInterface, cleanup.KubeProxyIPVSLink)
	}
}
