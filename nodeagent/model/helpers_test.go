package model

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Fixtures: a Service "ns/web" with cluster IP 10.0.0.1 and one TCP port
// "http" 80, and slices and endpoints built from short option lists.

const node = "node-a"

func service(opts ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.0.0.1",
			ClusterIPs: []string{"10.0.0.1"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func dualStack(s *corev1.Service) {
	s.Spec.ClusterIPs = []string{"10.0.0.1", "fd00::1"}
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
}

func withPorts(ports ...corev1.ServicePort) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Ports = ports }
}

func svcPort(name string, port int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, Protocol: proto}
}

// slice returns an EndpointSlice of service ns/web.
func slice(name string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: at,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func ports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

func port(name string, p int32, proto corev1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: &name, Port: &p, Protocol: &proto}
}

func http(p int32) []discoveryv1.EndpointPort { return ports(port("http", p, corev1.ProtocolTCP)) }

// ep returns an endpoint with nil conditions, modified by opts.
func ep(addr string, opts ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func on(n string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.NodeName = &n }
}

func ready(b bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Ready = &b }
}

func serving(b bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Serving = &b }
}

func terminating(b bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Terminating = &b }
}

// draining marks an endpoint as kubelet does during graceful termination.
func draining(e *discoveryv1.Endpoint) {
	ready(false)(e)
	serving(true)(e)
	terminating(true)(e)
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// summary renders a port compactly, e.g.
// "IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080,10.1.0.2:8080".
func summary(sp *ServicePort) string {
	var eps []string
	for _, e := range sp.Endpoints {
		eps = append(eps, e.String())
	}
	return fmt.Sprintf("%s %s/%s np=%d eps=%s", sp.Family,
		netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)), sp.Protocol, sp.NodePort, strings.Join(eps, ","))
}

func summaries(sps []*ServicePort) []string {
	var out []string
	for _, sp := range sps {
		out = append(out, sp.Name.Port+": "+summary(sp))
	}
	return out
}

// epStrings renders endpoints as ip:port.
func epStrings(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.String())
	}
	return out
}
