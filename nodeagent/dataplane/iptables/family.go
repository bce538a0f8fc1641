package iptables

import (
	"net/netip"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
)

// family holds what differs between the IPv4 rules (iptables) and the
// IPv6 ones (ip6tables).
type family struct {
	model corev1.IPFamily
	// tool is the command family: the backend runs
	// <tool>-<variant>-restore and <tool>-<variant>-save.
	tool string
	// nft is the nf_tables family iptables-nft keeps the tables in.
	nft nftables.TableFamily
}

var (
	ipv4     = &family{model: corev1.IPv4Protocol, tool: "iptables", nft: nftables.TableFamilyIPv4}
	ipv6     = &family{model: corev1.IPv6Protocol, tool: "ip6tables", nft: nftables.TableFamilyIPv6}
	families = []*family{ipv4, ipv6}
)

// host renders addr as a single-address prefix, the way iptables-save
// prints -s and -d.
func host(addr netip.Addr) string {
	return netip.PrefixFrom(addr, addr.BitLen()).String()
}
