package ipvs

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestForwardedFlows(t *testing.T) {
	ct := func(proto uint8, src, dst, rsrc, rdst string, state ...uint8) *netlink.ConntrackFlow {
		tuple := func(s, d string) netlink.IPTuple {
			sa, da := netip.MustParseAddrPort(s), netip.MustParseAddrPort(d)
			return netlink.IPTuple{Protocol: proto, SrcIP: net.IP(sa.Addr().AsSlice()), SrcPort: sa.Port(), DstIP: net.IP(da.Addr().AsSlice()), DstPort: da.Port()}
		}
		info := &netlink.ProtoInfoTCP{State: 3}
		if len(state) > 0 {
			info.State = state[0]
		}
		return &netlink.ConntrackFlow{Forward: tuple(src, dst), Reverse: tuple(rsrc, rdst), TimeOut: 300, Mark: 0x4000, ProtoInfo: info}
	}
	ours := map[vsKey]bool{
		{addr: netip.MustParseAddr("198.19.0.1"), proto: unix.IPPROTO_TCP, port: 80}:    true,
		{addr: netip.MustParseAddr("198.18.0.1"), proto: unix.IPPROTO_TCP, port: 30080}: true,
	}
	got := forwardedFlows([]*netlink.ConntrackFlow{
		// Forwarded by IPVS, masqueraded.
		ct(unix.IPPROTO_TCP, "198.18.0.2:40000", "198.19.0.1:80", "198.18.1.2:8080", "198.18.1.1:51000"),
		// Forwarded by IPVS to a NodePort, not masqueraded.
		ct(unix.IPPROTO_TCP, "198.18.0.2:40001", "198.18.0.1:30080", "198.18.1.3:8080", "198.18.0.2:40001"),
		// Not ours: another address, another protocol.
		ct(unix.IPPROTO_TCP, "198.18.0.2:40002", "198.19.0.9:80", "198.18.1.2:8080", "198.18.0.2:40002"),
		ct(unix.IPPROTO_UDP, "198.18.0.2:40003", "198.19.0.1:80", "198.18.1.2:8080", "198.18.0.2:40003"),
		// Ours, but ended.
		ct(unix.IPPROTO_TCP, "198.18.0.2:40005", "198.19.0.1:80", "198.18.1.2:8080", "198.18.1.1:51005", tcpTimeWait),
		ct(unix.IPPROTO_TCP, "198.18.0.2:40006", "198.19.0.1:80", "198.18.1.2:8080", "198.18.1.1:51006", tcpClose),
		// Ours, but untranslated (a connection to the address itself).
		ct(unix.IPPROTO_TCP, "198.18.0.2:40004", "198.19.0.1:80", "198.19.0.1:80", "198.18.0.2:40004"),
	}, ours)
	want := []forwardedFlow{
		{proto: unix.IPPROTO_TCP, client: netip.MustParseAddrPort("198.18.0.2:40000"), service: netip.MustParseAddrPort("198.19.0.1:80"),
			endpoint: netip.MustParseAddrPort("198.18.1.2:8080"), replyTo: netip.MustParseAddrPort("198.18.1.1:51000"), tcpState: 3, mark: 0x4000, timeout: 300},
		{proto: unix.IPPROTO_TCP, client: netip.MustParseAddrPort("198.18.0.2:40001"), service: netip.MustParseAddrPort("198.18.0.1:30080"),
			endpoint: netip.MustParseAddrPort("198.18.1.3:8080"), replyTo: netip.MustParseAddrPort("198.18.0.2:40001"), tcpState: 3, mark: 0x4000, timeout: 300},
	}
	if !slices.Equal(got, want) {
		t.Errorf("forwardedFlows =\n%+v\nwant\n%+v", got, want)
	}
}
