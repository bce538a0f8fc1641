package dataplane_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/iptables"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Localhost NodePorts: kube-proxy's iptables mode (localhostNodePorts,
// its default) answers NodePorts on 127.0.0.1 for clients on the node,
// which needs the route_localnet sysctl; its nftables and IPVS modes do
// not, and neither do ours. See the iptables README.

// loopbackNodePort is where a client on the node reaches the NodePort.
var loopbackNodePort = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), nodePort)

// anyLocalNode is the suite's node with NodePorts on every local address
// (nodePortAddresses empty, as by default), which is where kube-proxy
// serves them on 127.0.0.1 too.
var anyLocalNode = func() dataplane.NodeConfig {
	c := nodeConfig
	c.NodeIPs = nil
	return c
}()

// localnetPort is a port of a server of the node itself, bound to every
// address and so to 127.0.0.0/8, which route_localnet must not expose to
// other hosts.
const localnetPort = 9099

// TestLocalhostNodePorts checks, in every mode, who answers a client on
// the node at 127.0.0.1:<NodePort>. The iptables rows first program
// without localhost NodePorts (not served), then with them: served by
// the endpoints, route_localnet set (and reported), and another host
// sending to 127.0.0.2 through the node still cannot reach the node's own
// server there, unless the drop rule is taken away. nftables and IPVS
// never serve it.
func TestLocalhostNodePorts(t *testing.T) {
	netlab.RequireRoot(t)
	for _, row := range backends {
		t.Run(row.name, func(t *testing.T) {
			skipHostRowInVM(t, row)
			lab := netlab.NewLab(t)
			node := lab.Node
			row.skip(t, node.NS)
			p := pods{a: node.AddPod(t, "pod-a"), b: node.AddPod(t, "pod-b")}
			ports := nodePortOnly(p)
			ctx := t.Context()
			sync := func(b dataplane.Backend) {
				t.Helper()
				if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: snapshot(ports), Full: true}); err != nil {
					t.Fatalf("full sync: %v\n%s", err, row.dump(node.NS))
				}
			}
			b := row.new(t, node.NS, anyLocalNode)
			sync(b)
			// The NodePort works on the node's address in every mode.
			expectSpread(t, lab.Client.NS, netlab.TCP, netip.AddrPortFrom(netlab.NodeIP, nodePort), []string{"pod-a", "pod-b"})
			expectNotServed(t, node.NS, loopbackNodePort)

			v, ok := strings.CutPrefix(row.name, "iptables-")
			if !ok {
				return
			}
			lb, err := iptables.New(anyLocalNode, iptables.WithVariant(iptables.Variant(v)), iptables.WithNetNS(node.NS.NS()),
				iptables.WithLocalhostNodePorts(true))
			if err != nil {
				t.Fatal(err)
			}
			sync(lb)
			defer func() {
				if t.Failed() {
					t.Logf("state in the node namespace:\n%s", row.dump(node.NS))
				}
			}()
			if got, err := node.NS.Sysctl("net/ipv4/conf/all/route_localnet"); err != nil || got != "1" {
				t.Errorf("route_localnet in the node namespace: %q, %v; want 1", got, err)
			}
			settings, err := dataplane.KernelSettings(lb)
			if err != nil || len(settings) != 1 || settings[0] != (dataplane.KernelSetting{Name: "net.ipv4.conf.all.route_localnet", Want: "1", Value: "1"}) {
				t.Errorf("KernelSettings: %+v, %v; want route_localnet 1 of 1", settings, err)
			}
			expectSpread(t, node.NS, netlab.TCP, loopbackNodePort, []string{"pod-a", "pod-b"})
			expectSpread(t, lab.Client.NS, netlab.TCP, netip.AddrPortFrom(netlab.NodeIP, nodePort), []string{"pod-a", "pod-b"})

			// The martian protection: the client sends to 127.0.0.2
			// through the node, where a server of the node listens.
			self, err := netlab.StartServer(node.NS, "node-itself", localnetPort)
			if err != nil {
				t.Fatal(err)
			}
			defer self.Stop()
			localnet := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), localnetPort)
			routeLoopbackVia(t, lab.Client.NS, localnet.Addr(), netlab.NodeIP)
			expectNotServed(t, lab.Client.NS, localnet)
			// Without the drop rule the server answers: the check above
			// is the rule's doing, not the lab's.
			rule := `PROXYSHIFT-FILTER -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate DNAT -m comment --comment "proxyshift block incoming localnet connections" -j DROP`
			if _, err := iptablesCmd(node.NS, iptables.Variant(v), "", append([]string{"-t", "filter", "-D"}, splitRule(rule)...)...); err != nil {
				t.Fatal(err)
			}
			if got, err := lab.Client.NS.Request(netlab.TCP, localnet, okTimeout); err != nil || got != "node-itself" {
				t.Errorf("without the drop rule, %s from the client: %q, %v; want answered by node-itself (is the lab's path there?)", localnet, got, err)
			}
			sync(lb)
			expectNotServed(t, lab.Client.NS, localnet)

			// Cleanup (a switch to another mode) removes the drop rule
			// with the chains, and so sets route_localnet back to 0: the
			// node drops the neighbour's packets as martians again.
			if _, err := lb.Cleanup(ctx); err != nil {
				t.Fatalf("cleanup: %v", err)
			}
			if got, err := node.NS.Sysctl("net/ipv4/conf/all/route_localnet"); err != nil || got != "0" {
				t.Errorf("route_localnet after cleanup: %q, %v; want 0", got, err)
			}
			expectNotServed(t, lab.Client.NS, localnet)
			expectNotServed(t, node.NS, loopbackNodePort)
		})
	}
}

