package dataplane

import (
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

var (
	a = netip.MustParseAddr
	p = netip.MustParsePrefix
)

func TestNewNodePolicy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    NodeConfig
		family corev1.IPFamily
		want   NodePolicy
	}{
		{
			name: "no node IPs: NodePorts on any local address",
			cfg:  NodeConfig{MasqueradeBit: 14},
			want: NodePolicy{Family: corev1.IPv4Protocol, NodePortsAnyLocal: true, Loopback: p("127.0.0.0/8"), MasqueradeMark: 0x4000},
		},
		{
			name: "node IPs of the family, unmapped, sorted, without loopback and duplicates",
			cfg: NodeConfig{NodeIPs: []netip.Addr{a("192.168.1.20"), a("2001:db8::1"), a("127.0.0.1"), a("::ffff:192.168.1.10"), a("192.168.1.20")},
				MasqueradeBit: 0},
			want: NodePolicy{Family: corev1.IPv4Protocol, NodePortIPs: []netip.Addr{a("192.168.1.10"), a("192.168.1.20")},
				Loopback: p("127.0.0.0/8"), MasqueradeMark: 1},
		},
		{
			name:   "node IPs of another family only: no NodePorts",
			cfg:    NodeConfig{NodeIPs: []netip.Addr{a("192.168.1.20"), a("::1")}, MasqueradeBit: 31},
			family: corev1.IPv6Protocol,
			want:   NodePolicy{Family: corev1.IPv6Protocol, Loopback: p("::1/128"), MasqueradeMark: 1 << 31},
		},
		{
			name:   "the primary IP of the family, unmapped",
			cfg:    NodeConfig{PrimaryIPs: []netip.Addr{a("2001:db8::1"), a("::ffff:192.168.1.10")}},
			family: corev1.IPv4Protocol,
			want: NodePolicy{Family: corev1.IPv4Protocol, NodePortsAnyLocal: true, PrimaryIP: a("192.168.1.10"),
				Loopback: p("127.0.0.0/8"), MasqueradeMark: 1},
		},
		{
			name: "cluster CIDRs masked, sorted, contained ones dropped",
			cfg: NodeConfig{ClusterCIDRs: []netip.Prefix{p("10.245.0.0/16"), p("10.244.1.7/24"), p("fd00::/56"), p("10.244.0.0/16"), {}},
				MasqueradeAll: true, MasqueradeBit: 14},
			want: NodePolicy{Family: corev1.IPv4Protocol, NodePortsAnyLocal: true, Loopback: p("127.0.0.0/8"),
				ClusterCIDRs: []netip.Prefix{p("10.244.0.0/16"), p("10.245.0.0/16")}, MasqueradeAll: true, MasqueradeMark: 0x4000},
		},
		{
			// Agents refuse such CIDRs at every entry; should one get
			// here all the same, it means its IPv4 network (or nothing,
			// when it reaches outside ::ffff:0:0/96), never a prefix
			// longer than the family's addresses, which renders as garbage
			// or panics.
			name: "IPv4-mapped cluster CIDRs read as IPv4",
			cfg:  NodeConfig{ClusterCIDRs: []netip.Prefix{p("::ffff:10.0.0.0/104"), p("::ffff:0:0/95"), p("::ffff:198.18.0.0/112")}},
			want: NodePolicy{Family: corev1.IPv4Protocol, NodePortsAnyLocal: true, Loopback: p("127.0.0.0/8"),
				ClusterCIDRs: []netip.Prefix{p("10.0.0.0/8"), p("198.18.0.0/16")}, MasqueradeMark: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fam := tc.family
			if fam == "" {
				fam = corev1.IPv4Protocol
			}
			got := NewNodePolicy(tc.cfg, fam)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("NewNodePolicy:\n got %+v\nwant %+v", got, tc.want)
			}
			if got.HasNodePorts() != (tc.want.NodePortsAnyLocal || len(tc.want.NodePortIPs) > 0) {
				t.Errorf("HasNodePorts() = %v", got.HasNodePorts())
			}
		})
	}
}

