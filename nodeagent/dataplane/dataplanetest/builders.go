package dataplanetest

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// The Service builders every backend's tests describe their service ports
// with: Svc makes one, the options below change it.

// PortOpt changes a service port under construction.
type PortOpt func(*model.ServicePort)

// EndpointOpt changes an endpoint under construction.
type EndpointOpt func(*model.Endpoint)

// Svc builds the TCP service port ns/name:port at clusterIP (its family
// is the address's), changed by opts. Its endpoints are sorted by address
// and port, as the model sorts them.
func Svc(ns, name, port, clusterIP string, number int32, opts ...PortOpt) *model.ServicePort {
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
	slices.SortFunc(sp.Endpoints, func(a, b model.Endpoint) int {
		return cmp.Or(a.IP.Compare(b.IP), cmp.Compare(a.Port, b.Port))
	})
	return sp
}

// EP adds a ready, serving endpoint on another node, changed by opts.
func EP(ip string, port int32, opts ...EndpointOpt) PortOpt {
	return func(sp *model.ServicePort) {
		e := model.Endpoint{IP: netip.MustParseAddr(ip), Port: port, Ready: true, Serving: true}
		for _, o := range opts {
			o(&e)
		}
		sp.Endpoints = append(sp.Endpoints, e)
	}
}

// The endpoint options.
var (
	// Local puts the endpoint on this node.
	Local EndpointOpt = func(e *model.Endpoint) { e.IsLocal = true }
	// Terminating makes it terminating (not ready, still serving).
	Terminating EndpointOpt = func(e *model.Endpoint) { e.Ready, e.Terminating = false, true }
	// NotServing makes it not serving.
	NotServing EndpointOpt = func(e *model.Endpoint) { e.Ready, e.Serving = false, false }
)

// UDP makes the port UDP.
func UDP(sp *model.ServicePort) {
	sp.Protocol, sp.Name.Protocol = corev1.ProtocolUDP, corev1.ProtocolUDP
}

// ETPLocal sets externalTrafficPolicy Local; ITPLocal internalTrafficPolicy
// Local.
func ETPLocal(sp *model.ServicePort) { sp.ExternalPolicyLocal = true }

// ITPLocal sets internalTrafficPolicy Local.
func ITPLocal(sp *model.ServicePort) { sp.InternalPolicyLocal = true }

// NodePort gives the port a node port.
func NodePort(p int32) PortOpt { return func(sp *model.ServicePort) { sp.NodePort = p } }

// ExternalIPs adds external IPs.
func ExternalIPs(ips ...string) PortOpt {
	return func(sp *model.ServicePort) { sp.ExternalIPs = append(sp.ExternalIPs, Addrs(ips...)...) }
}

// LB adds load-balancer ingress IPs.
func LB(ips ...string) PortOpt {
	return func(sp *model.ServicePort) { sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, Addrs(ips...)...) }
}

// SourceRanges adds loadBalancerSourceRanges.
func SourceRanges(prefixes ...string) PortOpt {
	return func(sp *model.ServicePort) {
		for _, s := range prefixes {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(s))
		}
	}
}

// Affinity sets ClientIP session affinity with timeout d.
func Affinity(d time.Duration) PortOpt { return func(sp *model.ServicePort) { sp.AffinityTimeout = d } }

// Addrs parses addresses.
func Addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// PortsOf indexes service ports by name.
func PortsOf(sps ...*model.ServicePort) map[model.ServicePortName]*model.ServicePort {
	m := make(map[model.ServicePortName]*model.ServicePort, len(sps))
	for _, sp := range sps {
		m[sp.Name] = sp
	}
	return m
}

// Snapshot is a model holding ports, in both families (an empty one for a
// family without ports).
func Snapshot(sps ...*model.ServicePort) *model.Snapshot {
	m := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: {}, corev1.IPv6Protocol: {},
	}}
	for _, sp := range sps {
		m.Ports[sp.Family][sp.Name] = sp
	}
	return m
}

// ManyPorts returns n IPv4 ClusterIP service ports ns/svc-<i>:http, with
// eps endpoints each: cluster IPs from 10.96.0.0, each port's endpoints
// one address from 10.128.0.0 on ports 8000 and up.
func ManyPorts(n, eps int) map[model.ServicePortName]*model.ServicePort {
	ports := make(map[model.ServicePortName]*model.ServicePort, n)
	for i := range n {
		opts := make([]PortOpt, 0, eps)
		for j := range eps {
			opts = append(opts, EP(fmt.Sprintf("10.%d.%d.%d", 128+i/65536, i/256%256, i%256), int32(8000+j)))
		}
		sp := Svc("ns", fmt.Sprintf("svc-%d", i), "http", fmt.Sprintf("10.%d.%d.%d", 96+i/65536, i/256%256, i%256), 80, opts...)
		ports[sp.Name] = sp
	}
	return ports
}

// BenchModel is the model the backends' sync benchmarks program: n
// ClusterIP services of 10 endpoints each (ManyPorts), IPv4 only.
func BenchModel(n int) *model.Snapshot {
	return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: ManyPorts(n, 10),
		corev1.IPv6Protocol: {},
	}}
}
