package dataplane_test

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	agentbackends "github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/ipvs"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/vm"
)

// The IPVS backend's row helpers. IPVS needs the ip_vs modules, which
// only the test VM loads (make test-vm); elsewhere the row skips. The
// helpers reach IPVS through moby/ipvs and the dummy interface through
// rtnetlink, both in the node namespace, and touch only what the backend
// owns.

// ipvsAffinityLinger is how long IPVS may keep a client's persistence
// template past the affinity timeout when the client resets its
// connections: each connection entry the template controls lives on in
// state CLOSE for 10 s, longer than briefAffinity, so at its timeout the
// template still controls entries and is checked again only 60 s later
// (ip_vs_conn_expire), when they are gone. The 10 s more are margin. See
// "Session affinity timeouts" in the backend's README.
const ipvsAffinityLinger = 60*time.Second + 10*time.Second

// skipWithoutIPVS skips outside the test VM, naming what is missing.
func skipWithoutIPVS(t *testing.T, _ *netlab.NetNS) {
	t.Helper()
	vm.Require(t, "IPVS (the ip_vs kernel module)")
}

// newIPVS creates the IPVS backend programming node, once the modules
// the mode needs are loaded, as a switch's Preparing loads them; the
// backend holds no sockets between calls, so there is nothing to clean
// up.
func newIPVS(t *testing.T, node *netlab.NetNS, cfg dataplane.NodeConfig) dataplane.Backend {
	t.Helper()
	mods, err := contract.ModulesFor(v1alpha1.ModeIPVS, "")
	if err != nil {
		t.Fatal(err)
	}
	vm.LoadModules(t, mods...)
	opts, err := agentbackends.IPVSOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ipvs.New(cfg, append(opts, ipvs.WithNetNS(node.NS()))...)
	if err != nil {
		t.Fatalf("ipvs.New: %v", err)
	}
	return b
}

// ipvsHandle opens moby/ipvs in node.
func ipvsHandle(node *netlab.NetNS) (*libipvs.Handle, error) {
	return libipvs.New(fmt.Sprintf("/proc/self/fd/%d", node.FD()))
}

// ipvsDrift deletes the web service's virtual service of family fam and
// the helper table of fam (ip or ip6) behind the backend's back: the
// service stops answering, and what tells NodePort virtual services
// apart is gone.
func ipvsDrift(t *testing.T, node *netlab.NetNS, fam ipFamily) {
	t.Helper()
	h, err := ipvsHandle(node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	webAddr, af := fam.addr(webIP), uint16(unix.AF_INET)
	if webAddr.Is6() {
		af = unix.AF_INET6
	}
	web := &libipvs.Service{AddressFamily: af, Protocol: unix.IPPROTO_TCP, Address: net.IP(webAddr.AsSlice()), Port: 80}
	if err := h.DelService(web); err != nil {
		t.Fatalf("delete virtual service %s: %v", netip.AddrPortFrom(webAddr, 80), err)
	}
	c, err := nftConn(node)
	if err != nil {
		t.Fatal(err)
	}
	family, familyName := nftFamily(fam)
	if tables, err := c.ListTablesOfFamily(family); err == nil {
		for _, table := range tables {
			if table.Name == ipvs.TableName {
				c.DelTable(table)
			}
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("delete table %s %s: %v", familyName, ipvs.TableName, err)
	}
}

// ipvsDump renders every virtual service in node with its real servers,
// the dummy interface's addresses, and the nftables tables.
func ipvsDump(node *netlab.NetNS) string {
	var b strings.Builder
	h, err := ipvsHandle(node)
	if err != nil {
		return "ipvs: " + err.Error()
	}
	defer h.Close()
	services, err := h.GetServices()
	if err != nil {
		fmt.Fprintf(&b, "list virtual services: %v\n", err)
	}
	var lines []string
	for _, s := range services {
		line := fmt.Sprintf("virtual service %d/%s sched %s flags %#x timeout %d", s.Protocol,
			netip.AddrPortFrom(addrOf(s.Address), s.Port), s.SchedName, s.Flags, s.Timeout)
		if s.FWMark != 0 {
			line = fmt.Sprintf("virtual service fwmark %d sched %s", s.FWMark, s.SchedName)
		}
		dests, err := h.GetDestinations(s)
		if err != nil {
			line += fmt.Sprintf("\n  real servers: %v", err)
		}
		for _, d := range dests {
			line += fmt.Sprintf("\n  -> %s weight %d active %d inactive %d", netip.AddrPortFrom(addrOf(d.Address), d.Port),
				d.Weight, d.ActiveConnections, d.InactiveConnections)
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	b.WriteString(strings.Join(lines, "\n") + "\n")
	if nl, err := netlink.NewHandleAt(node.Handle, unix.NETLINK_ROUTE); err == nil {
		if l, err := nl.LinkByName(ipvs.DummyInterface); err == nil {
			addrs, _ := nl.AddrList(l, netlink.FAMILY_ALL)
			fmt.Fprintf(&b, "%s (%s): %v\n", ipvs.DummyInterface, l.Attrs().OperState, addrs)
		} else {
			fmt.Fprintf(&b, "%s: %v\n", ipvs.DummyInterface, err)
		}
		nl.Close()
	}
	return b.String() + nftDump(node)
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}
