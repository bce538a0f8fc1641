package dataplane

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// FuzzNodePolicy hands the node policy whatever addresses and prefixes
// the fuzzer makes from raw bytes (IPv4, IPv6, IPv4-mapped, any prefix
// length) and a service port built from more of them. Nothing may panic,
// and the decisions must be ones every backend can render: addresses and
// prefixes of the policy's family only, unmapped, never longer than the
// family's addresses, and a target only when it has endpoints to choose
// from. hack/fuzz.sh runs it for a few seconds in `make test`.
func FuzzNodePolicy(f *testing.F) {
	v4 := func(s string) []byte { a := netip.MustParseAddr(s).As16(); return a[:] }
	f.Add(v4("198.18.0.1"), v4("10.0.0.0"), uint8(104), v4("198.19.0.10"), v4("198.19.1.10"), v4("10.1.0.1"), uint8(0b1011), uint8(14), false)
	f.Add([]byte{127, 0, 0, 1}, []byte{10, 0, 0, 0}, uint8(8), []byte{198, 19, 0, 10}, []byte{}, []byte{10, 1, 0, 1}, uint8(0xff), uint8(0), true)
	f.Add(netip.MustParseAddr("2001:db8::1").AsSlice(), netip.MustParseAddr("fd00::").AsSlice(), uint8(200), netip.MustParseAddr("fd00::10").AsSlice(),
		netip.MustParseAddr("::ffff:1.2.3.4").AsSlice(), netip.MustParseAddr("fd01::1").AsSlice(), uint8(0b0101), uint8(31), false)
	f.Fuzz(func(t *testing.T, nodeIP, cidrAddr []byte, cidrBits uint8, clusterIP, extIP, epIP []byte, flags, masqBit uint8, v6 bool) {
		addr := func(b []byte) netip.Addr { a, _ := netip.AddrFromSlice(b); return a }
		family := corev1.IPv4Protocol
		if v6 {
			family = corev1.IPv6Protocol
		}
		cfg := NodeConfig{
			NodeName:      "node-a",
			NodeIPs:       []netip.Addr{addr(nodeIP)},
			ClusterCIDRs:  []netip.Prefix{netip.PrefixFrom(addr(cidrAddr), int(cidrBits)), netip.PrefixFrom(addr(epIP), int(cidrBits)%129)},
			MasqueradeAll: flags&0x80 != 0,
			MasqueradeBit: int(masqBit % 32),
		}
		n := NewNodePolicy(cfg, family)
		checkNodePolicy(t, &n)

		ep := model.Endpoint{IP: addr(epIP), Port: 8080, Ready: flags&1 != 0, Serving: flags&2 != 0, Terminating: flags&4 != 0, IsLocal: flags&8 != 0}
		sp := &model.ServicePort{
			Name:                     model.ServicePortName{Namespace: "ns", Name: "fuzz", Port: "p", Protocol: corev1.ProtocolTCP},
			Family:                   family,
			ClusterIP:                addr(clusterIP),
			Protocol:                 corev1.ProtocolTCP,
			Port:                     80,
			NodePort:                 int32(flags&0x10) * 1000,
			ExternalIPs:              []netip.Addr{addr(extIP)},
			LoadBalancerIPs:          []netip.Addr{addr(extIP)},
			LoadBalancerSourceRanges: []netip.Prefix{netip.PrefixFrom(addr(cidrAddr), int(cidrBits))},
			ExternalPolicyLocal:      flags&0x20 != 0,
			InternalPolicyLocal:      flags&0x40 != 0,
			Endpoints:                []model.Endpoint{ep},
		}
		p := n.PortPolicy(sp)
		checkPortPolicy(t, &n, &p)
	})
}

func checkNodePolicy(t *testing.T, n *NodePolicy) {
	t.Helper()
	for _, ip := range n.NodePortIPs {
		if !n.InFamily(ip) || ip.Is4In6() || n.Loopback.Contains(ip) {
			t.Fatalf("NodePortIPs holds %v (family %s)", ip, n.Family)
		}
	}
	for i, c := range n.ClusterCIDRs {
		if !c.IsValid() || c != c.Masked() || c.Addr().Is4In6() || !n.InFamily(c.Addr()) || c.Bits() > c.Addr().BitLen() {
			t.Fatalf("ClusterCIDRs holds %v (family %s)", c, n.Family)
		}
		if i > 0 && n.ClusterCIDRs[i-1].Contains(c.Addr()) {
			t.Fatalf("ClusterCIDRs %v: %v lies in the one before it", n.ClusterCIDRs, c)
		}
	}
	if n.MasqueradeMark == 0 || n.MasqueradeMark&(n.MasqueradeMark-1) != 0 {
		t.Fatalf("MasqueradeMark %#x is not one bit", n.MasqueradeMark)
	}
}

func checkPortPolicy(t *testing.T, n *NodePolicy, p *PortPolicy) {
	t.Helper()
	if p.ClusterIP.IsValid() && (!n.InFamily(p.ClusterIP) || p.ClusterIP.Is4In6()) {
		t.Fatalf("ClusterIP %v in family %s", p.ClusterIP, n.Family)
	}
	for _, a := range p.ExternalAddrs {
		if !n.InFamily(a) || a.Is4In6() {
			t.Fatalf("ExternalAddrs holds %v (family %s)", a, n.Family)
		}
	}
	has := map[Target]bool{TargetCluster: len(p.Cluster) > 0, TargetLocal: len(p.Local) > 0, TargetDrop: true, TargetReject: true}
	if !has[p.Internal] {
		t.Fatalf("Internal %s without endpoints to choose from", p.Internal)
	}
	for _, r := range p.External {
		if !has[r.To] || r.To == TargetReject {
			t.Fatalf("External rule %+v without endpoints to choose from", r)
		}
	}
	if p.ExternalReject && len(p.External) > 0 {
		t.Fatalf("ExternalReject with rules %+v", p.External)
	}
	if fw := p.Firewall; fw != nil {
		for _, a := range fw.IPs {
			if !n.InFamily(a) || a.Is4In6() {
				t.Fatalf("Firewall IP %v (family %s)", a, n.Family)
			}
		}
		for _, r := range fw.SourceRanges {
			if !r.IsValid() || r.Addr().Is4In6() || !n.InFamily(r.Addr()) || r.Bits() > r.Addr().BitLen() {
				t.Fatalf("Firewall source range %v (family %s)", r, n.Family)
			}
		}
	}
	_ = p.Endpoints()
}
