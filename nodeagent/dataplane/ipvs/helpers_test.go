package ipvs

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
)

// testConfig is a node with one NodePort address, a pod network and the
// usual masquerade bit.
var testConfig = dataplane.NodeConfig{
	NodeName:      "node-1",
	NodeIPs:       []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")},
	ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")},
	MasqueradeBit: 14,
}

// testRenderConfig renders family f of cfg with the round-robin scheduler.
func testRenderConfig(f *family, cfg dataplane.NodeConfig) *renderConfig {
	rc := &renderConfig{f: f, policy: dataplane.NewNodePolicy(cfg, f.Model), scheduler: "rr"}
	rc.nodePortIPs = rc.policy.NodePortIPs
	return rc
}

// familyOf is the family of a model family.
func familyOf(f corev1.IPFamily) *family {
	if f == corev1.IPv6Protocol {
		return ipv6
	}
	return ipv4
}

// dumpState renders a family's state the way the kernel would list it:
// virtual services with their real servers, the dummy interface's
// addresses, and the helper table's elements (the fixed chains are in
// table.golden).
func dumpState(st *familyState) string {
	var b strings.Builder
	services := st.services()
	for _, k := range sortedKeys(services) {
		vs := services[k]
		fmt.Fprintf(&b, "virtual service %s %s", k, vs.scheduler)
		if vs.timeout > 0 {
			fmt.Fprintf(&b, " persistent %d", vs.timeout)
		}
		fmt.Fprintf(&b, " (%s)\n", st.owners[k])
		for _, d := range sortedAddrPorts(vs.dests) {
			fmt.Fprintf(&b, "  -> %s weight %d\n", d, vs.dests[d])
		}
	}
	for _, a := range sortedAddrs(st.addrRefs) {
		fmt.Fprintf(&b, "bound %s\n", a)
	}
	for _, e := range st.elements() {
		fmt.Fprintf(&b, "element %s\n", e.id())
	}
	return b.String()
}

// dumpTable renders the helper table's chains as nft lists them (the sets
// are in the elements dumpState lists).
func dumpTable(f *family, chains []nft.Chain) string {
	var b strings.Builder
	b.WriteString("table " + f.Name + " " + TableName + " {\n")
	for i := range chains {
		chains[i].Dump(&b)
	}
	b.WriteString("}\n")
	return b.String()
}