// Endpoints for the port policy tests: remote and local, ready and
// terminating.
var (
	remote      = model.Endpoint{IP: a("10.244.2.2"), Port: 80, Ready: true, Serving: true}
	remote2     = model.Endpoint{IP: a("10.244.2.3"), Port: 80, Ready: true, Serving: true}
	here        = model.Endpoint{IP: a("10.244.1.2"), Port: 80, Ready: true, Serving: true, IsLocal: true}
	draining    = model.Endpoint{IP: a("10.244.2.4"), Port: 80, Serving: true, Terminating: true}
	notServing  = model.Endpoint{IP: a("10.244.2.5"), Port: 80, Terminating: true}
	hereDrained = model.Endpoint{IP: a("10.244.1.3"), Port: 80, Serving: true, Terminating: true, IsLocal: true}
)

func TestPortPolicy(t *testing.T) {
	node := NodeConfig{
		NodeName:      "node-a",
		NodeIPs:       []netip.Addr{a("192.168.1.10")},
		PrimaryIPs:    []netip.Addr{a("192.168.1.10"), a("2001:db8::10")},
		ClusterCIDRs:  []netip.Prefix{p("10.244.0.0/16")},
		MasqueradeBit: 14,
	}
	noCIDRs := node
	noCIDRs.ClusterCIDRs = nil
	masqAll := node
	masqAll.MasqueradeAll = true
	anyLocal := node
	anyLocal.NodeIPs = nil
	// secondNodePortIP answers NodePorts on an address that is not the
	// node's primary one.
	secondNodePortIP := node
	secondNodePortIP.NodeIPs = []netip.Addr{a("192.168.1.10"), a("192.168.2.10")}
	primaryUnknown := node
	primaryUnknown.PrimaryIPs = nil

	cip := a("10.96.0.10")
	port := func(opts ...func(*model.ServicePort)) *model.ServicePort {
		sp := &model.ServicePort{Family: corev1.IPv4Protocol, ClusterIP: cip, Protocol: corev1.ProtocolTCP, Port: 80}
		for _, o := range opts {
			o(sp)
		}
		return sp
	}
	eps := func(es ...model.Endpoint) func(*model.ServicePort) {
		return func(sp *model.ServicePort) { sp.Endpoints = es }
	}
	nodePort := func(sp *model.ServicePort) { sp.NodePort = 30080 }
	extIP := func(sp *model.ServicePort) { sp.ExternalIPs = []netip.Addr{a("198.18.50.5"), a("2001:db8::5")} }
	lbIP := func(sp *model.ServicePort) { sp.LoadBalancerIPs = []netip.Addr{a("198.18.100.1"), a("2001:db8::100")} }
	ranges := func(rs ...string) func(*model.ServicePort) {
		return func(sp *model.ServicePort) {
			for _, r := range rs {
				sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, p(r))
			}
		}
	}
	itpLocal := func(sp *model.ServicePort) { sp.InternalPolicyLocal = true }
	etpLocal := func(sp *model.ServicePort) { sp.ExternalPolicyLocal = true }

	etpCluster := []ExternalRule{{From: SourceAny, Masquerade: true, To: TargetCluster}}
	outside := MasqueradeOutsideClusterCIDRs

	for _, tc := range []struct {
		name string
		cfg  NodeConfig
		sp   *model.ServicePort
		want PortPolicy
	}{
		{
			name: "cluster IP: any ready endpoint, masquerade from outside the pod networks",
			cfg:  node,
			sp:   port(eps(remote, here, draining)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside, Cluster: []model.Endpoint{remote, here}},
		},
		{
			name: "no cluster CIDRs: no masquerade",
			cfg:  noCIDRs,
			sp:   port(eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, Cluster: []model.Endpoint{remote}},
		},
		{
			name: "MasqueradeAll",
			cfg:  masqAll,
			sp:   port(eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: MasqueradeAll, Cluster: []model.Endpoint{remote}},
		},
		{
			name: "terminating fallback: serving terminating endpoints when none is ready",
			cfg:  node,
			sp:   port(eps(draining, notServing)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside, Cluster: []model.Endpoint{draining}},
		},
		{
			name: "no endpoints: reject everywhere",
			cfg:  node,
			sp:   port(eps(notServing), nodePort, extIP, lbIP),
			want: PortPolicy{ClusterIP: cip, Internal: TargetReject, NodePort: 30080, ExternalReject: true,
				ExternalAddrs: []netip.Addr{a("198.18.50.5"), a("198.18.100.1")}},
		},
		{
			name: "no endpoints and no external destinations",
			cfg:  node,
			sp:   port(),
			want: PortPolicy{ClusterIP: cip, Internal: TargetReject},
		},
		{
			name: "internalTrafficPolicy Local with a local endpoint",
			cfg:  node,
			sp:   port(itpLocal, eps(remote, here)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetLocal, InternalMasquerade: outside, Local: []model.Endpoint{here}},
		},
		{
			name: "internalTrafficPolicy Local without local endpoints: drop",
			cfg:  node,
			sp:   port(itpLocal, eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetDrop},
		},
		{
			name: "internalTrafficPolicy Local without local endpoints, node port under Cluster policy",
			cfg:  node,
			sp:   port(itpLocal, nodePort, eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetDrop, NodePort: 30080, External: etpCluster, Cluster: []model.Endpoint{remote}},
		},
		{
			name: "internalTrafficPolicy Local falls back to local terminating endpoints",
			cfg:  node,
			sp:   port(itpLocal, eps(remote, hereDrained)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetLocal, InternalMasquerade: outside, Local: []model.Endpoint{hereDrained}},
		},
		{
			name: "externalTrafficPolicy Cluster: masquerade, any endpoint; addresses of the family only",
			cfg:  node,
			sp:   port(nodePort, extIP, lbIP, eps(remote, here)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside, NodePort: 30080,
				ExternalAddrs: []netip.Addr{a("198.18.50.5"), a("198.18.100.1")}, External: etpCluster,
				Cluster: []model.Endpoint{remote, here}},
		},
		{
			name: "externalTrafficPolicy Local: pods and the node to any endpoint, others local",
			cfg:  node,
			sp:   port(nodePort, etpLocal, eps(remote, here)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside, NodePort: 30080,
				External: []ExternalRule{
					{From: SourceClusterCIDRs, To: TargetCluster},
					{From: SourceNode, Masquerade: true, To: TargetCluster},
					{From: SourceAny, To: TargetLocal},
				},
				Cluster: []model.Endpoint{remote, here}, Local: []model.Endpoint{here}},
		},
		{
			name: "externalTrafficPolicy Local without local endpoints: others dropped",
			cfg:  node,
			sp:   port(nodePort, etpLocal, eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside, NodePort: 30080,
				External: []ExternalRule{
					{From: SourceClusterCIDRs, To: TargetCluster},
					{From: SourceNode, Masquerade: true, To: TargetCluster},
					{From: SourceAny, To: TargetDrop},
				},
				Cluster: []model.Endpoint{remote}},
		},
		{
			name: "externalTrafficPolicy Local without cluster CIDRs: no pod rule",
			cfg:  noCIDRs,
			sp:   port(nodePort, etpLocal, eps(here)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, NodePort: 30080,
				External: []ExternalRule{
					{From: SourceNode, Masquerade: true, To: TargetCluster},
					{From: SourceAny, To: TargetLocal},
				},
				Cluster: []model.Endpoint{here}, Local: []model.Endpoint{here}},
		},
		{
			name: "both traffic policies Local",
			cfg:  node,
			sp:   port(nodePort, etpLocal, itpLocal, eps(remote, here)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetLocal, InternalMasquerade: outside, NodePort: 30080,
				External: []ExternalRule{
					{From: SourceClusterCIDRs, To: TargetCluster},
					{From: SourceNode, Masquerade: true, To: TargetCluster},
					{From: SourceAny, To: TargetLocal},
				},
				Cluster: []model.Endpoint{remote, here}, Local: []model.Endpoint{here}},
		},
		{
			name: "source ranges holding no node IP",
			cfg:  node,
			sp:   port(lbIP, ranges("203.0.113.0/24", "2001:db8:1::/48"), eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside,
				ExternalAddrs: []netip.Addr{a("198.18.100.1")}, External: etpCluster,
				Firewall: &Firewall{IPs: []netip.Addr{a("198.18.100.1")}, SourceRanges: []netip.Prefix{p("203.0.113.0/24")}},
				Cluster:  []model.Endpoint{remote}},
		},
		{
			name: "source range holding the node's primary IP allows the load-balancer IPs as sources",
			cfg:  node,
			sp:   port(lbIP, ranges("203.0.113.0/24", "192.168.1.0/24"), eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside,
				ExternalAddrs: []netip.Addr{a("198.18.100.1")}, External: etpCluster,
				Firewall: &Firewall{IPs: []netip.Addr{a("198.18.100.1")}, SourceRanges: []netip.Prefix{p("203.0.113.0/24"), p("192.168.1.0/24")}, AllowIPs: true},
				Cluster:  []model.Endpoint{remote}},
		},
		{
			// The default nodePortAddresses: kube-proxy knows its node IP
			// all the same, and so does the agent.
			name: "source range holding the primary IP with NodePorts on any local address allows the load-balancer IPs",
			cfg:  anyLocal,
			sp:   port(lbIP, ranges("192.168.1.0/24"), eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside,
				ExternalAddrs: []netip.Addr{a("198.18.100.1")}, External: etpCluster,
				Firewall: &Firewall{IPs: []netip.Addr{a("198.18.100.1")}, SourceRanges: []netip.Prefix{p("192.168.1.0/24")}, AllowIPs: true},
				Cluster:  []model.Endpoint{remote}},
		},
		{
			// kube-proxy looks at its node IP alone, never at
			// nodePortAddresses.
			name: "source range holding a NodePort address that is not the primary IP",
			cfg:  secondNodePortIP,
			sp:   port(lbIP, ranges("192.168.2.0/24"), eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside,
				ExternalAddrs: []netip.Addr{a("198.18.100.1")}, External: etpCluster,
				Firewall: &Firewall{IPs: []netip.Addr{a("198.18.100.1")}, SourceRanges: []netip.Prefix{p("192.168.2.0/24")}},
				Cluster:  []model.Endpoint{remote}},
		},
		{
			name: "source ranges with the primary IP unknown",
			cfg:  primaryUnknown,
			sp:   port(lbIP, ranges("192.168.1.0/24"), eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside,
				ExternalAddrs: []netip.Addr{a("198.18.100.1")}, External: etpCluster,
				Firewall: &Firewall{IPs: []netip.Addr{a("198.18.100.1")}, SourceRanges: []netip.Prefix{p("192.168.1.0/24")}},
				Cluster:  []model.Endpoint{remote}},
		},
		{
			name: "source ranges guard load-balancer IPs only",
			cfg:  node,
			sp:   port(extIP, ranges("203.0.113.0/24"), eps(remote)),
			want: PortPolicy{ClusterIP: cip, Internal: TargetCluster, InternalMasquerade: outside,
				ExternalAddrs: []netip.Addr{a("198.18.50.5")}, External: etpCluster, Cluster: []model.Endpoint{remote}},
		},
		{
			name: "firewall without endpoints",
			cfg:  node,
			sp:   port(lbIP, ranges("203.0.113.0/24")),
			want: PortPolicy{ClusterIP: cip, Internal: TargetReject, ExternalReject: true, ExternalAddrs: []netip.Addr{a("198.18.100.1")},
				Firewall: &Firewall{IPs: []netip.Addr{a("198.18.100.1")}, SourceRanges: []netip.Prefix{p("203.0.113.0/24")}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			np := NewNodePolicy(tc.cfg, corev1.IPv4Protocol)
			got := np.PortPolicy(tc.sp)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("PortPolicy:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestPortPolicyOtherFamily(t *testing.T) {
	np := NewNodePolicy(NodeConfig{}, corev1.IPv6Protocol)
	sp := &model.ServicePort{ClusterIP: a("10.96.0.10"), Port: 80, Endpoints: []model.Endpoint{remote}}
	if got := np.PortPolicy(sp); got.ClusterIP.IsValid() {
		t.Errorf("IPv6 policy of an IPv4 port has cluster IP %s", got.ClusterIP)
	}
}

func TestEndpoints(t *testing.T) {
	pol := PortPolicy{Cluster: []model.Endpoint{remote, here}, Local: []model.Endpoint{here, hereDrained}}
	want := []model.Endpoint{remote, here, hereDrained}
	if got := pol.Endpoints(); !reflect.DeepEqual(got, want) {
		t.Errorf("Endpoints() = %v, want %v", got, want)
	}
	only := PortPolicy{Local: []model.Endpoint{here, remote2}}
	if got := only.Endpoints(); !reflect.DeepEqual(got, only.Local) {
		t.Errorf("Endpoints() = %v, want %v", got, only.Local)
	}
}
