package nft

import (
	"net/netip"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// Family holds what differs between the ip and ip6 tables.
type Family struct {
	// Name is the nft family keyword and the word rules match addresses
	// with ("ip daddr", "ip6 daddr").
	Name string
	// Model is the IP family of the service model the table programs.
	Model corev1.IPFamily
	// Table is the table family.
	Table nftables.TableFamily
	// AddrType is the set key type of one address; AddrLen its length.
	AddrType nftables.SetDatatype
	AddrLen  uint32
	// SaddrOffset and DaddrOffset locate the addresses in the network
	// header.
	SaddrOffset, DaddrOffset uint32
	// AfterAddr is the 32-bit register right after an address loaded into
	// NFT_REG_1: where the next field of a concatenated key goes, and the
	// one after it the field after that.
	AfterAddr uint32
	// NATFamily is the NFPROTO value a dnat statement names.
	NATFamily uint32
	// RejectCode is the ICMP (or ICMPv6) port-unreachable code:
	// ICMP_PORT_UNREACH (linux/icmp.h) or ICMPV6_PORT_UNREACH
	// (linux/icmpv6.h).
	RejectCode uint8
}

var (
	// IPv4 is the ip family.
	IPv4 = &Family{
		Name:        "ip",
		Model:       corev1.IPv4Protocol,
		Table:       nftables.TableFamilyIPv4,
		AddrType:    nftables.TypeIPAddr,
		AddrLen:     4,
		SaddrOffset: 12,
		DaddrOffset: 16,
		AfterAddr:   unix.NFT_REG32_01,
		NATFamily:   unix.NFPROTO_IPV4,
		RejectCode:  3,
	}
	// IPv6 is the ip6 family.
	IPv6 = &Family{
		Name:        "ip6",
		Model:       corev1.IPv6Protocol,
		Table:       nftables.TableFamilyIPv6,
		AddrType:    nftables.TypeIP6Addr,
		AddrLen:     16,
		SaddrOffset: 8,
		DaddrOffset: 24,
		AfterAddr:   unix.NFT_REG32_04,
		NATFamily:   unix.NFPROTO_IPV6,
		RejectCode:  4,
	}
	// Families are both, in the order syncs handle them.
	Families = []*Family{IPv4, IPv6}
)

// Has says whether addr belongs to the family (IPv4-mapped IPv6 addresses
// count as IPv4).
func (f *Family) Has(addr netip.Addr) bool {
	return addr.IsValid() && addr.Unmap().Is4() == (f.Table == nftables.TableFamilyIPv4)
}

// Bytes returns addr in network byte order at the family's length.
func (f *Family) Bytes(addr netip.Addr) []byte { return f.AppendBytes(nil, addr) }

// AppendBytes appends addr's bytes in the family's length to b.
func (f *Family) AppendBytes(b []byte, addr netip.Addr) []byte {
	if f.AddrLen == 4 {
		a := addr.Unmap().As4()
		return append(b, a[:]...)
	}
	a := addr.As16()
	return append(b, a[:]...)
}

// LastAddr is the highest address of p.
func LastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
