package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"strconv"
	"strings"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// TableName is the name of the table proxyshift owns in the ip and ip6
// families. Nothing outside it is ever created, changed or deleted.
const TableName = "proxyshift"

// Names of the objects every table has, whatever the services.
const (
	chainFilterPrerouting = "filter-prerouting"
	chainFilterInput      = "filter-input"
	chainFilterForward    = "filter-forward"
	chainFilterOutput     = "filter-output"
	chainFilterOutputPost = "filter-output-post-dnat"
	chainNATPrerouting    = "nat-prerouting"
	chainNATOutput        = "nat-output"
	chainNATPostrouting   = "nat-postrouting"

	chainServices       = "services"
	chainFirewallCheck  = "firewall-check"
	chainEndpointCheck  = "endpoints-check"
	chainClusterIPCheck = "cluster-ips-check"
	chainReject         = "reject-chain"
	chainMarkMasq       = "mark-for-masquerade"
	chainMasquerading   = "masquerading"

	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	mapFirewallIPs         = "firewall-ips"
	setNodePortIPs         = "nodeport-ips"
	setClusterCIDRs        = "cluster-cidrs"
	setHairpin             = "hairpin-endpoints"
	setClusterIPs          = "cluster-ips"
)

// Prefixes of the per-service-port object names. Every per-service name
// contains a "/", which no fixed name does.
const (
	prefixService   = "service-"
	prefixLocal     = "local-"
	prefixExternal  = "external-"
	prefixFirewall  = "firewall-"
	prefixEndpoint  = "endpoint-"
	prefixAffinity  = "affinity-"
	prefixEndpoints = "endpoints-"
	prefixLocalEPs  = "local-endpoints-"
)

// prefixEndpointMap names the maps of endpoint addresses the service
// ports without affinity DNAT with: service-endpoints-0, -1, ..., each
// shared by endpointMapPorts ports (by id).
const prefixEndpointMap = "service-endpoints-"

// endpointMapPorts is how many ports (consecutive ids) share one
// service-endpoints map. The kernel makes the count a trade-off: it finds
// a map by walking a list of all the table's sets (each rule naming a
// map, each batch of elements, each new set), so thousands of per-port
// maps make a full sync quadratic in the number of ports; and each
// element written to a map is checked against every rule that looks the
// map up, so one map for all ports makes it quadratic too. With 16 ports
// a map, 10 000 ports make 625 maps, and an element is checked against
// at most 32 rules.
const endpointMapPorts = 16

// endpointMapName is the name of the service-endpoints map of the port
// numbered id.
func endpointMapName(id uint32) string {
	return prefixEndpointMap + strconv.FormatUint(uint64(id/endpointMapPorts), 10)
}

// maxNameLen is the longest chain or set name the kernel accepts
// (NFT_NAME_MAXLEN minus the terminating NUL).
const maxNameLen = 255

// servicePortNames are the names of one service port's objects.
type servicePortNames struct {
	// service holds the Cluster-policy endpoint choice, local the
	// Local-policy one; external is where external destinations go
	// first, firewall checks loadBalancerSourceRanges.
	service, local, external, firewall string
	// serviceMap and localMap are the numgen verdict maps of the two
	// endpoint-choosing chains of a port with ClientIP affinity.
	serviceMap, localMap string
	// comment tags the port's elements in the shared maps whose verdict
	// names none of the port's chains (drop, reject): the readable part
	// of its chains' names, after their hash (see portHash). Elements
	// that go to one of the port's chains carry none: the chain's name
	// says whose they are.
	comment string
	base    string
}

// namesFor derives the names of a service port's objects from the port's
// identity only, so that they survive agent restarts: a hash (which keeps
// names unique and tells similar ones apart at a glance) followed by a
// readable namespace/name/protocol/port.
func namesFor(n model.ServicePortName) servicePortNames {
	readable := n.Namespace + "/" + n.Name + "/" + strings.ToLower(string(n.Protocol)) + "/" + n.Port
	base := hashed(readable)
	return servicePortNames{
		service:    limit(prefixService + base),
		local:      limit(prefixLocal + base),
		external:   limit(prefixExternal + base),
		firewall:   limit(prefixFirewall + base),
		serviceMap: limit(prefixEndpoints + base),
		localMap:   limit(prefixLocalEPs + base),
		comment:    readable,
		base:       readable,
	}
}

// endpointNames returns the chain and affinity set names of one endpoint
// of the service port whose readable base name is base.
func endpointNames(base string, ep model.Endpoint) (chain, affinity string) {
	// Colons of IPv6 addresses would need quoting in nft's syntax.
	ip := strings.ReplaceAll(ep.IP.String(), ":", ".")
	h := hashed(base + "__" + ip + "/" + strconv.Itoa(int(ep.Port)))
	return limit(prefixEndpoint + h), limit(prefixAffinity + h)
}

// portChainPrefixes are the prefixes of the chains a service port owns
// as a whole (not those of its endpoints).
var portChainPrefixes = []string{prefixService, prefixLocal, prefixExternal, prefixFirewall}

// portHash returns the hash in the name of a chain a service port owns
// as a whole, which tells the port apart from every other, or "" for
// any other chain. The comment of the port's elements hashes to it too.
func portHash(chain string) string {
	for _, p := range portChainPrefixes {
		if rest, ok := strings.CutPrefix(chain, p); ok && len(rest) > hashLen && rest[hashLen] == '-' && strings.Contains(rest, "/") {
			return rest[:hashLen]
		}
	}
	return ""
}

// hashLen is the length of the hash in front of per-service names.
const hashLen = 8

// hashed prefixes s with its nameHash.
func hashed(s string) string {
	h := nameHash(s)
	return string(h[:]) + "-" + s
}

// nameHash is the 8 base32 characters of s's SHA-256 that begin the
// names of s's objects: the encoding of its first 5 bytes.
func nameHash(s string) [hashLen]byte {
	sum := sha256.Sum256([]byte(s))
	var h [hashLen]byte
	base32.StdEncoding.Encode(h[:], sum[:hashLen*5/8])
	return h
}

// limit truncates a name the kernel would refuse; the hash in front keeps
// truncated names unique.
func limit(name string) string {
	if len(name) > maxNameLen {
		return name[:maxNameLen-3] + "..."
	}
	return name
}
