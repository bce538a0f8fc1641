package dataplane

// The per-service-port decisions every backend makes alike, made here once.
//
// A backend's rendering answers two different questions: what should
// happen to a packet (which endpoints serve it, whether it is
// masqueraded, dropped or refused) and how to say that in its kernel
// interface (verdict maps, chains of iptables rules, IPVS virtual
// servers). NodePolicy and PortPolicy answer the first question, in
// plain data with no syntax in it, so that the three dataplanes cannot
// drift apart on it and the decisions are tested once, table-driven.

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// NodePolicy is the node's configuration as it applies to the rules of one
// IP family. Build it once per family with NewNodePolicy; PortPolicy then
// decides each service port of that family.
type NodePolicy struct {
	// Family is the IP family the policy is for.
	Family corev1.IPFamily
	// NodePortIPs are the family's NodeConfig.NodeIPs NodePorts answer on:
	// unmapped, without loopback addresses, sorted, without duplicates.
	// Empty with NodePortsAnyLocal false means that NodePorts answer on no
	// address of this family.
	NodePortIPs []netip.Addr
	// NodePortsAnyLocal says NodeConfig.NodeIPs is empty, so NodePorts
	// answer on every local address of the node except Loopback.
	NodePortsAnyLocal bool
	// PrimaryIP is the family's NodeConfig.PrimaryIPs, unmapped; invalid
	// when it is not known.
	PrimaryIP netip.Addr
	// Loopback is the family's loopback range. NodePorts do not answer on
	// it unless LocalhostNodePorts: a packet to it cannot be DNATed to
	// another host without the route_localnet sysctl, so kube-proxy's
	// nftables and IPVS modes leave it alone, and so do ours.
	Loopback netip.Prefix
	// LocalhostNodePorts says NodePorts also answer on Loopback, for
	// clients on the node (kube-proxy's iptables.localhostNodePorts).
	// Only the iptables backend sets it, with ServeLoopbackNodePorts.
	LocalhostNodePorts bool
	// ClusterCIDRs are the family's pod networks: masked, sorted, and
	// without any prefix another one contains (nftables interval sets
	// refuse overlaps; other backends lose nothing).
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// MasqueradeMark is the packet mark bit (1 << NodeConfig.MasqueradeBit)
	// that flags a packet for masquerading at postrouting.
	MasqueradeMark uint32
}

