// Package kernelstate reads what a lab node's kernel holds of each of
// proxyshift's modes: the nftables tables and chains (iptables-nft's
// among them), iptables-legacy's rules, the IPVS mode's dummy interface
// and the IPVS virtual services. Tests that switch a node between modes
// (test/vmswitch, test/vmcluster) use it to check that nothing of the old
// mode is left and that the new one is there. It reads through netlink
// (no nft or ipvsadm binary: the test VM has none) and the
// iptables-legacy-save programs, inside the node's namespace only.
package kernelstate

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	gnft "github.com/google/nftables"
	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/ipvs"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/nftables"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Modes are the modes State.Holds tells about.
var Modes = []v1alpha1.ProxyMode{v1alpha1.ModeNFTables, v1alpha1.ModeIPVS, v1alpha1.ModeIPTables}

// State is what one namespace's kernel holds, as Read found it.
type State struct {
	// NFT lists the nftables tables ("ip proxyshift") and their chains
	// ("ip nat PROXYSHIFT-SERVICES"), sorted.
	NFT []string
	// IPTablesLegacy is what iptables-legacy-save and
	// ip6tables-legacy-save print.
	IPTablesLegacy string
	// DummyInterface says whether the IPVS mode's dummy interface exists.
	DummyInterface bool
	// VirtualServices are the IPVS virtual services (see
	// VirtualServices).
	VirtualServices string
}

// Read reads the state of ns's kernel. The IPVS part needs the ip_vs
// module loaded (inside the test VM).
func Read(ns *netlab.NetNS) (*State, error) {
	s := &State{}
	var err error
	if s.NFT, err = nftObjects(ns.FD()); err != nil {
		return nil, err
	}
	for _, bin := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := ns.NS().Output(context.Background(), nil, bin)
		if err != nil {
			return nil, fmt.Errorf("%s in %s: %w", bin, ns.Name, err)
		}
		s.IPTablesLegacy += string(out)
	}
	h, err := netlink.NewHandleAt(ns.Handle, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	_, lerr := h.LinkByName(ipvs.DummyInterface)
	h.Close()
	s.DummyInterface = lerr == nil
	ih, err := libipvs.New(fmt.Sprintf("/proc/self/fd/%d", ns.FD()))
	if err != nil {
		return nil, fmt.Errorf("IPVS netlink in %s: %w", ns.Name, err)
	}
	defer ih.Close()
	if s.VirtualServices, err = VirtualServices(ih); err != nil {
		return nil, err
	}
	return s, nil
}

// Holds says, for each of Modes, whether the kernel holds objects of it:
// nftables mode's table proxyshift; the IPVS mode's helper tables, dummy
// interface, or a virtual service on one of serviceIPs (other programs'
// virtual services elsewhere are not its); the iptables mode's
// PROXYSHIFT- chains in either iptables variant.
func (s *State) Holds(serviceIPs ...netip.Addr) map[v1alpha1.ProxyMode]bool {
	has := func(o string) bool { return slices.Contains(s.NFT, o) }
	onService := false
	for _, ip := range serviceIPs {
		if strings.Contains(s.VirtualServices, " "+ip.String()+":") {
			onService = true
		}
	}
	return map[v1alpha1.ProxyMode]bool{
		v1alpha1.ModeNFTables: has("ip "+nftables.TableName) || has("ip6 "+nftables.TableName),
		v1alpha1.ModeIPVS:     has("ip "+ipvs.TableName) || has("ip6 "+ipvs.TableName) || s.DummyInterface || onService,
		v1alpha1.ModeIPTables: strings.Contains(s.IPTablesLegacy, "PROXYSHIFT-") ||
			slices.ContainsFunc(s.NFT, func(o string) bool { return strings.Contains(o, " PROXYSHIFT-") }),
	}
}

// Only describes how the state differs from holding the objects of mode
// and none of the other modes' ("" for none at all), one line per
// difference, or returns nil when it does not.
func (s *State) Only(mode v1alpha1.ProxyMode, serviceIPs ...netip.Addr) []string {
	holds := s.Holds(serviceIPs...)
	var out []string
	for _, m := range Modes {
		switch has := holds[m]; {
		case m == mode && !has:
			out = append(out, fmt.Sprintf("the kernel holds nothing of %s", m))
		case m != mode && has:
			out = append(out, fmt.Sprintf("leftovers of %s with %q serving", m, mode))
		}
	}
	return out
}

// String is the whole state, for failure messages.
func (s *State) String() string {
	return fmt.Sprintf("nftables:\n%s\niptables-legacy:\n%s\ndummy interface %s: %v\nvirtual services:\n%s",
		strings.Join(s.NFT, "\n"), s.IPTablesLegacy, ipvs.DummyInterface, s.DummyInterface, s.VirtualServices)
}

// nftObjects lists the nftables tables in the namespace fd ("ip name")
// and their chains ("ip name chain"), iptables-nft's among them.
func nftObjects(fd int) ([]string, error) {
	c, err := gnft.New(gnft.WithNetNSFd(fd))
	if err != nil {
		return nil, err
	}
	tables, err := c.ListTables()
	if err != nil {
		return nil, err
	}
	chains, err := c.ListChains()
	if err != nil {
		return nil, err
	}
	families := map[gnft.TableFamily]string{gnft.TableFamilyIPv4: "ip", gnft.TableFamilyIPv6: "ip6", gnft.TableFamilyINet: "inet"}
	var out []string
	for _, tb := range tables {
		out = append(out, families[tb.Family]+" "+tb.Name)
	}
	for _, ch := range chains {
		out = append(out, families[ch.Table.Family]+" "+ch.Table.Name+" "+ch.Name)
	}
	slices.Sort(out)
	return out, nil
}

// VirtualServices renders the virtual services h sees, one per line
// ("proto 6 198.19.0.10:80 fwmark 0 sched rr"), sorted: an
// ipvsadm-equivalent dump.
func VirtualServices(h *libipvs.Handle) (string, error) {
	services, err := h.GetServices()
	if err != nil {
		return "", err
	}
	var lines []string
	for _, s := range services {
		a, _ := netip.AddrFromSlice(s.Address)
		lines = append(lines, fmt.Sprintf("proto %d %s fwmark %d sched %s", s.Protocol, netip.AddrPortFrom(a.Unmap(), s.Port), s.FWMark, s.SchedName))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), nil
}
