package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// The lab's addresses, all inside 198.18.0.0/15.
var (
	// NodeIP is the node namespace's address (the Node's InternalIP).
	NodeIP = netip.MustParseAddr("198.18.0.1")
	// BackendsIP is the backends namespace's address on the same link.
	BackendsIP = netip.MustParseAddr("198.18.0.2")
	// EndpointCIDR holds every endpoint address; the backends namespace
	// answers on all of them. It is also the programs' cluster CIDR.
	EndpointCIDR = netip.MustParsePrefix("198.18.128.0/17")
	// ServiceCIDR is the API server's service range (testenv.ServiceCIDR).
	ServiceCIDR = netip.MustParsePrefix("198.19.0.0/16")
	// APIAdvertiseIP is where the API server says it is (the endpoint of
	// the default/kubernetes Service; testenv.LaunchAdvertising): each
	// node namespace holds it and relays its API port to the API server.
	APIAdvertiseIP = netip.MustParseAddr("198.18.127.254")
)

// EndpointPort is the port the backends answer on (the Services' target port).
const EndpointPort = 8080

// Namespace names carry the benchmark's pid ("psbench-<pid>-node"), so
// that a run (or the package's tests) never removes another live run's
// namespaces, only those of runs that died.
const (
	nsPrefix     = "psbench-"
	linkNode     = "bench0"
	linkBackends = "bench1"
)

// Lab is the backends namespace with its echo server; a Node is created
// per run on top of it.
type Lab struct {
	Backends *netlab.NetNS
	server   net.Listener
	wg       sync.WaitGroup
}

// NewLab removes namespaces a killed run left behind, creates the
// backends namespace with its AnyIP route and starts the echo server.
func NewLab() (*Lab, error) {
	netlab.SweepStale(nsPrefix, log.Printf)
	ns, err := netlab.CreateNetNS(netlab.OwnedName(nsPrefix, "backends"))
	if err != nil {
		return nil, err
	}
	l := &Lab{Backends: ns}
	if err := l.setup(); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Lab) setup() error {
	// Every address of EndpointCIDR is local here (a "local" route on lo):
	// one listener serves 32k endpoints without 32k addresses.
	err := l.anyIP(EndpointCIDR)
	if err != nil {
		return err
	}
	l.server, err = l.Backends.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", EndpointPort))
	if err != nil {
		return err
	}
	l.wg.Add(1)
	go l.serve()
	return nil
}

// RefuseServices makes every address of ServiceCIDR local in the
// backends namespace, where nothing listens on a service port: a
// connection that reaches the backends untranslated is refused at once
// instead of going nowhere (and timing out like one that was lost).
func (l *Lab) RefuseServices() error { return l.anyIP(ServiceCIDR) }

// anyIP makes every address of p local in the backends namespace (a
// "local" route on lo).
func (l *Lab) anyIP(p netip.Prefix) error {
	err := l.Backends.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{
			Type: unix.RTN_LOCAL, Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST,
			Dst: prefixNet(p), LinkIndex: lo.Attrs().Index,
		})
	})
	if err != nil {
		return fmt.Errorf("AnyIP route for %s in %s: %w", p, l.Backends.Name, err)
	}
	return nil
}

// serve answers each connection with the local address it reached, then
// closes it.
func (l *Lab) serve() {
	defer l.wg.Done()
	for {
		c, err := l.server.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			local := c.LocalAddr().(*net.TCPAddr).IP.String()
			_, _ = c.Write([]byte(local + "\n"))
		}()
	}
}

// Close stops the server and removes the backends namespace.
func (l *Lab) Close() error {
	if l.server != nil {
		_ = l.server.Close()
		l.wg.Wait()
	}
	return l.Backends.Delete()
}

// Node is the namespace one program runs in, wired to the backends and
// with relays to the API server on its loopback and on APIAdvertiseIP.
type Node struct {
	NS *netlab.NetNS
	// APIServer is the relay's address inside NS ("127.0.0.1:port").
	APIServer string
	relays    []*netlab.Forwarder
	lab       *Lab
}

// NewNode creates a fresh node namespace: a veth to the backends, a
// default route through them, and relays to apiServer (an address on the
// root namespace's loopback) from its loopback and from APIAdvertiseIP at
// apiServer's port.
func (l *Lab) NewNode(apiServer string) (*Node, error) {
	ns, err := netlab.CreateNetNS(netlab.OwnedName(nsPrefix, "node"))
	if err != nil {
		return nil, err
	}
	n := &Node{NS: ns, lab: l}
	if err := n.wire(l, apiServer); err != nil {
		_ = n.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) wire(l *Lab, apiServer string) error {
	if err := n.NS.AddVeth(linkNode, l.Backends, linkBackends); err != nil {
		return err
	}
	for _, s := range []struct {
		ns   *netlab.NetNS
		link string
		addr netip.Addr
	}{{n.NS, linkNode, NodeIP}, {l.Backends, linkBackends, BackendsIP}} {
		if err := s.ns.AddAddr(s.link, netip.PrefixFrom(s.addr, 24)); err != nil {
			return err
		}
		if err := s.ns.SetUp(s.link); err != nil {
			return err
		}
	}
	// Service and endpoint addresses leave through the backends; service
	// addresses no program has claimed yet go nowhere (the backends do
	// not forward), so a probe fails fast or times out.
	if err := n.NS.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), BackendsIP); err != nil {
		return err
	}
	ln, err := n.NS.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("API relay in %s: %w", n.NS.Name, err)
	}
	n.APIServer = ln.Addr().String()
	n.relays = append(n.relays, netlab.Forward(ln, apiServer, (&net.Dialer{}).DialContext))
	// The API server's advertised address, with its port: a program in
	// the namespace that dials the kubernetes Service reaches the API
	// server through it (the agent's probes during a switch do), as it
	// would in a cluster.
	if err := n.NS.AddAddr("lo", netip.PrefixFrom(APIAdvertiseIP, 32)); err != nil {
		return err
	}
	_, port, err := net.SplitHostPort(apiServer)
	if err != nil {
		return fmt.Errorf("API server address %q: %w", apiServer, err)
	}
	adv, err := n.NS.Listen("tcp4", net.JoinHostPort(APIAdvertiseIP.String(), port))
	if err != nil {
		return fmt.Errorf("API relay on the advertised address in %s: %w", n.NS.Name, err)
	}
	n.relays = append(n.relays, netlab.Forward(adv, apiServer, (&net.Dialer{}).DialContext))
	return nil
}

// Close stops the relays, removes the veth (at once: a namespace's links
// go only when the kernel gets round to freeing it) and the namespace.
func (n *Node) Close() error {
	for _, r := range n.relays {
		r.Close()
	}
	err := n.lab.Backends.DeleteLink(linkBackends)
	return errors.Join(err, n.NS.Delete())
}

// Ask connects from the node namespace to addr and returns the endpoint
// address the backend reports, and how long the TCP connect took.
func (n *Node) Ask(ctx context.Context, addr netip.AddrPort, timeout time.Duration) (netip.Addr, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	c, err := n.NS.DialContext(ctx, "tcp4", addr.String())
	connect := time.Since(start)
	if err != nil {
		return netip.Addr{}, connect, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.Addr{}, connect, fmt.Errorf("read from %s: %w", addr, err)
	}
	ep, err := netip.ParseAddr(strings.TrimSpace(line))
	return ep, connect, err
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
