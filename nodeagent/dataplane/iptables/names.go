package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// ChainPrefix starts the name of every chain proxyshift creates, in the
// nat and filter tables of both families and both iptables backends.
// Nothing else is ever created, changed or deleted, except the jump rules
// from built-in chains into these chains, which the backend adds and
// removes itself.
const ChainPrefix = "PROXYSHIFT-"

// maxChainLen is the longest chain name iptables accepts
// (XT_EXTENSION_MAXNAMELEN minus the terminating NUL).
const maxChainLen = 28

// The chains every table has, whatever the services.
const (
	// nat table.
	chainServices       = "PROXYSHIFT-SERVICES"
	chainNodePorts      = "PROXYSHIFT-NODEPORTS"
	chainMarkMasq       = "PROXYSHIFT-MARK-MASQ"
	chainMarkOffCluster = "PROXYSHIFT-MARK-OFF-CLUSTER"
	chainPostrouting    = "PROXYSHIFT-POSTROUTING"
	// filter table.
	chainFilter         = "PROXYSHIFT-FILTER"
	chainForward        = "PROXYSHIFT-FORWARD"
	chainFirewall       = "PROXYSHIFT-FIREWALL"
	chainEndpointsCheck = "PROXYSHIFT-ENDPOINTS-CHECK"
	chainNodePortsCheck = "PROXYSHIFT-NODEPORTS-CHECK"
)

// targetDNAT is the target of the rules that send a connection to an
// endpoint; Programmed counts endpoints by it.
const targetDNAT = "DNAT"

// The tables proxyshift has chains in.
const (
	tableNAT    = "nat"
	tableFilter = "filter"
)

// Per-service-port chain names. All chains of one service port start
// with the same port prefix, "PROXYSHIFT-" and 8 characters of a hash of
// the port's name whose first is one of T-Z, so that they sort together
// and after every fixed chain (whose names start with E-S). Restores list
// ports in descending order of that prefix. The reason is iptables-nft
// (1.8.x): for each line of a --noflush restore it files the chains the
// line names into a sorted linked list, walking it from the smallest
// name; with this order each walk passes only the fixed chains and the
// current port's chains, instead of every chain named so far, which made
// a full sync of 1000 services take seconds of CPU, and of 10000
// minutes. See the README.
//
//	PROXYSHIFT-<port 10>-SVC  chooses among the cluster endpoints
//	PROXYSHIFT-<port 10>-SVL  chooses among the local endpoints
//	PROXYSHIFT-<port 10>-EXT  external traffic policy
//	PROXYSHIFT-<port 10>-FW   loadBalancerSourceRanges (filter table)
//	PROXYSHIFT-<port 8>-<endpoint 8>  one endpoint under ClientIP affinity
const (
	portHashLen     = 10
	portKeyLen      = 8
	endpointHashLen = 8
)

// portNames are the names of one service port's chains, and the text that
// identifies the port in rule comments.
type portNames struct {
	service, local, external, firewall string
	// key is the port prefix all the port's chains start with.
	key string
	// id is the port's name, namespace/name:port/PROTOCOL; every rule of
	// the port in a fixed chain has a comment starting with it.
	id string
}

// namesFor derives the names of a service port's chains from the port's
// identity only, so that they survive agent restarts.
func namesFor(n model.ServicePortName) portNames {
	id := n.String()
	h := hashed(id)
	// The first character is one of T-Z (see above).
	h = string("TUVWXYZ"[strings.IndexByte(base32Alphabet, h[0])%7]) + h[1:portHashLen]
	base := ChainPrefix + h
	return portNames{
		service:  base + "-SVC",
		local:    base + "-SVL",
		external: base + "-EXT",
		firewall: base + "-FW",
		key:      ChainPrefix + h[:portKeyLen],
		id:       id,
	}
}

// endpointChain names the chain of one endpoint of the port n under
// ClientIP affinity. It is also the name of the endpoint's affinity list.
func endpointChain(n portNames, ep model.Endpoint) string {
	return n.key + "-" + hashed(n.id + " -> " + ep.String())[:endpointHashLen]
}

const base32Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

// hashed returns the hash of s chain names are made of: SHA-256 in
// base32. Tests replace it with a weak one, to make names collide.
var hashed = func(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])
}

// NameCollisionError says two service ports, or two endpoints of one
// port with ClientIP affinity, got the same chain names: their hashes
// collide, in the 8 characters of a port prefix or of an endpoint chain. Programming both
// would merge their rules, so the sync fails instead, naming both.
type NameCollisionError struct {
	// Chain is the name (or port prefix) both would use.
	Chain string
	// First and Second are what collide: two service ports
	// (namespace/name:port/PROTOCOL), or two endpoints of one port
	// (port -> address:port), in sorted order.
	First, Second string
}

// Error names the two and the chain name.
func (e *NameCollisionError) Error() string {
	return fmt.Sprintf("iptables: %s and %s hash to the same chain name %s: neither is synced, rather than merge their rules; rename one of them", e.First, e.Second, e.Chain)
}

// collision returns the error for chain, claimed by a and b.
func collision(chain, a, b string) *NameCollisionError {
	if b < a {
		a, b = b, a
	}
	return &NameCollisionError{Chain: chain, First: a, Second: b}
}

// portKeys records the service port each port prefix (portNames.key)
// belongs to, so that a sync can refuse a second port with the same one.
type portKeys map[string]model.ServicePortName

// claim records that port n uses its port prefix key (namesFor(n).key,
// which its portRules keep), and returns a *NameCollisionError if another
// port has it.
func (pk portKeys) claim(n model.ServicePortName, key string) error {
	if o, ok := pk[key]; ok && o != n {
		return collision(key+"-…", o.String(), n.String())
	}
	pk[key] = n
	return nil
}

// release forgets the prefix of port n.
func (pk portKeys) release(n model.ServicePortName) {
	if key := namesFor(n).key; pk[key] == n {
		delete(pk, key)
	}
}

// blockKey returns the port prefix of a per-port chain name; false for
// a fixed chain or a name proxyshift does not make.
func blockKey(chain string) (string, bool) {
	if len(chain) < len(ChainPrefix)+portKeyLen || !owned(chain) || chain[len(ChainPrefix)] < 'T' {
		return "", false
	}
	return chain[:len(ChainPrefix)+portKeyLen], true
}

// isEndpointChain says whether a chain name is one endpointChain makes.
func isEndpointChain(chain string) bool {
	key, ok := blockKey(chain)
	return ok && len(chain) == len(key)+1+endpointHashLen && chain[len(key)] == '-'
}

// owned says whether a chain is one of proxyshift's.
func owned(chain string) bool { return strings.HasPrefix(chain, ChainPrefix) }