// NewNodePolicy returns the part of cfg that applies to family.
func NewNodePolicy(cfg NodeConfig, family corev1.IPFamily) NodePolicy {
	n := NodePolicy{
		Family:            family,
		NodePortsAnyLocal: len(cfg.NodeIPs) == 0,
		Loopback:          netip.MustParsePrefix("127.0.0.0/8"),
		MasqueradeAll:     cfg.MasqueradeAll,
		MasqueradeMark:    1 << uint(cfg.MasqueradeBit),
	}
	if family == corev1.IPv6Protocol {
		n.Loopback = netip.MustParsePrefix("::1/128")
	}
	for _, ip := range cfg.NodeIPs {
		if n.InFamily(ip) && !n.Loopback.Contains(ip.Unmap()) {
			n.NodePortIPs = append(n.NodePortIPs, ip.Unmap())
		}
	}
	if i := slices.IndexFunc(cfg.PrimaryIPs, n.InFamily); i >= 0 {
		n.PrimaryIP = cfg.PrimaryIPs[i].Unmap()
	}
	slices.SortFunc(n.NodePortIPs, netip.Addr.Compare)
	n.NodePortIPs = slices.Compact(n.NodePortIPs)

	var ps []netip.Prefix
	for _, p := range cfg.ClusterCIDRs {
		if p, ok := model.UnmapPrefix(p); ok && n.InFamily(p.Addr()) {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	for _, p := range ps {
		if len(n.ClusterCIDRs) == 0 || !n.ClusterCIDRs[len(n.ClusterCIDRs)-1].Contains(p.Addr()) {
			n.ClusterCIDRs = append(n.ClusterCIDRs, p)
		}
	}
	return n
}

// ServeLoopbackNodePorts makes NodePorts answer on the IPv4 loopback
// range too, as kube-proxy's iptables mode does with localhostNodePorts
// (which needs the route_localnet sysctl): when they answer on every
// local address, or when cfg's NodeIPs (nodePortAddresses) hold a
// loopback address, which then joins NodePortIPs. For IPv6 it does
// nothing: no mode of kube-proxy serves NodePorts on ::1, the kernel
// having no route_localnet for IPv6. It reports whether it did.
func (n *NodePolicy) ServeLoopbackNodePorts(cfg NodeConfig) bool {
	if n.Family != corev1.IPv4Protocol {
		return false
	}
	for _, ip := range cfg.NodeIPs {
		if ip := ip.Unmap(); ip.Is4() && n.Loopback.Contains(ip) && !slices.Contains(n.NodePortIPs, ip) {
			n.NodePortIPs = append(n.NodePortIPs, ip)
		}
	}
	slices.SortFunc(n.NodePortIPs, netip.Addr.Compare)
	n.LocalhostNodePorts = n.NodePortsAnyLocal || slices.ContainsFunc(n.NodePortIPs, n.Loopback.Contains)
	return n.LocalhostNodePorts
}

// InFamily says whether addr is a valid address of the policy's family
// (IPv4-mapped IPv6 addresses count as IPv4).
func (n *NodePolicy) InFamily(addr netip.Addr) bool {
	return addr.IsValid() && addr.Unmap().Is4() == (n.Family == corev1.IPv4Protocol)
}

// HasNodePorts says whether NodePorts answer on any address of the family.
func (n *NodePolicy) HasNodePorts() bool {
	return n.NodePortsAnyLocal || len(n.NodePortIPs) > 0
}

// Target is where the first packet of a connection goes.
type Target int

// The targets. TargetCluster and TargetLocal DNAT to one endpoint chosen at
// random (after ClientIP affinity) from PortPolicy.Cluster or
// PortPolicy.Local.
const (
	// TargetCluster chooses among PortPolicy.Cluster.
	TargetCluster Target = iota + 1
	// TargetLocal chooses among PortPolicy.Local.
	TargetLocal
	// TargetDrop drops the packet without an answer: the service has
	// endpoints, none this traffic may use.
	TargetDrop
	// TargetReject refuses the connection at once (a TCP reset, an ICMP
	// port unreachable for other protocols): the service has no endpoint.
	TargetReject
)

// String names the target.
func (t Target) String() string {
	switch t {
	case TargetCluster:
		return "cluster"
	case TargetLocal:
		return "local"
	case TargetDrop:
		return "drop"
	case TargetReject:
		return "reject"
	}
	return "invalid"
}

// Masquerade says which packets to a cluster IP are masqueraded.
type Masquerade int

// The masquerade choices for cluster-IP traffic.
const (
	// MasqueradeNone masquerades no cluster-IP traffic: no cluster CIDRs
	// are configured to tell pods from the rest.
	MasqueradeNone Masquerade = iota
	// MasqueradeAll masquerades all of it (NodeConfig.MasqueradeAll).
	MasqueradeAll
	// MasqueradeOutsideClusterCIDRs masquerades packets whose source is
	// outside NodePolicy.ClusterCIDRs: a client routed to the service range
	// through this node must get its replies through this node too.
	MasqueradeOutsideClusterCIDRs
)

// Source is a class of packet sources an ExternalRule matches.
type Source int

// The source classes.
const (
	// SourceAny matches every packet.
	SourceAny Source = iota
	// SourceClusterCIDRs matches sources in NodePolicy.ClusterCIDRs.
	SourceClusterCIDRs
	// SourceNode matches sources that are local addresses of the node.
	SourceNode
)

// ExternalRule is one step of the handling of traffic to a service port's
// external destinations (node port, external IPs, load-balancer IPs).
type ExternalRule struct {
	// From is the sources the rule applies to.
	From Source
	// Masquerade marks the matching packets for masquerading.
	Masquerade bool
	// To is TargetCluster, TargetLocal or TargetDrop.
	To Target
}

// Firewall restricts the sources that may reach load-balancer IPs
// (loadBalancerSourceRanges). It is checked before any NAT, on the
// address the client used; sources it does not allow are dropped.
type Firewall struct {
	// IPs are the load-balancer IPs of the family it guards, with the
	// port.
	IPs []netip.Addr
	// SourceRanges are the allowed source ranges of the family.
	SourceRanges []netip.Prefix
	// AllowIPs also allows packets whose source is one of IPs. It is set
	// when a range holds NodePolicy.PrimaryIP, as in kube-proxy (whatever
	// nodePortAddresses says): a load balancer that delivers its VIP
	// locally makes this node's own requests to the VIP arrive from the
	// VIP.
	AllowIPs bool
}

// PortPolicy is what happens to traffic to one service port, in one IP
// family. Beyond its fields, every backend also does the following for
// every endpoint it programs: a packet whose source is the endpoint
// itself (a pod reaching its own service and landing on itself, "hairpin")
// is marked for masquerading, so that the reply goes back through the
// node; and with ClientIP affinity (ServicePort.AffinityTimeout) a client
// goes back to the endpoint it last reached within the timeout, before
// any random choice.
type PortPolicy struct {
	// ClusterIP is the port's cluster IP; invalid when it is not of the
	// family.
	ClusterIP netip.Addr
	// Internal is the target of traffic to ClusterIP: TargetCluster, or
	// TargetLocal under internalTrafficPolicy Local; TargetDrop under
	// internalTrafficPolicy Local with endpoints on other nodes only;
	// TargetReject without any endpoint.
	Internal Target
	// InternalMasquerade says which packets to ClusterIP are masqueraded.
	// It applies where Internal's endpoint is chosen (matching the
	// destination ClusterIP, since external traffic may get there too),
	// and is MasqueradeNone unless Internal is TargetCluster or
	// TargetLocal.
	InternalMasquerade Masquerade

	// ExternalAddrs are the port's external IPs, then its load-balancer
	// IPs, of the family.
	ExternalAddrs []netip.Addr
	// NodePort is the port's node port, 0 if none. It answers on
	// NodePolicy's addresses (if HasNodePorts).
	NodePort int32
	// ExternalReject says the port has external destinations but no
	// endpoint at all: connections to them are refused, as with
	// TargetReject, and External is empty.
	ExternalReject bool
	// External decides traffic to ExternalAddrs and NodePort: the first
	// rule whose From matches the source applies. Empty when the port
	// has no external destination or ExternalReject is set.
	//
	// Under externalTrafficPolicy Cluster it is one rule: masquerade (the
	// endpoint may be on another node; the reply must come back through
	// this one) and TargetCluster. Under Local the client's address is
	// kept and only this node's endpoints are used, except for pods and
	// the node itself, which are not "external": they go to any endpoint,
	// as if they had gone out to the load balancer and come back in.
	// Pods (SourceClusterCIDRs, when cluster CIDRs are configured) keep
	// their address; the node (SourceNode) is masqueraded so that the
	// reply comes back to it; everyone else (SourceAny) goes to
	// TargetLocal, or to TargetDrop when this node has no endpoint, so
	// that the load balancer's health check fails here too and traffic
	// moves to nodes that have one.
	External []ExternalRule
	// Firewall, if not nil, guards the load-balancer IPs.
	Firewall *Firewall

	// Cluster are the endpoints TargetCluster chooses among (the ready
	// ones, or if none is ready the serving terminating ones, from every
	// node); nil when no target is TargetCluster.
	Cluster []model.Endpoint
	// Local are the endpoints TargetLocal chooses among (the same rule
	// applied to this node's endpoints only); nil when no target is
	// TargetLocal.
	Local []model.Endpoint
}

// PortPolicy decides the handling of traffic to sp, a service port of the
// policy's family. It is pure: the same input always gives the same
// result.
func (n *NodePolicy) PortPolicy(sp *model.ServicePort) PortPolicy {
	var p PortPolicy
	cluster := sp.ClusterEndpoints()
	local := sp.LocalEndpoints()
	hasEndpoints := len(cluster) > 0

	if n.InFamily(sp.ClusterIP) {
		p.ClusterIP = sp.ClusterIP.Unmap()
	}
	switch {
	case !hasEndpoints:
		p.Internal = TargetReject
	case !sp.InternalPolicyLocal:
		p.Internal = TargetCluster
	case len(local) > 0:
		p.Internal = TargetLocal
	default:
		p.Internal = TargetDrop
	}
	if p.Internal == TargetCluster || p.Internal == TargetLocal {
		switch {
		case n.MasqueradeAll:
			p.InternalMasquerade = MasqueradeAll
		case len(n.ClusterCIDRs) > 0:
			p.InternalMasquerade = MasqueradeOutsideClusterCIDRs
		}
	}

	for _, addrs := range [][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, a := range addrs {
			if n.InFamily(a) {
				p.ExternalAddrs = append(p.ExternalAddrs, a.Unmap())
			}
		}
	}
	p.NodePort = sp.NodePort
	switch {
	case len(p.ExternalAddrs) == 0 && p.NodePort == 0:
	case !hasEndpoints:
		p.ExternalReject = true
	case !sp.ExternalPolicyLocal:
		p.External = []ExternalRule{{From: SourceAny, Masquerade: true, To: TargetCluster}}
	default:
		if len(n.ClusterCIDRs) > 0 {
			p.External = append(p.External, ExternalRule{From: SourceClusterCIDRs, To: TargetCluster})
		}
		last := ExternalRule{From: SourceAny, To: TargetDrop}
		if len(local) > 0 {
			last.To = TargetLocal
		}
		p.External = append(p.External, ExternalRule{From: SourceNode, Masquerade: true, To: TargetCluster}, last)
	}

	p.Firewall = n.firewall(sp)

	uses := func(t Target) bool {
		return p.Internal == t || slices.ContainsFunc(p.External, func(r ExternalRule) bool { return r.To == t })
	}
	if uses(TargetCluster) {
		p.Cluster = cluster
	}
	if uses(TargetLocal) {
		p.Local = local
	}
	return p
}

// firewall returns the firewall of sp's load-balancer IPs, nil if they
// have no source ranges.
func (n *NodePolicy) firewall(sp *model.ServicePort) *Firewall {
	if len(sp.LoadBalancerIPs) == 0 || len(sp.LoadBalancerSourceRanges) == 0 {
		return nil
	}
	fw := &Firewall{}
	for _, ip := range sp.LoadBalancerIPs {
		if n.InFamily(ip) {
			fw.IPs = append(fw.IPs, ip.Unmap())
		}
	}
	for _, r := range sp.LoadBalancerSourceRanges {
		if r, ok := model.UnmapPrefix(r); ok && n.InFamily(r.Addr()) {
			fw.SourceRanges = append(fw.SourceRanges, r)
			fw.AllowIPs = fw.AllowIPs || r.Contains(n.PrimaryIP)
		}
	}
	if len(fw.IPs) == 0 || len(fw.SourceRanges) == 0 {
		return nil
	}
	return fw
}

// Endpoints returns every endpoint the policy programs: Cluster, then those
// of Local not already among them, each once. When one of the two is
// empty it is the other, not a copy: read it, never write it.
func (p *PortPolicy) Endpoints() []model.Endpoint {
	switch {
	case len(p.Local) == 0:
		return p.Cluster
	case len(p.Cluster) == 0:
		return p.Local
	}
	out := slices.Clone(p.Cluster)
	seen := make(map[netip.AddrPort]bool, len(out))
	for _, e := range out {
		seen[netip.AddrPortFrom(e.IP, uint16(e.Port))] = true
	}
	for _, e := range p.Local {
		if key := netip.AddrPortFrom(e.IP, uint16(e.Port)); !seen[key] {
			seen[key] = true
			out = append(out, e)
		}
	}
	return out
}
