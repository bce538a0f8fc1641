package nftables

import "github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"

// family is what differs between the ip and ip6 tables (nft.Family).
type family = nft.Family

// The families, in the order syncs handle them.
var (
	ipv4     = nft.IPv4
	ipv6     = nft.IPv6
	families = nft.Families
)

// The rules and chains of the table are nft's.
type (
	rule  = nft.Rule
	chain = nft.Chain
	hook  = nft.Hook
)
