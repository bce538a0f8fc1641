package probe

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

func TestTargets(t *testing.T) {
	ports := map[model.ServicePortName]*model.ServicePort{}
	add := func(name string, proto corev1.Protocol, ip string, nodePort int32, eps int) {
		sp := &model.ServicePort{
			Name: model.ServicePortName{Namespace: "ns", Name: name, Protocol: proto}, Family: corev1.IPv4Protocol,
			ClusterIP: netip.MustParseAddr(ip), Protocol: proto, Port: 80, NodePort: nodePort,
		}
		for i := range eps {
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i + 2)}), Port: 80, Ready: true, Serving: true})
		}
		ports[sp.Name] = sp
	}
	add("a", corev1.ProtocolTCP, "10.96.0.1", 30001, 1)
	add("b", corev1.ProtocolTCP, "10.96.0.2", 0, 2)
	add("c", corev1.ProtocolTCP, "10.96.0.3", 0, 0) // no endpoints: not probed
	add("d", corev1.ProtocolUDP, "10.96.0.4", 0, 1) // UDP: not probed
	add("e", corev1.ProtocolTCP, "10.96.0.5", 30005, 1)
	snap := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{corev1.IPv4Protocol: ports}}
	got := Targets(snap, []netip.Addr{netip.MustParseAddr("192.0.2.1")}, 10, 1)
	var addrs []string
	for _, tg := range got {
		addrs = append(addrs, tg.Addr.String())
	}
	want := []string{"10.96.0.1:80", "10.96.0.2:80", "10.96.0.5:80", "192.0.2.1:30001"}
	if len(addrs) != len(want) {
		t.Fatalf("Targets = %v, want %v", addrs, want)
	}
	for i := range want {
		if addrs[i] != want[i] {
			t.Fatalf("Targets = %v, want %v", addrs, want)
		}
	}
	// Each target carries its own port's endpoints (a NodePort's too).
	for _, tg := range got {
		name, _, _ := strings.Cut(tg.Name, " ")
		var sp *model.ServicePort
		for n, p := range ports {
			if n.String() == name {
				sp = p
			}
		}
		if sp == nil || tg.Endpoints != fmt.Sprint(sp.Endpoints) {
			t.Errorf("target %s: endpoints %q, want its port's", tg, tg.Endpoints)
		}
	}
	if n := len(Targets(snap, nil, 2, 0)); n != 2 {
		t.Errorf("a sample of 2 has %d targets", n)
	}
}

func TestProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	p := &Prober{NS: nsexec.Current, Timeout: time.Second, Attempts: 2}
	res := p.Probe(context.Background(), []Target{
		{Name: "up", Addr: netip.MustParseAddrPort(l.Addr().String())},
		{Name: "down", Addr: netip.MustParseAddrPort(closedAddr)},
	})
	if res[0].Err != nil || res[1].Err == nil {
		t.Fatalf("results %+v", res)
	}
	if a := Answered(res); len(a) != 1 || a[0].Name != "up" {
		t.Errorf("Answered = %v", a)
	}
	if Failures(res) == "" {
		t.Error("Failures is empty")
	}
}

// BenchmarkTargets10k measures Targets over 10 000 service ports of 10
// endpoints each, the sample a switch takes before it programs the new
// mode and again in its Verifying phase.
func BenchmarkTargets10k(b *testing.B) {
	snap := dt.BenchModel(10000)
	node := []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	for b.Loop() {
		if got := Targets(snap, node, 8, 2); len(got) != 8 {
			b.Fatalf("%d targets, want 8", len(got))
		}
	}
}
