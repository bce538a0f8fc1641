// Package conntrack removes the connection-tracking entries that lead
// nowhere because of when they were made, and only those: UDP entries of
// services whose endpoints changed, and TCP entries of connections that
// began before their service was programmed.
//
// UDP has no connection to close: a client that keeps sending to a
// service keeps matching the conntrack entry its first packet created, and
// so keeps going to the endpoint that entry NATed it to, even after that
// endpoint is gone (or, if the service had no endpoint then, untranslated
// to the service address). kube-proxy's conntrack reconciler fixes this
// after every sync by deleting, over netlink, the UDP entries whose
// original destination is a service address and port (cluster IP, external
// IP, load-balancer IP, or a NodePort on a node address) and whose reply
// source is not one of the service port's serving endpoints. This package
// does the same, and also when a service port has no serving endpoint left
// (kube-proxy skips those), so a client of a service that lost all its
// endpoints learns it at once instead of sending into a void.
//
// TCP has the same trap at a connection's start (kubernetes/kubernetes
// issues 48719 and 101607, which kube-proxy leaves open): a SYN sent to a
// service address before any rule translated it makes an untranslated
// entry, and every retransmission of that SYN follows it into the void
// (routed on as addressed) until it expires, 120 s after the last one;
// so does a later connection that happens to reuse the client's source
// port. So after a sync that began to serve a TCP service address (a new
// Service, a new external IP, a proxy's first sync on the node), the
// entries to that address and port that are still in SYN_SENT and were
// not translated are deleted: the next SYN makes a new entry, which the
// rules now translate. Such an entry never carried a connection, so
// nothing established is touched; every other TCP entry is left alone,
// and established connections keep their NAT across syncs and mode
// switches.
//
// It never flushes the table: every deleted entry matched one service
// frontend and one of the conditions above.
package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Frontends are the service addresses of one IP family whose entries
// can be stale: a model's UDP service addresses with the endpoints that
// serve each, and the TCP service addresses a sync began to serve.
type Frontends struct {
	family corev1.IPFamily
	// addrs maps UDP service address:port to its serving endpoint
	// addresses.
	addrs map[netip.AddrPort]map[netip.Addr]bool
	// nodePorts maps a UDP NodePort to its serving endpoint addresses.
	nodePorts map[uint16]map[netip.Addr]bool
	// nodeIPs are the node's addresses NodePorts answer on.
	nodeIPs map[netip.Addr]bool
	// newTCP are the TCP service addresses (with the port) the sync began
	// to serve.
	newTCP map[netip.AddrPort]bool
}

// Build collects the UDP frontends of one IP family of snap (none when
// snap is nil). nodeIPs are the addresses NodePorts answer on.
//
// A frontend belongs to one service port: the model's address claims
// (see model.Refusal) leave every external address another Service or the
// node owns out of the snapshot, so no two ports of it share an address
// and port. Should a snapshot not built by a model.Tracker hold such a
// pair anyway, the first port in name order keeps the frontend, never the
// one map order happens to visit last.
func Build(snap *model.Snapshot, family corev1.IPFamily, nodeIPs []netip.Addr) *Frontends {
	f := &Frontends{
		family:    family,
		addrs:     map[netip.AddrPort]map[netip.Addr]bool{},
		nodePorts: map[uint16]map[netip.Addr]bool{},
		nodeIPs:   map[netip.Addr]bool{},
	}
	for _, ip := range nodeIPs {
		f.nodeIPs[ip.Unmap()] = true
	}
	if snap == nil {
		return f
	}
	ports := snap.Ports[family]
	for _, name := range model.SortedNames(ports) {
		sp := ports[name]
		if sp.Protocol != corev1.ProtocolUDP {
			continue
		}
		serving := map[netip.Addr]bool{}
		for _, e := range sp.Endpoints {
			if e.Serving {
				serving[e.IP.Unmap()] = true
			}
		}
		for _, key := range frontendAddrs(sp) {
			if f.addrs[key] == nil {
				f.addrs[key] = serving
			}
		}
		if np := uint16(sp.NodePort); np != 0 && f.nodePorts[np] == nil {
			f.nodePorts[np] = serving
		}
	}
	return f
}

