package netlab

import (
	"net/netip"
	"testing"
)

func TestIPv6Of(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"198.18.0.1", "2001:db8::c612:1"},
		{"198.19.255.254", "2001:db8::c613:fffe"},
		{"2001:db8::1", "2001:db8::1"},
	} {
		if got := IPv6Of(netip.MustParseAddr(c.in)); got != netip.MustParseAddr(c.want) {
			t.Errorf("IPv6Of(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"198.18.0.0/24", "2001:db8::c612:0/120"},
		{"198.19.0.0/16", "2001:db8::c613:0/112"},
		{"198.18.0.2/32", "2001:db8::c612:2/128"},
	} {
		if got := IPv6PrefixOf(netip.MustParsePrefix(c.in)); got != netip.MustParsePrefix(c.want) {
			t.Errorf("IPv6PrefixOf(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}

// TestLabIsDualStack checks the lab's IPv6 half by itself: with no
// service proxy, clients reach each pod by its IPv6 address over TCP and
// UDP, an untranslated service address over IPv6 times out as over IPv4,
// forwarding is on in the node only, and a namespace whose IPv6 is turned
// off (DisableIPv6) still answers over IPv4.
func TestLabIsDualStack(t *testing.T) {
	RequireIPv6(t)
	lab := NewLab(t)
	a := lab.Node.AddPod(t, "pod-a")
	b := lab.Node.AddPod(t, "pod-b")
	if want := netip.MustParseAddr("2001:db8::c612:102"); a.IP6 != want || lab.Node.IP6 != IPv6Of(NodeIP) || lab.Client.IP6 != IPv6Of(ClientIP) {
		t.Fatalf("pod-a %s, node %s, client %s; want %s, %s, %s", a.IP6, lab.Node.IP6, lab.Client.IP6, want, IPv6Of(NodeIP), IPv6Of(ClientIP))
	}
	for _, client := range []*Host{lab.Client, lab.OtherClient} {
		for _, pod := range []*Pod{a, b} {
			for _, proto := range []Proto{TCP, UDP} {
				got, err := client.NS.Request(proto, pod.Addr6(), okTimeout)
				if err != nil || got != pod.Name {
					t.Errorf("%s from %s to %s: got %q, %v; want %q", proto, client.IP6, pod.Addr6(), got, err, pod.Name)
				}
			}
		}
	}
	if got, err := a.NS.Request(TCP, b.Addr6(), okTimeout); err != nil || got != "pod-b" {
		t.Errorf("pod-a to pod-b over IPv6: %q, %v", got, err)
	}
	svc := netip.AddrPortFrom(IPv6Of(ServiceCIDR.Addr().Next()), 80)
	if _, err := lab.Client.NS.Request(TCP, svc, failTimeout); KindOf(err) != Timeout {
		t.Errorf("TCP to untranslated %s: %v; want timeout", svc, err)
	}
	for _, c := range []struct {
		ns   *NetNS
		want string
	}{{lab.Node.NS, "1"}, {lab.Node.Beyond, "0"}, {a.NS, "0"}} {
		if v, err := c.ns.Sysctl("net/ipv6/conf/all/forwarding"); err != nil || v != c.want {
			t.Errorf("%s IPv6 forwarding = %q, %v; want %s", c.ns.Name, v, err, c.want)
		}
	}

	if err := b.NS.DisableIPv6(); err != nil {
		t.Fatal(err)
	}
	if got, err := lab.Client.NS.Request(TCP, b.Addr6(), failTimeout); err == nil {
		t.Errorf("pod-b with IPv6 off answered over IPv6 (%s)", got)
	}
	if got, err := lab.Client.NS.Request(TCP, b.Addr(), okTimeout); err != nil || got != "pod-b" {
		t.Errorf("pod-b with IPv6 off over IPv4: %q, %v", got, err)
	}
}
