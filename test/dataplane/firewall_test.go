package dataplane_test

import (
	"net"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestLoadBalancerSourceRangesAllowTheNodeItself checks, in every mode,
// the node's own requests to a load-balancer IP that its load balancer
// delivers locally (a local route to the VIP on the node, as GCE's guest
// agent installs): the kernel then picks the VIP itself as the source, and
// the firewall lets it through because a source range holds the node's
// primary IP, as kube-proxy does. NodePorts answer on every local address
// (nodePortAddresses empty, the default), so that the node's primary IP is
// known only as such. A client outside the ranges stays dropped: the
// firewall is there.
func TestLoadBalancerSourceRangesAllowTheNodeItself(t *testing.T) {
	netlab.RequireRoot(t)
	for _, row := range backends {
		t.Run(row.name, func(t *testing.T) {
			skipHostRowInVM(t, row)
			lab := netlab.NewLab(t)
			node := lab.Node
			row.skip(t, node.NS)
			p := pods{a: node.AddPod(t, "pod-a"), b: node.AddPod(t, "pod-b")}
			cfg := anyLocalNode
			cfg.PrimaryIPs = []netip.Addr{netlab.NodeIP}
			b := row.new(t, node.NS, cfg)
			if _, err := b.Sync(t.Context(), dataplane.SyncRequest{Model: snapshot(nodeOnlyLoadBalancer(p)), Full: true}); err != nil {
				t.Fatalf("full sync: %v\n%s", err, row.dump(node.NS))
			}
			defer func() {
				if t.Failed() {
					t.Logf("%s state in the node namespace:\n%s", row.name, row.dump(node.NS))
				}
			}()
			deliverLocally(t, node.NS, lbIP)
			lb := netip.AddrPortFrom(lbIP, 80)
			expectSpread(t, node.NS, netlab.TCP, lb, []string{"pod-a", "pod-b"})
			expectNotServed(t, lab.Client.NS, lb)
		})
	}
}

// nodeOnlyLoadBalancer is a LoadBalancer service at lbIP whose one
// source range holds the node's address and no client's.
func nodeOnlyLoadBalancer(p pods) map[model.ServicePortName]*model.ServicePort {
	name := model.ServicePortName{Namespace: "suite", Name: "lb", Port: "p", Protocol: corev1.ProtocolTCP}
	return map[model.ServicePortName]*model.ServicePort{name: {
		Name: name, Family: corev1.IPv4Protocol, ClusterIP: lbClusterIP, Protocol: corev1.ProtocolTCP, Port: 80,
		LoadBalancerIPs:          []netip.Addr{lbIP},
		LoadBalancerSourceRanges: []netip.Prefix{netip.PrefixFrom(netlab.NodeIP, 32)},
		Endpoints:                []model.Endpoint{endpoint(ipv4, p.a, true), endpoint(ipv4, p.b, true)},
	}}
}

// deliverLocally makes vip a local address of ns by a local route, unless
// it is local already (the IPVS backend binds load-balancer IPs to its
// dummy interface), and checks that the kernel picks vip itself as the
// source of ns's own connections to it.
func deliverLocally(t *testing.T, ns *netlab.NetNS, vip netip.Addr) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns.Handle, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	routes, err := h.RouteGet(vip.AsSlice())
	if err != nil {
		t.Fatal(err)
	}
	if routes[0].Type != unix.RTN_LOCAL {
		lo, err := h.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		local := &netlink.Route{LinkIndex: lo.Attrs().Index, Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
			Dst: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(vip.BitLen(), vip.BitLen())}}
		if err := h.RouteAdd(local); err != nil {
			t.Fatalf("local route to %s in %s: %v", vip, ns.Name, err)
		}
		if routes, err = h.RouteGet(vip.AsSlice()); err != nil {
			t.Fatal(err)
		}
	}
	if src, _ := netip.AddrFromSlice(routes[0].Src); src.Unmap() != vip {
		t.Fatalf("the kernel picks %s as the source of %s's connections to %s; the check needs %s itself", src, ns.Name, vip, vip)
	}
}
