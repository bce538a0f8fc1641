// Package conntrack removes the connection-tracking entries of UDP
// services that no longer lead anywhere, and only those.
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
// It never flushes the table: every deleted entry matched one service
// frontend and one endpoint that is not serving it. TCP entries are never
// touched, so established TCP connections keep their NAT across syncs and
// mode switches.
package conntrack

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Frontends are a model's UDP service addresses with the endpoints that
// serve each.
type Frontends struct {
	// addrs maps service address:port to its serving endpoint addresses.
	addrs map[netip.AddrPort]map[netip.Addr]bool
	// nodePorts maps a NodePort to its serving endpoint addresses.
	nodePorts map[uint16]map[netip.Addr]bool
	// nodeIPs are the node's addresses NodePorts answer on.
	nodeIPs map[netip.Addr]bool
}

// Build collects the UDP frontends of one IP family of snap. nodeIPs are
// the addresses NodePorts answer on.
//
// A frontend belongs to one service port: the model's address claims
// (see model.Refusal) leave every external address another Service or the
// node owns out of the snapshot, so no two ports of it share an address
// and port. Should a snapshot not built by a model.Tracker hold such a
// pair anyway, the first port in name order keeps the frontend, never the
// one map order happens to visit last.
func Build(snap *model.Snapshot, family corev1.IPFamily, nodeIPs []netip.Addr) *Frontends {
	f := &Frontends{
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
		port := uint16(sp.Port)
		var addrs []netip.Addr
		if sp.ClusterIP.IsValid() {
			addrs = append(addrs, sp.ClusterIP)
		}
		addrs = append(addrs, sp.ExternalIPs...)
		addrs = append(addrs, sp.LoadBalancerIPs...)
		for _, a := range addrs {
			if key := netip.AddrPortFrom(a.Unmap(), port); f.addrs[key] == nil {
				f.addrs[key] = serving
			}
		}
		if np := uint16(sp.NodePort); np != 0 && f.nodePorts[np] == nil {
			f.nodePorts[np] = serving
		}
	}
	return f
}

// Empty says whether there is no UDP frontend at all.
func (f *Frontends) Empty() bool { return len(f.addrs) == 0 && len(f.nodePorts) == 0 }

// Flow is the part of a conntrack entry the decision needs.
type Flow struct {
	Protocol uint8
	// OrigDst is where the client sent the first packet.
	OrigDst netip.AddrPort
	// ReplySrc is where replies come from: the endpoint after DNAT, or
	// OrigDst's address when nothing translated it.
	ReplySrc netip.Addr
}

// Stale says whether a flow goes to one of the frontends but not to one
// of its serving endpoints.
func (f *Frontends) Stale(fl Flow) bool {
	if fl.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst := netip.AddrPortFrom(fl.OrigDst.Addr().Unmap(), fl.OrigDst.Port())
	reply := fl.ReplySrc.Unmap()
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
	return f.Stale(Flow{Protocol: flow.Forward.Protocol, OrigDst: netip.AddrPortFrom(dst, flow.Forward.DstPort), ReplySrc: reply})
}

// Reconciler deletes stale UDP entries in the node's namespace.
type Reconciler struct {
	// NS is the node's network namespace.
	NS nsexec.NS
	// NodeIPs are the addresses NodePorts answer on; when it returns none,
	// every address of the namespace is taken.
	NodeIPs func() []netip.Addr
}

// Reconcile deletes, in each family with UDP services, the entries Stale
// finds, and returns how many it deleted.
func (r *Reconciler) Reconcile(ctx context.Context, snap *model.Snapshot) (int, error) {
	if snap == nil || !hasUDP(snap) {
		return 0, nil
	}
	h, err := r.handle(unix.NETLINK_NETFILTER, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	var nodeIPs []netip.Addr
	if r.NodeIPs != nil {
		nodeIPs = r.NodeIPs()
	}
	if len(nodeIPs) == 0 {
		if nodeIPs, err = localAddrs(h); err != nil {
			return 0, err
		}
	}
	total := 0
	for _, fam := range []struct {
		ip corev1.IPFamily
		nl netlink.InetFamily
	}{{corev1.IPv4Protocol, unix.AF_INET}, {corev1.IPv6Protocol, unix.AF_INET6}} {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		f := Build(snap, fam.ip, nodeIPs)
		if f.Empty() {
			continue
		}
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam.nl, f)
		total += int(n)
		if err != nil {
			return total, fmt.Errorf("delete stale %s UDP conntrack entries: %w", fam.ip, err)
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

// HasUDPChange says whether a sync may have made UDP entries stale: it
// was full, or changed a UDP service port.
func HasUDPChange(changed model.ChangeSet, full bool) bool {
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
