package ipvs

// The names of everything the backend owns. They never change between
// versions without a migration: a restarted agent recognises its objects
// by them.
const (
	// DummyInterface is the dummy interface the backend binds service
	// addresses to, so that the node accepts packets to them and IPVS,
	// which hooks local input, sees them. Interface names have at most 15
	// characters, which rules out "proxyshift-ipvs0".
	DummyInterface = "proxyshift-ipvs"
	// TableName is the name of the backend's helper table in the ip and
	// ip6 nftables families. It differs from the nftables backend's
	// table, so that both can exist while a node switches.
	TableName = "proxyshift-ipvs"
)

// The helper table's chains.
const (
	chainFilterInput  = "filter-input"
	chainFilterOutput = "filter-output"
	chainChecks       = "checks"
	chainFromPods     = "from-pods"
	chainFromNode     = "from-node"
	chainReject       = "reject"
	chainMarkMasq     = "mark-for-masquerade"
	chainPostrouting  = "nat-postrouting"
)

// The helper table's sets and maps.
const (
	// setVirtualServices records every virtual service the backend
	// created, each element commented with its service port: how a
	// restarted agent tells its NodePort virtual services from foreign
	// ones on the same addresses, and the known ports of service IPs.
	setVirtualServices = "virtual-services"
	// setServiceIPs holds the addresses bound to DummyInterface.
	setServiceIPs = "service-ips"
	// setServiceProtocols holds the protocols virtual services use.
	setServiceProtocols = "service-protocols"
	// mapNoEndpoint sends traffic to virtual services that must not be
	// served to reject (no endpoint) or drop (none this traffic may use).
	mapNoEndpoint = "no-endpoint"
	// setFirewall holds the load-balancer virtual services with source
	// ranges, setFirewallAllowed their allowed sources.
	setFirewall        = "firewall"
	setFirewallAllowed = "firewall-allowed"
	// The per-source-class verdicts: mark for masquerading, or drop.
	mapFromPods   = "verdicts-from-pods"
	mapFromNode   = "verdicts-from-node"
	mapFromOthers = "verdicts-from-others"
	// setHairpin holds "endpoint . endpoint" pairs: a packet from an
	// endpoint to itself, after IPVS chose it for its own service.
	setHairpin = "hairpin"
)

// What the helper table holds only while Cleanup hands connections over
// to conntrack (handover.go), gone with the table.
const (
	// chainHandoverPrerouting and chainHandoverOutput drop the packets of
	// the flows in setHandover before conntrack sees them.
	chainHandoverPrerouting = "handover-prerouting"
	chainHandoverOutput     = "handover-output"
	// setHandover holds both directions of every flow handed over, as
	// "saddr . daddr . l4proto . sport . dport".
	setHandover = "handover"
)
