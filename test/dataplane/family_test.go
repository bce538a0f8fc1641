package dataplane_test

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// ipFamily is the IP family a run of the suite programs its services in
// and sends its packets over. The suite is written with IPv4 addresses;
// a run over IPv6 uses their twins in the dual-stack lab (netlab.IPv6Of):
// the same services, pods, clients and checks, in the other family.
type ipFamily struct {
	model corev1.IPFamily
	// addr is the family's twin of one of the lab's IPv4 addresses.
	addr func(netip.Addr) netip.Addr
	// prefix is the family's twin of one of the lab's IPv4 prefixes.
	prefix func(netip.Prefix) netip.Prefix
}

// The families the suite runs in.
var (
	ipv4 = ipFamily{
		model:  corev1.IPv4Protocol,
		addr:   func(a netip.Addr) netip.Addr { return a },
		prefix: func(p netip.Prefix) netip.Prefix { return p },
	}
	ipv6 = ipFamily{model: corev1.IPv6Protocol, addr: netlab.IPv6Of, prefix: netlab.IPv6PrefixOf}
)

// nodeConfig is the suite's node in family fam: its address and pod
// network there.
func (fam ipFamily) nodeConfig() dataplane.NodeConfig {
	cfg := nodeConfig
	cfg.NodeIPs = []netip.Addr{fam.addr(netlab.NodeIP)}
	cfg.ClusterCIDRs = []netip.Prefix{fam.prefix(netlab.PodCIDR)}
	return cfg
}

// TestDataplaneIPv6 runs the whole suite over IPv6 in every backend: the
// same services, with IPv6 cluster, external and load-balancer IPs, IPv6
// endpoints and source ranges, NodePorts on the node's IPv6 address, and
// IPv6 packets from the lab's clients and pods.
func TestDataplaneIPv6(t *testing.T) {
	netlab.RequireRoot(t)
	netlab.RequireIPv6(t)
	for _, row := range backends {
		t.Run(row.name, func(t *testing.T) { skipHostRowInVM(t, row); runSuite(t, row, ipv6) })
	}
}
