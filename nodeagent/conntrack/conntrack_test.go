package conntrack

import (
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

func TestStale(t *testing.T) {
	ep := func(ip string, serving bool) model.Endpoint {
		return model.Endpoint{IP: netip.MustParseAddr(ip), Port: 53, Ready: serving, Serving: serving}
	}
	dns := &model.ServicePort{
		Name: model.ServicePortName{Namespace: "ns", Name: "dns", Protocol: corev1.ProtocolUDP}, Family: corev1.IPv4Protocol,
		ClusterIP: netip.MustParseAddr("10.96.0.10"), Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053,
		ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
		Endpoints:   []model.Endpoint{ep("10.1.0.2", true), ep("10.1.0.3", false)},
	}
	empty := &model.ServicePort{
		Name: model.ServicePortName{Namespace: "ns", Name: "empty", Protocol: corev1.ProtocolUDP}, Family: corev1.IPv4Protocol,
		ClusterIP: netip.MustParseAddr("10.96.0.11"), Protocol: corev1.ProtocolUDP, Port: 53,
	}
	web := &model.ServicePort{
		Name: model.ServicePortName{Namespace: "ns", Name: "web", Protocol: corev1.ProtocolTCP}, Family: corev1.IPv4Protocol,
		ClusterIP: netip.MustParseAddr("10.96.0.12"), Protocol: corev1.ProtocolTCP, Port: 80,
	}
	snap := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: {dns.Name: dns, empty.Name: empty, web.Name: web},
	}}
	f := Build(snap, corev1.IPv4Protocol, []netip.Addr{netip.MustParseAddr("192.0.2.1")})
	for _, tc := range []struct {
		name  string
		proto uint8
		dst   string
		reply string
		want  bool
	}{
		{"to a serving endpoint", unix.IPPROTO_UDP, "10.96.0.10:53", "10.1.0.2", false},
		{"to a gone endpoint", unix.IPPROTO_UDP, "10.96.0.10:53", "10.1.0.9", true},
		{"to a terminating, not serving endpoint", unix.IPPROTO_UDP, "10.96.0.10:53", "10.1.0.3", true},
		{"untranslated, from when there was no endpoint", unix.IPPROTO_UDP, "10.96.0.10:53", "10.96.0.10", true},
		{"external IP to a gone endpoint", unix.IPPROTO_UDP, "192.0.2.10:53", "10.1.0.9", true},
		{"NodePort on a node address to a gone endpoint", unix.IPPROTO_UDP, "192.0.2.1:30053", "10.1.0.9", true},
		{"NodePort number on another address", unix.IPPROTO_UDP, "192.0.2.99:30053", "10.1.0.9", false},
		{"service without endpoints", unix.IPPROTO_UDP, "10.96.0.11:53", "10.1.0.4", true},
		{"another port of the cluster IP", unix.IPPROTO_UDP, "10.96.0.10:54", "10.1.0.9", false},
		{"not a service", unix.IPPROTO_UDP, "10.1.0.2:8080", "10.1.0.2", false},
		{"TCP to an endpoint is never touched", unix.IPPROTO_TCP, "10.96.0.12:80", "10.1.0.9", false},
		{"untranslated TCP to a TCP address no sync began to serve", unix.IPPROTO_TCP, "10.96.0.12:80", "10.96.0.12", false},
	} {
		got := f.Stale(Flow{Protocol: tc.proto, OrigDst: netip.MustParseAddrPort(tc.dst), ReplySrc: netip.MustParseAddr(tc.reply)})
		if got != tc.want {
			t.Errorf("%s: Stale = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !hasUDPChange(model.ChangeSet{dns.Name: {}}, false) || hasUDPChange(model.ChangeSet{web.Name: {}}, false) || !hasUDPChange(nil, true) {
		t.Error("hasUDPChange")
	}
}

// TestFrontendsFollowClaims checks that a Service naming the cluster DNS
// address as its externalIP cannot make the DNS flows look stale: the
// model's claims keep the address the DNS Service's, and the frontend is
// built from it on every build (a map-order choice would lose half the
// time).
func TestFrontendsFollowClaims(t *testing.T) {
	tr := model.NewTracker("node-a", nil)
	udp := []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}
	svc := func(ns, name, ip string, ext ...string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: udp, ExternalIPs: ext},
		}
	}
	slice := func(ns, svc, ip string) *discoveryv1.EndpointSlice {
		name, port, proto := "dns", int32(53), corev1.ProtocolUDP
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}}},
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
		}
	}
	tr.OnServiceAdd(svc("kube-system", "dns", "10.96.0.10"))
	tr.OnEndpointSliceAdd(model.SliceOf(slice("kube-system", "dns", "10.1.0.2")))
	tr.OnServiceAdd(svc("a", "evil", "10.96.0.66", "10.96.0.10"))
	tr.OnEndpointSliceAdd(model.SliceOf(slice("a", "evil", "10.1.0.66")))
	snap, _ := tr.Snapshot()

	dnsFlow := Flow{Protocol: unix.IPPROTO_UDP, OrigDst: netip.MustParseAddrPort("10.96.0.10:53"), ReplySrc: netip.MustParseAddr("10.1.0.2")}
	hijacked := Flow{Protocol: unix.IPPROTO_UDP, OrigDst: netip.MustParseAddrPort("10.96.0.10:53"), ReplySrc: netip.MustParseAddr("10.1.0.66")}
	for i := range 50 {
		f := Build(snap, corev1.IPv4Protocol, nil)
		if f.Stale(dnsFlow) {
			t.Fatalf("build %d: a DNS flow to its own endpoint counts as stale", i)
		}
		if !f.Stale(hijacked) {
			t.Fatalf("build %d: a flow from the DNS address to the other Service's pod is not stale", i)
		}
	}
}