// newTCPFrontends returns the TCP service addresses (cluster, external
// and load-balancer IPs, each with the port) of family in snap that prev
// did not have: of every TCP port when all is set, else of the ports in
// changed. Every address of every port is new when prev is nil.
func newTCPFrontends(snap, prev *model.Snapshot, family corev1.IPFamily, changed model.ChangeSet, all bool) map[netip.AddrPort]bool {
	var out map[netip.AddrPort]bool
	all = all || prev == nil
	ports := snap.Ports[family]
	var before map[model.ServicePortName]*model.ServicePort
	if prev != nil {
		before = prev.Ports[family]
	}
	look := func(name model.ServicePortName, sp *model.ServicePort) {
		if sp.Protocol != corev1.ProtocolTCP {
			return
		}
		old := before[name]
		if old == sp { // snapshots share the ports that did not change
			return
		}
		var had []netip.AddrPort
		if old != nil {
			had = frontendAddrs(old)
		}
		for _, a := range frontendAddrs(sp) {
			if !slices.Contains(had, a) {
				if out == nil {
					out = map[netip.AddrPort]bool{}
				}
				out[a] = true
			}
		}
	}
	if all {
		for name, sp := range ports {
			look(name, sp)
		}
		return out
	}
	for name := range changed {
		if sp := ports[name]; sp != nil {
			look(name, sp)
		}
	}
	return out
}

// frontendAddrs lists a service port's addresses with its port: its
// cluster IP, external IPs and load-balancer IPs.
func frontendAddrs(sp *model.ServicePort) []netip.AddrPort {
	port := uint16(sp.Port)
	var out []netip.AddrPort
	if sp.ClusterIP.IsValid() {
		out = append(out, netip.AddrPortFrom(sp.ClusterIP.Unmap(), port))
	}
	for _, a := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		out = append(out, netip.AddrPortFrom(a.Unmap(), port))
	}
	return out
}

// Empty says whether there is no frontend at all.
func (f *Frontends) Empty() bool {
	return len(f.addrs) == 0 && len(f.nodePorts) == 0 && len(f.newTCP) == 0
}

// Flow is the part of a conntrack entry the decision needs.
type Flow struct {
	Protocol uint8
	// SynSent says that a TCP entry has seen its connection's SYN and
	// nothing since but retransmissions of it (conntrack's SYN_SENT).
	SynSent bool
	// OrigDst is where the client sent the first packet.
	OrigDst netip.AddrPort
	// ReplySrc is where replies come from: the endpoint after DNAT, or
	// OrigDst's address when nothing translated it.
	ReplySrc netip.Addr
}

// Stale says whether a UDP flow goes to one of the frontends but not to
// one of its serving endpoints, or a TCP flow is a connection attempt to
// one of the new TCP frontends that nothing translated.
func (f *Frontends) Stale(fl Flow) bool {
	dst := netip.AddrPortFrom(fl.OrigDst.Addr().Unmap(), fl.OrigDst.Port())
	reply := fl.ReplySrc.Unmap()
	switch fl.Protocol {
	case unix.IPPROTO_TCP:
		return fl.SynSent && reply == dst.Addr() && f.newTCP[dst]
	case unix.IPPROTO_UDP:
	default:
		return false
	}
	if serving, ok := f.addrs[dst]; ok && !serving[reply] {
		return true
	}
	if serving, ok := f.nodePorts[dst.Port()]; ok && f.nodeIPs[dst.Addr()] && !serving[reply] {
		return true
	}
	return false
}

// MatchConntrackFlow makes Frontends a netlink conntrack filter.
func (f *Frontends) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	dst, ok1 := netip.AddrFromSlice(flow.Forward.DstIP)
	reply, ok2 := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return false
	}
	tcp, _ := flow.ProtoInfo.(*netlink.ProtoInfoTCP)
	synSent := tcp != nil && tcp.State == tcpConntrackSynSent
	return f.Stale(Flow{Protocol: flow.Forward.Protocol, SynSent: synSent, OrigDst: netip.AddrPortFrom(dst, flow.Forward.DstPort), ReplySrc: reply})
}

