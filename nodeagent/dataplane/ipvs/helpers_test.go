package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// testConfig is a node with one NodePort address, a pod network and the
// usual masquerade bit.
var testConfig = dataplane.NodeConfig{
	NodeName:      "node-1",
	NodeIPs:       []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")},
	ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")},
	MasqueradeBit: 14,
}

// testRenderConfig renders family f of cfg with the round-robin scheduler.
func testRenderConfig(f *family, cfg dataplane.NodeConfig) *renderConfig {
	rc := &renderConfig{f: f, policy: dataplane.NewNodePolicy(cfg, f.Model), scheduler: "rr"}
	rc.nodePortIPs = rc.policy.NodePortIPs
	return rc
}

// portOpt changes a service port under construction.
type portOpt func(*model.ServicePort)

// svc builds a service port ns/name:port/TCP (by default) at clusterIP.
func svc(ns, name, port, clusterIP string, number int32, opts ...portOpt) *model.ServicePort {
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
		Port:      number,
	}
	for _, o := range opts {
		o(sp)
	}
	slices.SortFunc(sp.Endpoints, func(a, b model.Endpoint) int { return a.IP.Compare(b.IP) })
	return sp
}

// epOpt changes an endpoint under construction.
type epOpt func(*model.Endpoint)

var (
	local       epOpt = func(e *model.Endpoint) { e.IsLocal, e.NodeName = true, "node-1" }
	terminating epOpt = func(e *model.Endpoint) { e.Ready, e.Terminating = false, true }
	notServing  epOpt = func(e *model.Endpoint) { e.Serving = false }
)

// ep adds a ready endpoint on another node.
func ep(ip string, port int32, opts ...epOpt) portOpt {
	return func(sp *model.ServicePort) {
		e := model.Endpoint{IP: netip.MustParseAddr(ip), Port: port, Ready: true, Serving: true, NodeName: "node-2"}
		for _, o := range opts {
			o(&e)
		}
		sp.Endpoints = append(sp.Endpoints, e)
	}
}

func udp(sp *model.ServicePort) {
	sp.Protocol, sp.Name.Protocol = corev1.ProtocolUDP, corev1.ProtocolUDP
}

func nodePort(p int32) portOpt { return func(sp *model.ServicePort) { sp.NodePort = p } }

func externalIPs(ips ...string) portOpt {
	return func(sp *model.ServicePort) {
		for _, s := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(s))
		}
	}
}

func lb(ips ...string) portOpt {
	return func(sp *model.ServicePort) {
		for _, s := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(s))
		}
	}
}

func sourceRanges(ranges ...string) portOpt {
	return func(sp *model.ServicePort) {
		for _, s := range ranges {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(s))
		}
	}
}

func affinity(d time.Duration) portOpt { return func(sp *model.ServicePort) { sp.AffinityTimeout = d } }

func etpLocal(sp *model.ServicePort) { sp.ExternalPolicyLocal = true }
func itpLocal(sp *model.ServicePort) { sp.InternalPolicyLocal = true }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// portsOf indexes service ports by name.
func portsOf(sps ...*model.ServicePort) map[model.ServicePortName]*model.ServicePort {
	out := map[model.ServicePortName]*model.ServicePort{}
	for _, sp := range sps {
		out[sp.Name] = sp
	}
	return out
}

// dumpState renders a family's state the way the kernel would list it:
// virtual services with their real servers, the dummy interface's
// addresses, and the helper table's elements (the fixed chains are in
// table.golden).
func dumpState(st *familyState) string {
	var b strings.Builder
	services := st.services()
	for _, k := range sortedKeys(services) {
		vs := services[k]
		fmt.Fprintf(&b, "virtual service %s %s", k, vs.scheduler)
		if vs.timeout > 0 {
			fmt.Fprintf(&b, " persistent %d", vs.timeout)
		}
		fmt.Fprintf(&b, " (%s)\n", st.owners[k])
		for _, d := range sortedAddrPorts(vs.dests) {
			fmt.Fprintf(&b, "  -> %s weight %d\n", d, vs.dests[d])
		}
	}
	for _, a := range sortedAddrs(st.addrRefs) {
		fmt.Fprintf(&b, "bound %s\n", a)
	}
	for _, e := range st.elements() {
		fmt.Fprintf(&b, "element %s\n", e.id())
	}
	return b.String()
}

// dumpTable renders the helper table's chains as nft lists them (the sets
// are in the elements dumpState lists).
func dumpTable(f *family, chains []nft.Chain) string {
	var b strings.Builder
	b.WriteString("table " + f.Name + " " + TableName + " {\n")
	for i := range chains {
		chains[i].Dump(&b)
	}
	b.WriteString("}\n")
	return b.String()
}
