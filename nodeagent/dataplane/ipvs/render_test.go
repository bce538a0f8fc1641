package ipvs

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
)

// TestRenderGolden pins down what each kind of service becomes: virtual
// services and real servers, bound addresses and helper-table elements.
func TestRenderGolden(t *testing.T) {
	for _, sc := range dt.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			st, conflicts := newState(testRenderConfig(familyOf(sc.Family), sc.Config), dt.PortsOf(sc.Ports...), nil)
			if len(conflicts) > 0 {
				t.Errorf("conflicts without foreign virtual services: %v", conflicts)
			}
			dt.Golden(t, sc.Name, dumpState(st))
		})
	}
}

// TestTableChains pins down the helper table's fixed chains.
func TestTableChains(t *testing.T) {
	var b strings.Builder
	for _, f := range families {
		p := dataplane.NewNodePolicy(testConfig, f.Model)
		b.WriteString(dumpTable(f, tableChains(f, p.ClusterCIDRs, p.MasqueradeMark)))
	}
	dt.Golden(t, "table", b.String())
}

// TestRenderIsPure checks that rendering the same model twice gives the
// same result.
func TestRenderIsPure(t *testing.T) {
	ports := dt.PortsOf(
		dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.NodePort(30080), dt.LB("198.18.100.1"), dt.SourceRanges("203.0.113.0/24"),
			dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080, dt.Local)),
		dt.Svc("default", "b", "http", "10.96.0.61", 80, dt.ExternalIPs("198.18.50.8"), dt.EP("10.244.1.21", 8080)),
	)
	a, _ := newState(testRenderConfig(ipv4, testConfig), ports, nil)
	b, _ := newState(testRenderConfig(ipv4, testConfig), ports, nil)
	if dumpState(a) != dumpState(b) {
		t.Errorf("two renders differ:\n%s\n---\n%s", dumpState(a), dumpState(b))
	}
}

// TestNodePortsOnEveryLocalAddress checks that node ports get a virtual
// service on each address the node has when none are configured.
func TestNodePortsOnEveryLocalAddress(t *testing.T) {
	cfg := testConfig
	cfg.NodeIPs = nil
	rc := testRenderConfig(ipv4, cfg)
	rc.nodePortIPs = dt.Addrs("10.0.0.5", "192.168.1.10")
	st, _ := newState(rc, dt.PortsOf(dt.Svc("default", "np", "http", "10.96.0.11", 80, dt.NodePort(30080), dt.EP("10.244.1.5", 8080))), nil)
	services := st.services()
	for _, want := range []string{"tcp/10.0.0.5:30080", "tcp/192.168.1.10:30080", "tcp/10.96.0.11:80"} {
		found := false
		for k := range services {
			found = found || k.String() == want
		}
		if !found {
			t.Errorf("no virtual service %s in\n%s", want, dumpState(st))
		}
	}
	if len(services) != 3 {
		t.Errorf("%d virtual services, want 3:\n%s", len(services), dumpState(st))
	}
}

func TestKernelBefore(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"6.1.0-57-cloud-amd64", false},
		{"5.9.0", false},
		{"5.8.18-100.fc31.x86_64", true},
		{"4.19.0-21-amd64", true},
		{"5.10", false},
		{"garbage", false},
	} {
		if got := kernelBefore(tc.release, 5, 9); got != tc.want {
			t.Errorf("kernelBefore(%q, 5, 9) = %v, want %v", tc.release, got, tc.want)
		}
	}
}

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
