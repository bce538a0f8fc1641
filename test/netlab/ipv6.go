package netlab

import (
	"net/netip"
	"os"
	"testing"
)

// The lab is dual-stack: every address it hands out from 198.18.0.0/15
// has an IPv6 twin in 2001:db8::/32 (the documentation range), which the
// same link holds. The twin of a.b.c.d is 2001:db8::a.b.c.d, the IPv4
// address in the last 32 bits, and the twin of a /n subnet is a /(96+n):
// node 198.18.0.1 on 198.18.0.0/24 is 2001:db8::c612:1 on
// 2001:db8::c612:0/120. A test written for IPv4 runs over IPv6 by passing
// each address through IPv6Of, and any address the lab reports (a pod's,
// the node's) has its twin in the same lab.

// ipv6Base is the lab's IPv6 range, 2001:db8::/96; the last 32 bits hold
// the IPv4 twin.
var ipv6Base = netip.MustParseAddr("2001:db8::")

// IPv6Of is the IPv6 twin of the lab's IPv4 address a (see above); an
// IPv6 address is returned as it is.
func IPv6Of(a netip.Addr) netip.Addr {
	if !a.Is4() {
		return a
	}
	b := ipv6Base.As16()
	v4 := a.As4()
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}

// IPv6PrefixOf is the IPv6 twin of the lab's IPv4 prefix p: the twin of
// its address, 96 bits longer. An IPv6 prefix is returned as it is.
func IPv6PrefixOf(p netip.Prefix) netip.Prefix {
	if !p.Addr().Is4() {
		return p
	}
	return netip.PrefixFrom(IPv6Of(p.Addr()), p.Bits()+96)
}

// HasIPv6 says whether the kernel has IPv6 at all (it does unless built
// without it or booted with ipv6.disable=1). Without it the lab stays
// IPv4 only and its IPv6 fields (Node.IP6, Pod.IP6...) are invalid.
func HasIPv6() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}

// RequireIPv6 skips the test, naming what is missing, unless the kernel
// has IPv6.
func RequireIPv6(t testing.TB) {
	t.Helper()
	if !HasIPv6() {
		t.Skip("needs IPv6 in the kernel (/proc/sys/net/ipv6 is missing: built without it or booted with ipv6.disable=1)")
	}
}

// dualStack prepares ns for the lab: IPv6 on, for links created from now
// on ("default") and existing ones ("all"), without duplicate address
// detection (the lab's addresses are unique by construction, and a
// tentative address would not answer for a second or more) and without
// router advertisements (routes are set by hand); and reverse-path
// filtering off, which new namespaces otherwise inherit from the host
// and which would drop service traffic whose reply path differs from its
// request path. forward sets IPv4 and IPv6 forwarding (new namespaces may
// inherit it from the host, so it is set either way), and in a namespace
// that forwards, turns the ICMPv6 rate limit off (see below). On a kernel
// without IPv6 it sets the IPv4 settings only.
//
// The ICMPv6 errors a node sends to one host (the port unreachable of a
// reject) share a token bucket per host (net.ipv6.icmp.ratelimit, 1 s,
// burst 6) with the redirects the node sends for that host's packets; a
// node in IPVS mode on a bridge with br_netfilter sends such redirects
// for a client's service traffic, so a reject right after a burst of it
// went unanswered (a timeout instead of refused). The limit is the
// kernel's, not a proxy's; with it off the suite checks the reject
// itself. (The IPVS backend's README has the finding.)
func (ns *NetNS) dualStack(forward bool) error {
	fwd := "0"
	if forward {
		fwd = "1"
	}
	settings := [][2]string{
		{"net/ipv4/conf/all/rp_filter", "0"},
		{"net/ipv4/conf/default/rp_filter", "0"},
		{"net/ipv4/ip_forward", fwd},
	}
	if HasIPv6() {
		for _, conf := range []string{"all", "default"} {
			settings = append(settings,
				[2]string{"net/ipv6/conf/" + conf + "/disable_ipv6", "0"},
				[2]string{"net/ipv6/conf/" + conf + "/accept_dad", "0"},
				[2]string{"net/ipv6/conf/" + conf + "/accept_ra", "0"},
				[2]string{"net/ipv6/conf/" + conf + "/forwarding", fwd})
		}
		if forward {
			settings = append(settings, [2]string{"net/ipv6/icmp/ratelimit", "0"})
		}
	}
	for _, s := range settings {
		if err := ns.SetSysctl(s[0], s[1]); err != nil {
			return err
		}
	}
	return nil
}

// DisableIPv6 turns IPv6 off in ns, on every link it has and will have:
// a node without IPv6, as a host booted with IPv6 off by sysctl is. The
// lab's IPv6 addresses in ns are gone and its IPv4 ones keep working.
func (ns *NetNS) DisableIPv6() error {
	if !HasIPv6() {
		return nil
	}
	for _, conf := range []string{"all", "default"} {
		if err := ns.SetSysctl("net/ipv6/conf/"+conf+"/disable_ipv6", "1"); err != nil {
			return err
		}
	}
	return nil
}

// addDual adds addr, and its IPv6 twin when the kernel has IPv6, to the
// link called name in ns.
func (ns *NetNS) addDual(name string, addr netip.Prefix) error {
	if err := ns.AddAddr(name, addr); err != nil {
		return err
	}
	if !HasIPv6() {
		return nil
	}
	return ns.AddAddr(name, IPv6PrefixOf(addr))
}

// routeDual adds the default route via gw, and the IPv6 default route via
// its twin when the kernel has IPv6, in ns.
func (ns *NetNS) routeDual(gw netip.Addr) error {
	if err := ns.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), gw); err != nil {
		return err
	}
	if !HasIPv6() {
		return nil
	}
	return ns.AddRoute(netip.MustParsePrefix("::/0"), IPv6Of(gw))
}

// twin is IPv6Of(a) when the kernel has IPv6, else the invalid address.
func twin(a netip.Addr) netip.Addr {
	if !HasIPv6() {
		return netip.Addr{}
	}
	return IPv6Of(a)
}

// twinPrefix is IPv6PrefixOf(p) when the kernel has IPv6, else the
// invalid prefix.
func twinPrefix(p netip.Prefix) netip.Prefix {
	if !HasIPv6() {
		return netip.Prefix{}
	}
	return IPv6PrefixOf(p)
}
