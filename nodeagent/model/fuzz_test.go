package model

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzTracker feeds the Service/EndpointSlice → model path whatever the
// fuzzer makes of two Services' addresses, ports and one EndpointSlice:
// any text may sit in these fields of objects an older API server, or a
// hostile one, hands the agent. Nothing may panic, and what reaches the
// model must be what every dataplane can program: valid addresses of the
// port's family, ports in range, no external address that is another
// Service's cluster IP or the node's, no source range longer than its
// family's addresses. hack/fuzz.sh runs it for a few seconds in `make
// test`; `go test` runs the seeds.
func FuzzTracker(f *testing.F) {
	f.Add("10.0.0.1", "fd00::1", "192.0.2.7,10.0.0.2", "198.18.0.9", "10.0.0.0/8,::ffff:10.0.0.0/104", int32(80), int32(30080), "TCP", "10.1.0.1,10.1.0.2", int32(8080), "10.0.0.2", "192.0.2.1")
	f.Add("::ffff:10.0.0.1", "", " 010.0.0.3 ", "lb", "::ffff:0:0/95, 1.2.3.4/33", int32(0), int32(-5), "SCTP", "fd01::1,10.1.0.1", int32(70000), "10.0.0.1", "::ffff:192.0.2.1")
	f.Add("fd00::10", "10.0.0.10", "fd00::10,2001:db8::1", "2001:db8::2", "2001:db8::/64", int32(53), int32(0), "UDP", "fd01::5", int32(53), "fd00::10", "2001:db8::1")
	f.Fuzz(func(t *testing.T, clusterIP, clusterIP2, externalIPs, lbIP, sourceRanges string, port, nodePort int32, proto, endpoints string, epPort int32, otherClusterIP, nodeAddr string) {
		split := func(s string) []string {
			if s == "" {
				return nil
			}
			return strings.Split(s, ",")
		}
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fuzz"},
			Spec: corev1.ServiceSpec{
				Type:                     corev1.ServiceTypeLoadBalancer,
				ClusterIP:                clusterIP,
				ClusterIPs:               append([]string{clusterIP}, split(clusterIP2)...),
				ExternalIPs:              split(externalIPs),
				LoadBalancerSourceRanges: split(sourceRanges),
				Ports:                    []corev1.ServicePort{{Name: "p", Port: port, NodePort: nodePort, Protocol: corev1.Protocol(proto)}},
			},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: lbIP}}}},
		}
		other := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "other"},
			Spec: corev1.ServiceSpec{ClusterIP: otherClusterIP, Ports: []corev1.ServicePort{{Name: "p", Port: port, Protocol: corev1.Protocol(proto)}},
				ExternalIPs: split(externalIPs)},
		}
		pname, pproto := "p", corev1.Protocol(proto)
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "fuzz-1", Labels: map[string]string{discoveryv1.LabelServiceName: "fuzz"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &epPort, Protocol: &pproto}},
		}
		if strings.Contains(endpoints, ":") {
			slice.AddressType = discoveryv1.AddressTypeIPv6
		}
		for _, a := range split(endpoints) {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
		}

		tr := NewTracker("node-a", func(error) {})
		if ip, err := netip.ParseAddr(nodeAddr); err == nil {
			tr.SetNodeAddrs([]netip.Addr{ip})
		}
		tr.OnServiceAdd(other)
		tr.OnEndpointSliceAdd(SliceOf(slice))
		tr.OnServiceAdd(svc)
		snap, _ := tr.Snapshot()
		checkModel(t, snap, tr)
		tr.OnServiceDelete(other)
		snap, _ = tr.Snapshot()
		checkModel(t, snap, tr)
	})
}

// checkModel checks what every dataplane relies on in a snapshot.
func checkModel(t *testing.T, snap *Snapshot, tr *Tracker) {
	t.Helper()
	clusterIPs := map[netip.Addr]ServiceName{}
	for fam, ports := range snap.Ports {
		for name, sp := range ports {
			if sp.Name != name || sp.Family != fam || !sp.ClusterIP.IsValid() || familyOf(sp.ClusterIP) != fam || sp.ClusterIP.Is4In6() {
				t.Fatalf("%s in family %s: name %s, family %s, cluster IP %v", name, fam, sp.Name, sp.Family, sp.ClusterIP)
			}
			clusterIPs[sp.ClusterIP] = name.ServiceName()
			if !validPort(sp.Port) || sp.NodePort != 0 && !validPort(sp.NodePort) || !validProtocol(sp.Protocol) {
				t.Fatalf("%s: port %d node port %d protocol %q", name, sp.Port, sp.NodePort, sp.Protocol)
			}
			for _, a := range append(append([]netip.Addr{}, sp.ExternalIPs...), sp.LoadBalancerIPs...) {
				if !a.IsValid() || familyOf(a) != fam || a.Is4In6() || tr.claims.node[a] {
					t.Fatalf("%s: external address %v in family %s (node's: %v)", name, a, fam, tr.claims.node[a])
				}
			}
			for _, r := range sp.LoadBalancerSourceRanges {
				if !r.IsValid() || familyOf(r.Addr()) != fam || r.Bits() > r.Addr().BitLen() || r != r.Masked() {
					t.Fatalf("%s: source range %v in family %s", name, r, fam)
				}
			}
			for _, e := range sp.Endpoints {
				if !e.IP.IsValid() || familyOf(e.IP) != fam || !validPort(e.Port) {
					t.Fatalf("%s: endpoint %v", name, e)
				}
			}
		}
	}
	for _, ports := range snap.Ports {
		for name, sp := range ports {
			for _, a := range append(append([]netip.Addr{}, sp.ExternalIPs...), sp.LoadBalancerIPs...) {
				if owner, ok := clusterIPs[a]; ok && owner != name.ServiceName() {
					t.Fatalf("%s takes %v, the cluster IP of %s", name, a, owner)
				}
			}
		}
	}
}
