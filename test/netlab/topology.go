package netlab

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
)

// The single-node lab's addresses (NewLab). Service addresses (cluster,
// external and load-balancer IPs) come from ServiceCIDR, which no
// interface holds: clients reach it through their default route via the
// node, where the proxy under test translates it. Each has its IPv6 twin
// (IPv6Of, IPv6PrefixOf) on the same link: the lab is dual-stack.
var (
	// NodeIP is the node's address on its uplink, where NodePorts answer.
	NodeIP = netip.MustParseAddr("198.18.0.1")
	// ClientIP is the lab's client, outside the pod network.
	ClientIP = netip.MustParseAddr("198.18.0.2")
	// OtherClientIP is a second client, for source-range tests.
	OtherClientIP = netip.MustParseAddr("198.18.0.3")
	// UplinkCIDR is the subnet the node shares with its clients.
	UplinkCIDR = netip.MustParsePrefix("198.18.0.0/24")
	// PodCIDR is the node's pod subnet; its first address is the pods'
	// gateway on the node.
	PodCIDR = netip.MustParsePrefix("198.18.1.0/24")
	// ServiceCIDR is where service addresses come from.
	ServiceCIDR = netip.MustParsePrefix("198.19.0.0/16")
)

// Link names inside a node namespace.
const (
	// UplinkBridge joins the node and its hosts (clients).
	UplinkBridge = "br-up"
	// PodBridge joins the node and its pods.
	PodBridge = "br-pods"
	// BeyondLink is the node's link to its Beyond namespace.
	BeyondLink = "beyond"
)

// BeyondCIDR is the point-to-point subnet between a node (first address)
// and its Beyond namespace (second address). Every node has its own.
var BeyondCIDR = netip.MustParsePrefix("198.18.255.0/30")

// Lab is one node with its pods and two clients: the world a dataplane
// test sends real packets through. Every namespace also holds the IPv6
// twins of its addresses (2001:db8::c612:2 for 198.18.0.2, see IPv6Of),
// with the same routes, when the kernel has IPv6.
//
//	client  198.18.0.2 ─┐
//	                     ├─ br-up 198.18.0.1 [node: forwarding, the proxy] br-pods 198.18.1.1 ─┬─ pod 198.18.1.2
//	other   198.18.0.3 ─┘                                                                     └─ pod 198.18.1.3 ...
type Lab struct {
	Node *Node
	// Client is at ClientIP, OtherClient at OtherClientIP.
	Client, OtherClient *Host
}

// NewLab builds the single-node lab with the addresses above and no pods;
// add them with Lab.Node.AddPod. Everything is removed when the test ends.
func NewLab(t testing.TB) *Lab {
	t.Helper()
	node := NewNode(t, NodeSpec{
		Role:    "node",
		Uplink:  netip.PrefixFrom(NodeIP, UplinkCIDR.Bits()),
		PodCIDR: PodCIDR,
	})
	return &Lab{
		Node:        node,
		Client:      node.AddHost(t, "client", ClientIP),
		OtherClient: node.AddHost(t, "client2", OtherClientIP),
	}
}

// NodeSpec describes a node namespace.
type NodeSpec struct {
	// Role names the namespace (see NewNetNS).
	Role string
	// Uplink is the node's address and subnet on its uplink bridge.
	Uplink netip.Prefix
	// PodCIDR is the pod subnet; the node holds its first address.
	PodCIDR netip.Prefix
}

// Node is a namespace that routes between an uplink bridge, where hosts
// attach, and a pod bridge: what a Kubernetes node with a bridge CNI looks
// like to a service proxy. IPv4 and IPv6 forwarding are on and reverse-path
// filtering off. Each address has its IPv6 twin on the same link (see
// IPv6Of), and each route its IPv6 twin.
//
// The node's default route leads to a namespace of its own (Beyond) that
// neither forwards nor answers, standing in for the network beyond the
// node. As on a real node, a packet to an address nobody handles, such as
// a service address the proxy does not translate, is routed, so it
// crosses the forward hook (where proxies reject traffic to services
// without endpoints), and then vanishes without an answer.
//
// Several nodes can share one segment by joining their uplink bridges
// with a veth (AddVeth, SetMaster) and routing each other's pod subnets
// (AddRoute).
type Node struct {
	NS *NetNS
	// IP is the node's uplink address.
	IP netip.Addr
	// Uplink is IP with the uplink subnet's length.
	Uplink netip.Prefix
	// PodCIDR is the pod subnet and PodGateway its first address, held by
	// the pod bridge.
	PodCIDR    netip.Prefix
	PodGateway netip.Addr
	// Beyond is where the node's default route leads.
	Beyond *NetNS
	// IP6, Uplink6, PodCIDR6 and PodGateway6 are the IPv6 twins of the
	// above; invalid when the kernel has no IPv6.
	IP6         netip.Addr
	Uplink6     netip.Prefix
	PodCIDR6    netip.Prefix
	PodGateway6 netip.Addr

	mu      sync.Mutex
	nextPod netip.Addr
	links   int
}

