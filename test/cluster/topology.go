package cluster

import (
	"fmt"
	"net/netip"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// The cluster's addresses, all inside 198.18.0.0/15:
//
//	fabric          198.18.0.0/24   one bridge (in the fabric namespace) joining everything below
//	  .1            the fabric namespace itself: the nodes' default gateway, which
//	                neither forwards nor answers (the network "beyond" the cluster)
//	  .2            the control plane (etcd on its loopback, kube-apiserver on :6443)
//	  .11 .. .60    node i (1-based) at .(10+i)
//	  .101 ..       clients, outside the cluster
//	pods            198.18.64.0/18  (ClusterCIDR, the agents' --cluster-cidr)
//	  node i        198.18.(64+i).0/24, the node's pod bridge at .1, pods from .2
//	services        198.19.0.0/16   (ServiceCIDR, the API server's service-cluster-ip-range;
//	                no interface holds these, the nodes' proxies translate them)
var (
	FabricCIDR    = netip.MustParsePrefix("198.18.0.0/24")
	FabricGateway = netip.MustParseAddr("198.18.0.1")
	APIServerIP   = netip.MustParseAddr("198.18.0.2")
	ClusterCIDR   = netip.MustParsePrefix("198.18.64.0/18")
	ServiceCIDR   = netip.MustParsePrefix("198.19.0.0/16")
)

// APIServerPort is the API server's secure port on APIServerIP.
const APIServerPort = 6443

// MaxNodes bounds Options.Nodes (the fabric's node addresses and the pod
// subnets inside ClusterCIDR).
const MaxNodes = 50

// maxClients bounds the client hosts on the fabric.
const maxClients = 50

// Link names.
const (
	fabricBridge = "br-fabric"
	podBridge    = netlab.PodBridge
	uplink       = "eth0"
)

// NodeIP is node i's (1-based) fabric address.
func NodeIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}) }

// NodePodCIDR is node i's (1-based) pod subnet.
func NodePodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(64 + i), 0}), 24)
}

// clientIP is client k's (1-based) fabric address.
func clientIP(k int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 0, byte(100 + k)}) }

// nsPrefix starts the names of the namespaces the harness creates:
// "psc-<pid>-<cluster>-<role>". The pid lets a later run remove what a
// crashed run left behind (netlab.SweepStale).
const nsPrefix = "psc-"

// newNS creates one of the cluster's namespaces, removed by Close.
func (c *Cluster) newNS(role string) (*netlab.NetNS, error) { return c.namespaces.Create(role) }

// buildFabric creates the fabric namespace with its bridge, and the
// control-plane namespace on it.
func (c *Cluster) buildFabric() error {
	var err error
	if c.Fabric, err = c.newNS("fabric"); err != nil {
		return err
	}
	if c.fabric, err = netlab.NewFabric(c.Fabric, fabricBridge, netip.PrefixFrom(FabricGateway, FabricCIDR.Bits())); err != nil {
		return err
	}
	if c.ControlPlane, err = c.newNS("cp"); err != nil {
		return err
	}
	if err := c.fabric.AddServer(c.ControlPlane, "cp", uplink, APIServerIP); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	return nil
}

// addNode creates node i's namespace: fabric address, pod bridge, IPv4
// forwarding, default route to the fabric gateway, routes to the other
// nodes' pod subnets via their fabric addresses (added by routeNodes once
// every node exists), and its pods.
func (c *Cluster) addNode(i int) (*Node, error) {
	name := fmt.Sprintf("node-%d", i)
	ns, err := c.newNS(name)
	if err != nil {
		return nil, err
	}
	n := &Node{
		Name:       name,
		Index:      i,
		NS:         ns,
		IP:         NodeIP(i),
		PodCIDR:    NodePodCIDR(i),
		PodGateway: NodePodCIDR(i).Addr().Next(),
		c:          c,
	}
	n.nextPod = n.PodGateway.Next()
	if err := c.fabric.AddRouter(ns, fmt.Sprintf("n%d", i), uplink, n.IP); err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	if err := ns.AddBridge(podBridge, netip.PrefixFrom(n.PodGateway, n.PodCIDR.Bits())); err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	return n, nil
}

// routeNodes gives every node routes to the other nodes' pod subnets.
func (c *Cluster) routeNodes() error {
	for _, n := range c.Nodes {
		for _, m := range c.Nodes {
			if m == n {
				continue
			}
			if err := n.NS.AddRoute(m.PodCIDR, m.IP); err != nil {
				return err
			}
		}
	}
	return nil
}

// AddPod creates a pod namespace at the node's next free pod address
// (never reused) with a server answering with name on netlab.ServerPort,
// TCP and UDP. It does not touch the API: the harness puts its pods into
// the Services' EndpointSlices (SetEndpoints).
func (n *Node) AddPod(name string) (*Pod, error) {
	n.mu.Lock()
	ip := n.nextPod
	if !n.PodCIDR.Contains(ip.Next()) {
		n.mu.Unlock()
		return nil, fmt.Errorf("pod subnet %s of %s is full", n.PodCIDR, n.Name)
	}
	n.nextPod = ip.Next()
	n.links++
	link := fmt.Sprintf("vp%d", n.links)
	n.mu.Unlock()

	ns, err := n.c.newNS(name)
	if err != nil {
		return nil, err
	}
	p := &Pod{Name: name, Node: n, NS: ns, IP: ip, hostLink: link}
	steps := []func() error{
		func() error { return n.NS.AddVeth(link, ns, uplink) },
		func() error { return n.NS.SetMaster(link, podBridge) },
		func() error { return ns.AddAddr(uplink, netip.PrefixFrom(ip, n.PodCIDR.Bits())) },
		func() error { return ns.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), n.PodGateway) },
		func() (err error) { p.server, err = netlab.StartServer(ns, name, netlab.ServerPort); return err },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, fmt.Errorf("pod %s: %w", name, err)
		}
	}
	n.mu.Lock()
	n.Pods = append(n.Pods, p)
	n.mu.Unlock()
	n.c.mu.Lock()
	n.c.Pods = append(n.c.Pods, p)
	n.c.mu.Unlock()
	return p, nil
}

// AddClient creates a host on the fabric, outside the cluster, whose
// default route leads to node via: it reaches service IPs, pod IPs and
// (directly, on the fabric) every node's NodePorts.
func (c *Cluster) AddClient(name string, via *Node) (*Host, error) {
	c.mu.Lock()
	k := len(c.Clients) + 1
	c.mu.Unlock()
	if k > maxClients {
		return nil, fmt.Errorf("at most %d clients", maxClients)
	}
	ns, err := c.newNS(name)
	if err != nil {
		return nil, err
	}
	h := &Host{Name: name, NS: ns, IP: clientIP(k), Via: via}
	if err := c.fabric.AddHost(ns, fmt.Sprintf("h%d", k), uplink, h.IP, via.IP); err != nil {
		return nil, fmt.Errorf("client %s: %w", name, err)
	}
	c.mu.Lock()
	c.Clients = append(c.Clients, h)
	c.mu.Unlock()
	return h, nil
}

// Remove stops the pod's server and unplugs it from its node, so its
// address no longer answers (its namespace goes with the cluster). Later
// calls do nothing. It does not touch the API.
func (p *Pod) Remove() error {
	p.remove.Do(func() {
		p.server.Stop()
		p.removed = p.Node.NS.DeleteLink(p.hostLink)
	})
	return p.removed
}
