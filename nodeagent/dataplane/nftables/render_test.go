package nftables

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// testConfig is the node most tests render for.
var testConfig = dataplane.NodeConfig{
	NodeName:      "node-a",
	ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")},
	MasqueradeBit: 14,
}

// svc returns a TCP service port ns/name:port with a cluster IP, changed
// by opts.
func svc(ns, name, port string, clusterIP string, p int32, opts ...func(*model.ServicePort)) *model.ServicePort {
	ip := netip.MustParseAddr(clusterIP)
	fam := corev1.IPv4Protocol
	if ip.Is6() {
		fam = corev1.IPv6Protocol
	}
	sp := &model.ServicePort{
		Name:      model.ServicePortName{Namespace: ns, Name: name, Port: port, Protocol: corev1.ProtocolTCP},
		Family:    fam,
		ClusterIP: ip,
		Protocol:  corev1.ProtocolTCP,
		Port:      p,
	}
	for _, o := range opts {
		o(sp)
	}
	return sp
}

// ep is a ready endpoint on another node; opts change it.
func ep(addr string, port int32, opts ...func(*model.Endpoint)) func(*model.ServicePort) {
	return func(sp *model.ServicePort) {
		e := model.Endpoint{IP: netip.MustParseAddr(addr), Port: port, Ready: true, Serving: true, NodeName: "node-b"}
		for _, o := range opts {
			o(&e)
		}
		sp.Endpoints = append(sp.Endpoints, e)
	}
}

func local(e *model.Endpoint) { e.IsLocal, e.NodeName = true, "node-a" }

func terminating(serving bool) func(*model.Endpoint) {
	return func(e *model.Endpoint) { e.Ready, e.Serving, e.Terminating = false, serving, true }
}

func nodePort(p int32) func(*model.ServicePort) {
	return func(sp *model.ServicePort) { sp.NodePort = p }
}

func lb(ips ...string) func(*model.ServicePort) {
	return func(sp *model.ServicePort) {
		for _, s := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(s))
		}
	}
}

func sourceRanges(ps ...string) func(*model.ServicePort) {
	return func(sp *model.ServicePort) {
		for _, s := range ps {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(s))
		}
	}
}

func externalIPs(ips ...string) func(*model.ServicePort) {
	return func(sp *model.ServicePort) {
		for _, s := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(s))
		}
	}
}

func etpLocal(sp *model.ServicePort) { sp.ExternalPolicyLocal = true }
func itpLocal(sp *model.ServicePort) { sp.InternalPolicyLocal = true }

func affinity(d time.Duration) func(*model.ServicePort) {
	return func(sp *model.ServicePort) { sp.AffinityTimeout = d }
}

func udp(sp *model.ServicePort) {
	sp.Protocol = corev1.ProtocolUDP
	sp.Name.Protocol = corev1.ProtocolUDP
}

// portsOf indexes service ports by name.
func portsOf(sps ...*model.ServicePort) map[model.ServicePortName]*model.ServicePort {
	m := map[model.ServicePortName]*model.ServicePort{}
	for _, sp := range sps {
		m[sp.Name] = sp
	}
	return m
}

// goldenCase is one table of the golden files: its service ports,
// rendered in family f for a node cfg describes.
type goldenCase struct {
	name  string
	f     *family
	cfg   dataplane.NodeConfig
	ports []*model.ServicePort
}

// goldenCases are the tables in testdata/, one a kind of service.
func goldenCases() []goldenCase {
	withNodeIPs := testConfig
	withNodeIPs.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")}
	masqAll := testConfig
	masqAll.MasqueradeAll = true
	masqAll.ClusterCIDRs = nil

	return []goldenCase{
		{"clusterip", ipv4, testConfig, []*model.ServicePort{
			svc("default", "web", "http", "10.96.0.10", 80,
				ep("10.244.1.2", 8080), ep("10.244.2.3", 8080), ep("10.244.3.4", 8080)),
		}},
		{"nodeport", ipv4, withNodeIPs, []*model.ServicePort{
			svc("default", "web", "http", "10.96.0.10", 80, nodePort(30080),
				ep("10.244.1.2", 8080), ep("10.244.2.3", 8080, local)),
		}},
		{"loadbalancer-source-ranges", ipv4, withNodeIPs, []*model.ServicePort{
			svc("shop", "front", "https", "10.96.0.20", 443, nodePort(30443), lb("198.18.100.1"),
				sourceRanges("203.0.113.0/24", "192.168.1.0/24"),
				ep("10.244.1.2", 8443)),
		}},
		{"externalips", ipv4, testConfig, []*model.ServicePort{
			svc("default", "dns", "dns", "10.96.0.53", 53, udp, externalIPs("198.18.50.5"),
				ep("10.244.1.7", 53)),
		}},
		{"etp-local", ipv4, withNodeIPs, []*model.ServicePort{
			svc("default", "ingress", "http", "10.96.0.80", 80, nodePort(30081), lb("198.18.100.2"), etpLocal,
				ep("10.244.1.2", 8080), ep("10.244.2.3", 8080, local)),
		}},
		{"etp-local-no-local-endpoints", ipv4, withNodeIPs, []*model.ServicePort{
			svc("default", "ingress", "http", "10.96.0.80", 80, nodePort(30081), lb("198.18.100.2"), etpLocal,
				ep("10.244.1.2", 8080)),
		}},
		{"itp-local", ipv4, testConfig, []*model.ServicePort{
			svc("default", "node-cache", "dns", "10.96.0.11", 53, udp, itpLocal, ep("10.244.1.2", 53)),
			svc("default", "node-agent", "metrics", "10.96.0.12", 9100, itpLocal, ep("10.244.1.3", 9100), ep("10.244.2.3", 9100, local)),
		}},
		{"affinity", ipv4, testConfig, []*model.ServicePort{
			svc("default", "session", "http", "10.96.0.30", 80, affinity(3*time.Hour),
				ep("10.244.1.2", 8080), ep("10.244.2.3", 8080)),
		}},
		{"no-endpoints", ipv4, testConfig, []*model.ServicePort{
			svc("default", "empty", "http", "10.96.0.40", 80, nodePort(30040), externalIPs("198.18.50.6"), lb("198.18.100.3")),
		}},
		{"terminating-fallback", ipv4, testConfig, []*model.ServicePort{
			svc("default", "rollout", "http", "10.96.0.50", 80,
				ep("10.244.1.2", 8080, terminating(true)), ep("10.244.2.3", 8080, terminating(false))),
		}},
		{"masquerade-all", ipv4, masqAll, []*model.ServicePort{
			svc("default", "web", "http", "10.96.0.10", 80, ep("10.244.1.2", 8080)),
		}},
		{"ipv6", ipv6, withNodeIPs, []*model.ServicePort{
			svc("default", "web", "http", "fd00:10:96::10", 80, nodePort(30080),
				ep("fd00:10:244:1::2", 8080), ep("fd00:10:244:2::3", 8080, local)),
		}},
	}
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			rs, _ := render(tc.f, portsOf(tc.ports...), newNodePolicy(tc.f, tc.cfg))
			again, _ := render(tc.f, portsOf(tc.ports...), newNodePolicy(tc.f, tc.cfg))
			got := rs.String()
			if again.String() != got {
				t.Fatal("rendering is not deterministic")
			}
			dataplanetest.Golden(t, tc.name, got)
		})
	}
}