// NewNode creates the node namespace with its two bridges, and its Beyond
// namespace with the default route to it.
func NewNode(t testing.TB, spec NodeSpec) *Node {
	t.Helper()
	if !spec.Uplink.Addr().Is4() || !spec.PodCIDR.Addr().Is4() {
		t.Fatalf("node %s: uplink %s and pod CIDR %s must be IPv4", spec.Role, spec.Uplink, spec.PodCIDR)
	}
	ns := NewNetNS(t, spec.Role)
	beyond := NewNetNS(t, spec.Role+"-beyond")
	podCIDR := spec.PodCIDR.Masked()
	gw := podCIDR.Addr().Next()
	n := &Node{
		NS:         ns,
		IP:         spec.Uplink.Addr(),
		Uplink:     spec.Uplink,
		PodCIDR:    podCIDR,
		PodGateway: gw,
		Beyond:     beyond,
		nextPod:    gw.Next(),

		IP6:         twin(spec.Uplink.Addr()),
		Uplink6:     twinPrefix(spec.Uplink),
		PodCIDR6:    twinPrefix(podCIDR),
		PodGateway6: twin(gw),
	}
	nodeEnd := BeyondCIDR.Addr().Next()
	beyondEnd := nodeEnd.Next()
	steps := []func() error{
		func() error { return ns.dualStack(true) },
		func() error { return ns.AddBridge(UplinkBridge, netip.Prefix{}) },
		func() error { return ns.addDual(UplinkBridge, spec.Uplink) },
		func() error { return ns.AddBridge(PodBridge, netip.Prefix{}) },
		func() error { return ns.addDual(PodBridge, netip.PrefixFrom(gw, podCIDR.Bits())) },
		// New namespaces may inherit forwarding from the host.
		func() error { return beyond.dualStack(false) },
		func() error { return ns.AddVeth(BeyondLink, beyond, "eth0") },
		func() error { return ns.addDual(BeyondLink, netip.PrefixFrom(nodeEnd, BeyondCIDR.Bits())) },
		func() error { return beyond.addDual("eth0", netip.PrefixFrom(beyondEnd, BeyondCIDR.Bits())) },
		func() error { return ns.routeDual(beyondEnd) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("node %s: %v", spec.Role, err)
		}
	}
	return n
}

// Host is a namespace with one address (and its IPv6 twin), attached to
// a node's uplink and routed through the node: a client outside the
// cluster.
type Host struct {
	NS *NetNS
	IP netip.Addr
	// IP6 is IP's IPv6 twin; invalid when the kernel has no IPv6.
	IP6 netip.Addr
}

// AddHost creates a host namespace at ip on the node's uplink, with its
// default route via the node.
func (n *Node) AddHost(t testing.TB, role string, ip netip.Addr) *Host {
	t.Helper()
	ns := NewNetNS(t, role)
	link := n.newLinkName("vh")
	steps := []func() error{
		func() error { return ns.dualStack(false) },
		func() error { return n.NS.AddVeth(link, ns, "eth0") },
		func() error { return n.NS.SetMaster(link, UplinkBridge) },
		func() error { return ns.addDual("eth0", netip.PrefixFrom(ip, n.Uplink.Bits())) },
		func() error { return ns.routeDual(n.IP) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("host %s: %v", role, err)
		}
	}
	return &Host{NS: ns, IP: ip, IP6: twin(ip)}
}

// Pod is a namespace on a node's pod bridge running a Server named after
// the pod on ServerPort.
type Pod struct {
	// Name is the pod's name and what its server answers with.
	Name string
	NS   *NetNS
	IP   netip.Addr
	// IP6 is IP's IPv6 twin; invalid when the kernel has no IPv6.
	IP6 netip.Addr

	node     *Node
	hostLink string
	server   *Server
	remove   sync.Once
	removed  error
}

// AddPod creates a pod namespace at the node's next free pod address
// (addresses are never reused within a node) and starts its server. The
// pod is removed when the test ends, or earlier by Remove.
func (n *Node) AddPod(t testing.TB, name string) *Pod {
	t.Helper()
	ip, err := n.allocPodIP()
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	ns := NewNetNS(t, name)
	p := &Pod{Name: name, NS: ns, IP: ip, IP6: twin(ip), node: n, hostLink: n.newLinkName("vp")}
	steps := []func() error{
		func() error { return ns.dualStack(false) },
		func() error { return n.NS.AddVeth(p.hostLink, ns, "eth0") },
		func() error { return n.NS.SetMaster(p.hostLink, PodBridge) },
		func() error { return ns.addDual("eth0", netip.PrefixFrom(ip, n.PodCIDR.Bits())) },
		func() error { return ns.routeDual(n.PodGateway) },
		func() (err error) { p.server, err = StartServer(ns, name, ServerPort); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		if err := p.Remove(); err != nil {
			t.Errorf("remove pod %s: %v", name, err)
		}
	})
	return p
}

// Addr is the pod's server address.
func (p *Pod) Addr() netip.AddrPort { return netip.AddrPortFrom(p.IP, ServerPort) }

// Addr6 is the pod's server address over IPv6.
func (p *Pod) Addr6() netip.AddrPort { return netip.AddrPortFrom(p.IP6, ServerPort) }

// Remove stops the pod's server and unplugs the pod from the node, so its
// address no longer answers; the namespace itself goes when the test ends.
// Later calls return the first call's result.
func (p *Pod) Remove() error {
	p.remove.Do(func() {
		p.server.Stop()
		p.removed = p.node.NS.DeleteLink(p.hostLink)
	})
	return p.removed
}

func (n *Node) allocPodIP() (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ip := n.nextPod
	// Keep the subnet's last address (broadcast) free.
	if !n.PodCIDR.Contains(ip.Next()) {
		return netip.Addr{}, fmt.Errorf("pod subnet %s is full", n.PodCIDR)
	}
	n.nextPod = ip.Next()
	return ip, nil
}

func (n *Node) newLinkName(prefix string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.links++
	return fmt.Sprintf("%s%d", prefix, n.links)
}
