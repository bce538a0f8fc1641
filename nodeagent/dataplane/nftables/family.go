package nftables

import (
	"net/netip"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// family holds what differs between the ip and ip6 tables: where the
// addresses sit in the network header, how long they are, and which ICMP
// code rejects a connection.
type family struct {
	// name is the nft family keyword and the word rules match addresses
	// with ("ip daddr", "ip6 daddr").
	name  string
	model corev1.IPFamily
	table nftables.TableFamily
	// addrType is the set key type of one address; addrLen its length.
	addrType nftables.SetDatatype
	addrLen  uint32
	// saddrOffset and daddrOffset locate the addresses in the network
	// header.
	saddrOffset uint32
	daddrOffset uint32
	// concatProto and concatPort are the 32-bit registers that hold the
	// protocol and port right after an address in a concatenated key.
	concatProto uint32
	concatPort  uint32
	// natFamily is the NFPROTO value a dnat statement names.
	natFamily uint32
	// rejectCode is the ICMP (or ICMPv6) port-unreachable code.
	rejectCode uint8
}

var (
	ipv4 = &family{
		name:        "ip",
		model:       corev1.IPv4Protocol,
		table:       nftables.TableFamilyIPv4,
		addrType:    nftables.TypeIPAddr,
		addrLen:     4,
		saddrOffset: 12,
		daddrOffset: 16,
		concatProto: unix.NFT_REG32_01,
		concatPort:  unix.NFT_REG32_02,
		natFamily:   unix.NFPROTO_IPV4,
		rejectCode:  icmpPortUnreachable,
	}
	ipv6 = &family{
		name:        "ip6",
		model:       corev1.IPv6Protocol,
		table:       nftables.TableFamilyIPv6,
		addrType:    nftables.TypeIP6Addr,
		addrLen:     16,
		saddrOffset: 8,
		daddrOffset: 24,
		concatProto: unix.NFT_REG32_04,
		concatPort:  unix.NFT_REG32_05,
		natFamily:   unix.NFPROTO_IPV6,
		rejectCode:  icmpv6PortUnreachable,
	}
	families = []*family{ipv4, ipv6}
)

// icmpPortUnreachable and icmpv6PortUnreachable are ICMP_PORT_UNREACH
// (linux/icmp.h) and ICMPV6_PORT_UNREACH (linux/icmpv6.h).
const (
	icmpPortUnreachable   = 3
	icmpv6PortUnreachable = 4
)

// bytes returns addr in network byte order at the family's length.
func (f *family) bytes(addr netip.Addr) []byte {
	if f == ipv4 {
		b := addr.Unmap().As4()
		return b[:]
	}
	b := addr.As16()
	return b[:]
}