// tcpConntrackSynSent is conntrack's TCP state SYN_SENT
// (TCP_CONNTRACK_SYN_SENT, include/uapi/linux/netfilter/nf_conntrack_tcp.h).
const tcpConntrackSynSent = 1

// Reconciler deletes stale entries in the node's namespace after each
// sync. It remembers the snapshot it last saw, to tell which TCP
// frontends a sync began to serve; calls must not overlap (the Fanout
// makes them under its lock).
type Reconciler struct {
	// NS is the node's network namespace.
	NS nsexec.NS
	// NodeIPs are the addresses NodePorts answer on; when it returns none,
	// every address of the namespace is taken.
	NodeIPs func() []netip.Addr

	// last is the snapshot of the last sync whose TCP frontends were
	// handled.
	last *model.Snapshot
}

// Reconcile deletes the entries Stale finds after a sync of snap that
// changed the ports in changed (every port when full), and returns how
// many it deleted. It reads the conntrack table only when that sync may
// have left some: it changed a UDP port, or began to serve a TCP address.
func (r *Reconciler) Reconcile(ctx context.Context, snap *model.Snapshot, changed model.ChangeSet, full bool) (int, error) {
	if snap == nil {
		return 0, nil
	}
	prev := r.last
	r.last = snap
	udp := hasUDPChange(changed, full) && hasUDP(snap) // the change set first: it is small, the model is not
	var nodeIPs []netip.Addr
	if r.NodeIPs != nil {
		nodeIPs = r.NodeIPs()
	}
	var todo []*Frontends
	for _, fam := range families {
		newTCP := newTCPFrontends(snap, prev, fam, changed, full)
		if !udp && len(newTCP) == 0 {
			continue // the common sync: nothing to build, nothing to read
		}
		udpSnap := snap
		if !udp {
			udpSnap = nil
		}
		f := Build(udpSnap, fam, nodeIPs)
		f.newTCP = newTCP
		if !f.Empty() {
			todo = append(todo, f)
		}
	}
	if len(todo) == 0 {
		return 0, nil
	}
	n, err := r.delete(ctx, todo, len(nodeIPs) == 0)
	if err != nil {
		// The next sync looks at these TCP frontends again.
		r.last = prev
	}
	return n, err
}

// families are the IP families Reconcile looks at, in order.
var families = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}

// delete deletes the entries each of todo finds stale, from one dump of
// its family's table; with localNodeIPs, NodePorts answer on every
// address of the namespace.
func (r *Reconciler) delete(ctx context.Context, todo []*Frontends, localNodeIPs bool) (int, error) {
	h, err := r.handle(unix.NETLINK_NETFILTER, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	if localNodeIPs {
		addrs, err := localAddrs(h)
		if err != nil {
			return 0, err
		}
		for _, f := range todo {
			for _, a := range addrs {
				f.nodeIPs[a] = true
			}
		}
	}
	total := 0
	for _, f := range todo {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		nl := netlink.InetFamily(unix.AF_INET)
		if f.family == corev1.IPv6Protocol {
			nl = unix.AF_INET6
		}
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, nl, f)
		total += int(n)
		if err != nil {
			return total, fmt.Errorf("delete stale %s conntrack entries: %w", f.family, err)
		}
	}
	return total, nil
}

func (r *Reconciler) handle(families ...int) (*netlink.Handle, error) {
	if h, ok := r.NS.Handle(); ok {
		return netlink.NewHandleAt(h, families...)
	}
	return netlink.NewHandle(families...)
}

func hasUDP(snap *model.Snapshot) bool {
	for _, ports := range snap.Ports {
		for _, sp := range ports {
			if sp.Protocol == corev1.ProtocolUDP {
				return true
			}
		}
	}
	return false
}

// hasUDPChange says whether a sync may have made UDP entries stale: it
// was full, or changed a UDP service port.
func hasUDPChange(changed model.ChangeSet, full bool) bool {
	if full {
		return true
	}
	for n := range changed {
		if n.Protocol == corev1.ProtocolUDP {
			return true
		}
	}
	return false
}

func localAddrs(h *netlink.Handle) ([]netip.Addr, error) {
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a.IP == nil || a.IP.IsLoopback() || a.IP.IsLinkLocalUnicast() {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
