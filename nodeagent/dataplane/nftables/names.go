package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"strconv"
	"strings"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// TableName is the name of proxyshift's main table in the ip and ip6
// families; the service tables' names start with it (TableNames).
// Nothing outside these tables is ever created, changed or deleted.
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

// serviceTables is how many service tables each family has, besides
// the main table: every service port's DNAT chains are in one of them,
// chosen by its name (servicePortNames.table). The kernel makes the
// number a trade-off (see the README, Tables): it validates a whole table
// whenever a transaction adds a rule that DNATs, which an endpoint change
// does, so each change pays for the service ports of one table only;
// and a new connection is looked up in each table's dispatch map, one
// lookup each, until one DNATs it.
const serviceTables = 16

// serviceTablePrefix begins the names of the service tables.
const serviceTablePrefix = TableName + "-services-"

// serviceTableName is the name of service table i (0 to serviceTables-1).
func serviceTableName(i int) string { return serviceTablePrefix + strconv.Itoa(i) }

// TableNames are the names of the tables the backend owns in each
// family: the main table (TableName), then the service tables.
func TableNames() []string {
	names := []string{TableName}
	for i := range serviceTables {
		names = append(names, serviceTableName(i))
	}
	return names
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
	// table is the service table of the port's DNAT chains (0 to
	// serviceTables-1).
	table int
}

// namesFor derives the names of a service port's objects from the port's
// identity only, so that they survive agent restarts: a hash (which keeps
// names unique and tells similar ones apart at a glance) followed by a
// readable namespace/name/protocol/port.
func namesFor(n model.ServicePortName) servicePortNames {
	readable := n.Namespace + "/" + n.Name + "/" + strings.ToLower(string(n.Protocol)) + "/" + n.Port
	base := hashed(readable)
	return servicePortNames{
		// The hash's first character is one of base32's 32, two for each
		// table: about as many ports in each.
		table:      strings.IndexByte(base32Alphabet, base[0]) % serviceTables,
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

// base32Alphabet is the alphabet of the hashes in names.
const base32Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

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
