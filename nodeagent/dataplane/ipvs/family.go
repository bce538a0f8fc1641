package ipvs

import (
	"net/netip"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// family holds what differs between IPv4 and IPv6: the IPVS address
// family and persistence netmask, and for the helper table the nft
// family, where addresses sit in the network header and which registers a
// concatenated key occupies.
type family struct {
	// name is the nft family keyword, also the word rules match addresses
	// with ("ip daddr", "ip6 daddr").
	name  string
	model corev1.IPFamily
	// af is the address family IPVS and rtnetlink name it by.
	af uint16
	// netmask is the persistence granularity of a virtual service: one
	// client address (/32 as a mask for IPv4, a prefix length for IPv6).
	netmask uint32

	table    nftables.TableFamily
	addrType nftables.SetDatatype
	addrLen  uint32
	// saddrOffset and daddrOffset locate the addresses in the network
	// header.
	saddrOffset uint32
	daddrOffset uint32
	// afterAddr is the 32-bit register right after an address loaded
	// into NFT_REG_1: where the next field of a concatenated key goes.
	afterAddr uint32
	// rejectCode is the ICMP (or ICMPv6) port-unreachable code.
	rejectCode uint8
}

var (
	ipv4 = &family{
		name:        "ip",
		model:       corev1.IPv4Protocol,
		af:          unix.AF_INET,
		netmask:     0xffffffff,
		table:       nftables.TableFamilyIPv4,
		addrType:    nftables.TypeIPAddr,
		addrLen:     4,
		saddrOffset: 12,
		daddrOffset: 16,
		afterAddr:   unix.NFT_REG32_01,
		rejectCode:  3, // ICMP_PORT_UNREACH
	}
	ipv6 = &family{
		name:        "ip6",
		model:       corev1.IPv6Protocol,
		af:          unix.AF_INET6,
		netmask:     128,
		table:       nftables.TableFamilyIPv6,
		addrType:    nftables.TypeIP6Addr,
		addrLen:     16,
		saddrOffset: 8,
		daddrOffset: 24,
		afterAddr:   unix.NFT_REG32_04,
		rejectCode:  4, // ICMPV6_PORT_UNREACH
	}
	// families are both, in the order syncs handle them.
	families = []*family{ipv4, ipv6}
)

// has says whether addr belongs to the family (IPv4-mapped IPv6 addresses
// count as IPv4).
func (f *family) has(addr netip.Addr) bool {
	return addr.IsValid() && addr.Unmap().Is4() == (f == ipv4)
}

// bytes is addr in network byte order, as long as the family's addresses.
func (f *family) bytes(addr netip.Addr) []byte {
	return addr.Unmap().AsSlice()
}