// nodePortOnly is the suite's service nodeport alone.
func nodePortOnly(p pods) map[model.ServicePortName]*model.ServicePort {
	name := model.ServicePortName{Namespace: "suite", Name: "nodeport", Port: "p", Protocol: corev1.ProtocolTCP}
	return map[model.ServicePortName]*model.ServicePort{name: {
		Name: name, Family: corev1.IPv4Protocol, ClusterIP: nodePortIP, Protocol: corev1.ProtocolTCP, Port: 80, NodePort: nodePort,
		Endpoints: []model.Endpoint{endpoint(ipv4, p.a, true), endpoint(ipv4, p.b, true)},
	}}
}

// expectNotServed checks that a TCP request from ns to addr gets no
// answer (refused or dropped).
func expectNotServed(t *testing.T, ns *netlab.NetNS, addr netip.AddrPort) {
	t.Helper()
	if got, err := ns.Request(netlab.TCP, addr, failTimeout); err == nil {
		t.Errorf("%s from %s answered by %s; want not served", addr, ns.Name, got)
	} else {
		t.Logf("%s from %s: %v", addr, ns.Name, err)
	}
}

// routeLoopbackVia makes ns (a client namespace of the test's) send
// packets for dst, a 127.0.0.0/8 address other than 127.0.0.1, to the
// gateway via, as a hostile neighbour of the node would: it drops ns's
// local route for 127.0.0.0/8 (127.0.0.1 stays local), routes dst via
// the gateway, and lets ns route loopback addresses off lo.
func routeLoopbackVia(t *testing.T, ns *netlab.NetNS, dst, via netip.Addr) {
	t.Helper()
	for _, key := range []string{"net/ipv4/conf/all/route_localnet", "net/ipv4/conf/eth0/route_localnet"} {
		if err := ns.SetSysctl(key, "1"); err != nil {
			t.Fatal(err)
		}
	}
	h, err := netlink.NewHandleAt(ns.Handle, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	local := &netlink.Route{LinkIndex: lo.Attrs().Index, Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
		Dst: &net.IPNet{IP: net.IPv4(127, 0, 0, 0).To4(), Mask: net.CIDRMask(8, 32)}, Src: net.IPv4(127, 0, 0, 1).To4()}
	if err := h.RouteDel(local); err != nil {
		t.Fatalf("delete the local route 127.0.0.0/8 in %s: %v", ns.Name, err)
	}
	if err := ns.AddRoute(netip.PrefixFrom(dst, 32), via); err != nil {
		t.Fatal(err)
	}
}

// splitRule splits an iptables rule spec at spaces, keeping a quoted
// comment whole (without its quotes).
func splitRule(spec string) []string {
	var out []string
	for i, part := range strings.Split(spec, `"`) {
		if i%2 == 1 {
			out = append(out, part)
			continue
		}
		out = append(out, strings.Fields(part)...)
	}
	return out
}
