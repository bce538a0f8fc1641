package ipvs

import (
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
)

// family holds what differs between IPv4 and IPv6: for the helper table
// the nft family (nft.Family), and the IPVS address family and
// persistence netmask.
type family struct {
	*nft.Family
	// af is the address family IPVS and rtnetlink name it by.
	af uint16
	// netmask is the persistence granularity of a virtual service: one
	// client address (/32 as a mask for IPv4, a prefix length for IPv6).
	netmask uint32
}

var (
	ipv4 = &family{Family: nft.IPv4, af: unix.AF_INET, netmask: 0xffffffff}
	ipv6 = &family{Family: nft.IPv6, af: unix.AF_INET6, netmask: 128}
	// families are both, in the order syncs handle them.
	families = []*family{ipv4, ipv6}
)