// TestStaleTCP: a TCP entry is stale only when it is a connection attempt
// (SYN_SENT) that nothing translated, to a TCP address the sync began to
// serve.
func TestStaleTCP(t *testing.T) {
	f := &Frontends{newTCP: map[netip.AddrPort]bool{netip.MustParseAddrPort("10.96.0.12:80"): true}}
	for _, tc := range []struct {
		name    string
		proto   uint8
		synSent bool
		dst     string
		reply   string
		want    bool
	}{
		{"untranslated SYN to a new address", unix.IPPROTO_TCP, true, "10.96.0.12:80", "10.96.0.12", true},
		{"translated SYN to a new address", unix.IPPROTO_TCP, true, "10.96.0.12:80", "10.1.0.9", false},
		{"untranslated, past SYN_SENT", unix.IPPROTO_TCP, false, "10.96.0.12:80", "10.96.0.12", false},
		{"untranslated SYN to another port of the address", unix.IPPROTO_TCP, true, "10.96.0.12:81", "10.96.0.12", false},
		{"untranslated SYN to another address", unix.IPPROTO_TCP, true, "10.96.0.13:80", "10.96.0.13", false},
		{"UDP to the address", unix.IPPROTO_UDP, false, "10.96.0.12:80", "10.96.0.12", false},
	} {
		got := f.Stale(Flow{Protocol: tc.proto, SynSent: tc.synSent, OrigDst: netip.MustParseAddrPort(tc.dst), ReplySrc: netip.MustParseAddr(tc.reply)})
		if got != tc.want {
			t.Errorf("%s: Stale = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNewTCPFrontends: the TCP addresses a sync began to serve are those
// of the changed TCP ports (every port after a full sync) that the
// snapshot before did not have; after none, all of them, whatever the
// sync changed.
func TestNewTCPFrontends(t *testing.T) {
	port := func(name string, proto corev1.Protocol, ip string, ext ...string) *model.ServicePort {
		sp := &model.ServicePort{
			Name:      model.ServicePortName{Namespace: "ns", Name: name, Protocol: proto},
			Family:    corev1.IPv4Protocol,
			ClusterIP: netip.MustParseAddr(ip), Protocol: proto, Port: 80,
		}
		for _, e := range ext {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(e))
		}
		return sp
	}
	snapOf := func(ports ...*model.ServicePort) *model.Snapshot {
		m := map[model.ServicePortName]*model.ServicePort{}
		for _, p := range ports {
			m[p.Name] = p
		}
		return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{corev1.IPv4Protocol: m}}
	}
	web, udp := port("web", corev1.ProtocolTCP, "10.96.0.12"), port("dns", corev1.ProtocolUDP, "10.96.0.10")
	webExt := port("web", corev1.ProtocolTCP, "10.96.0.12", "192.0.2.10")
	api := port("api", corev1.ProtocolTCP, "10.96.0.20")
	before := snapOf(web, udp)
	after := snapOf(webExt, udp, api)
	keys := func(m map[netip.AddrPort]bool) []string {
		var out []string
		for k := range m {
			out = append(out, k.String())
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		name    string
		prev    *model.Snapshot
		changed model.ChangeSet
		all     bool
		want    []string
	}{
		{"first sync", nil, nil, true, []string{"10.96.0.12:80", "10.96.0.20:80", "192.0.2.10:80"}},
		{"full sync after another", before, nil, true, []string{"10.96.0.20:80", "192.0.2.10:80"}},
		{"a new external IP", before, model.ChangeSet{webExt.Name: {}}, false, []string{"192.0.2.10:80"}},
		{"a new Service", before, model.ChangeSet{api.Name: {}}, false, []string{"10.96.0.20:80"}},
		{"an unchanged set of addresses", after, model.ChangeSet{webExt.Name: {}, api.Name: {}}, false, nil},
		{"a partial sync as the first one seen", nil, model.ChangeSet{}, false, []string{"10.96.0.12:80", "10.96.0.20:80", "192.0.2.10:80"}},
		{"a UDP port", before, model.ChangeSet{udp.Name: {}}, false, nil},
		{"a deleted port", before, model.ChangeSet{port("gone", corev1.ProtocolTCP, "10.96.0.30").Name: {}}, false, nil},
	} {
		if got := keys(newTCPFrontends(after, tc.prev, corev1.IPv4Protocol, tc.changed, tc.all)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: new TCP frontends %v, want %v", tc.name, got, tc.want)
		}
	}
}

// BenchmarkReconcileTCPChange10k is the reconcile after an agent's most
// common sync: one TCP service port's endpoints changed among 10 000
// services, nothing new to flush, so nothing to read from the kernel.
func BenchmarkReconcileTCPChange10k(b *testing.B) {
	snap := dataplanetest.BenchModel(10000)
	var changed model.ChangeSet
	for name := range snap.Ports[corev1.IPv4Protocol] {
		changed = model.ChangeSet{name: {}}
		break
	}
	r := &Reconciler{last: snap}
	for b.Loop() {
		if n, err := r.Reconcile(b.Context(), snap, changed, false); n != 0 || err != nil {
			b.Fatalf("Reconcile = %d, %v; want nothing to delete", n, err)
		}
	}
}
