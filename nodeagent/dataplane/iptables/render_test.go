package iptables

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// node is the configuration most tests render for; nodeWithIPs has
// NodePort addresses, masqAll masquerades everything.
var (
	node = dataplane.NodeConfig{
		NodeName:      "node-a",
		ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")},
		MasqueradeBit: 14,
	}
	nodeWithIPs = func() dataplane.NodeConfig {
		c := node
		c.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")}
		return c
	}()
	masqAll = func() dataplane.NodeConfig {
		c := node
		c.MasqueradeAll, c.ClusterCIDRs = true, nil
		return c
	}()
)

// opt changes a test service port.
type opt func(*model.ServicePort)

// port returns the TCP service port ns/name:portName with a cluster IP.
func port(ns, name, portName, clusterIP string, p int32, opts ...opt) *model.ServicePort {
	ip := netip.MustParseAddr(clusterIP)
	sp := &model.ServicePort{
		Name:      model.ServicePortName{Namespace: ns, Name: name, Port: portName, Protocol: corev1.ProtocolTCP},
		Family:    corev1.IPv4Protocol,
		ClusterIP: ip,
		Protocol:  corev1.ProtocolTCP,
		Port:      p,
	}
	if ip.Is6() {
		sp.Family = corev1.IPv6Protocol
	}
	for _, o := range opts {
		o(sp)
	}
	return sp
}

// endpoint adds a ready endpoint on another node, or on this one if here;
// state, if given, is "draining" (serving, terminating) or "gone" (not
// serving, terminating).
func endpoint(addr string, p int32, here bool, state ...string) opt {
	return func(sp *model.ServicePort) {
		e := model.Endpoint{IP: netip.MustParseAddr(addr), Port: p, Ready: true, Serving: true, NodeName: "node-b"}
		if here {
			e.NodeName, e.IsLocal = "node-a", true
		}
		for _, s := range state {
			e.Ready, e.Terminating, e.Serving = false, true, s == "draining"
		}
		sp.Endpoints = append(sp.Endpoints, e)
	}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func withNodePort(p int32) opt { return func(sp *model.ServicePort) { sp.NodePort = p } }
func withLB(ips ...string) opt {
	return func(sp *model.ServicePort) { sp.LoadBalancerIPs = addrs(ips...) }
}
func withExternal(ips ...string) opt {
	return func(sp *model.ServicePort) { sp.ExternalIPs = addrs(ips...) }
}
func withAffinity(d time.Duration) opt { return func(sp *model.ServicePort) { sp.AffinityTimeout = d } }
func withRanges(ps ...string) opt {
	return func(sp *model.ServicePort) {
		for _, p := range ps {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(p))
		}
	}
}
func etpLocal(sp *model.ServicePort) { sp.ExternalPolicyLocal = true }
func itpLocal(sp *model.ServicePort) { sp.InternalPolicyLocal = true }
func udp(sp *model.ServicePort) {
	sp.Protocol, sp.Name.Protocol = corev1.ProtocolUDP, corev1.ProtocolUDP
}

// portMap indexes service ports by name.
func portMap(sps ...*model.ServicePort) map[model.ServicePortName]*model.ServicePort {
	m := map[model.ServicePortName]*model.ServicePort{}
	for _, sp := range sps {
		m[sp.Name] = sp
	}
	return m
}

// policyFor returns the node policy of cfg for the family fam.
func policyFor(cfg dataplane.NodeConfig, fam corev1.IPFamily) *dataplane.NodePolicy {
	np := dataplane.NewNodePolicy(cfg, fam)
	return &np
}

// The golden cases are the nftables backend's, so that the two can be
// compared side by side.
func TestRenderGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   dataplane.NodeConfig
		ports []*model.ServicePort
	}{
		{"clusterip", node, []*model.ServicePort{
			port("default", "web", "http", "10.96.0.10", 80,
				endpoint("10.244.1.2", 8080, false), endpoint("10.244.2.3", 8080, false), endpoint("10.244.3.4", 8080, false)),
		}},
		{"nodeport", nodeWithIPs, []*model.ServicePort{
			port("default", "web", "http", "10.96.0.10", 80, withNodePort(30080),
				endpoint("10.244.1.2", 8080, false), endpoint("10.244.2.3", 8080, true)),
		}},
		{"loadbalancer-source-ranges", nodeWithIPs, []*model.ServicePort{
			port("shop", "front", "https", "10.96.0.20", 443, withNodePort(30443), withLB("198.18.100.1"),
				withRanges("203.0.113.0/24", "192.168.1.0/24"), endpoint("10.244.1.2", 8443, false)),
		}},
		{"externalips", node, []*model.ServicePort{
			port("default", "dns", "dns", "10.96.0.53", 53, udp, withExternal("198.18.50.5"), endpoint("10.244.1.7", 53, false)),
		}},
		{"etp-local", nodeWithIPs, []*model.ServicePort{
			port("default", "ingress", "http", "10.96.0.80", 80, withNodePort(30081), withLB("198.18.100.2"), etpLocal,
				endpoint("10.244.1.2", 8080, false), endpoint("10.244.2.3", 8080, true)),
		}},
		{"etp-local-no-local-endpoints", nodeWithIPs, []*model.ServicePort{
			port("default", "ingress", "http", "10.96.0.80", 80, withNodePort(30081), withLB("198.18.100.2"), etpLocal,
				endpoint("10.244.1.2", 8080, false)),
		}},
		{"itp-local", node, []*model.ServicePort{
			port("default", "node-cache", "dns", "10.96.0.11", 53, udp, itpLocal, endpoint("10.244.1.2", 53, false)),
			port("default", "node-agent", "metrics", "10.96.0.12", 9100, itpLocal,
				endpoint("10.244.1.3", 9100, false), endpoint("10.244.2.3", 9100, true)),
		}},
		{"affinity", node, []*model.ServicePort{
			port("default", "session", "http", "10.96.0.30", 80, withAffinity(3*time.Hour),
				endpoint("10.244.1.2", 8080, false), endpoint("10.244.2.3", 8080, false)),
		}},
		{"no-endpoints", node, []*model.ServicePort{
			port("default", "empty", "http", "10.96.0.40", 80, withNodePort(30040), withExternal("198.18.50.6"), withLB("198.18.100.3")),
		}},
		{"terminating-fallback", node, []*model.ServicePort{
			port("default", "rollout", "http", "10.96.0.50", 80,
				endpoint("10.244.1.2", 8080, false, "draining"), endpoint("10.244.2.3", 8080, false, "gone")),
		}},
		{"masquerade-all", masqAll, []*model.ServicePort{
			port("default", "web", "http", "10.96.0.10", 80, endpoint("10.244.1.2", 8080, false)),
		}},
		{"ipv6", nodeWithIPs, []*model.ServicePort{
			port("default", "web", "http", "fd00:10:96::10", 80, withNodePort(30080),
				endpoint("fd00:10:244:1::2", 8080, false), endpoint("fd00:10:244:2::3", 8080, true)),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			np := policyFor(tc.cfg, tc.ports[0].Family)
			got := string(fullRestore(render(np, portMap(tc.ports...)), nil))
			if again := string(fullRestore(render(np, portMap(tc.ports...)), nil)); again != got {
				t.Fatal("rendering is not deterministic")
			}
			for _, l := range strings.Split(got, "\n") {
				if strings.HasPrefix(l, ":") && len(strings.Fields(l)[0])-1 > maxChainLen {
					t.Errorf("chain name longer than %d characters: %s", maxChainLen, l)
				}
			}
			dataplanetest.Golden(t, tc.name, got)
		})
	}
}
