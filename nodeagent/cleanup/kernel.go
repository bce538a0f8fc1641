package cleanup

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/google/nftables"
	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/ipvsfamily"
)

var nftFamilies = []struct {
	f    nftables.TableFamily
	name string
}{{nftables.TableFamilyIPv4, "ip"}, {nftables.TableFamilyIPv6, "ip6"}, {nftables.TableFamilyINet, "inet"}}

// nft sweeps the owned nftables tables. A table owned by its name but
// refused by names.NFTCheck is left, and its error returned by a removal.
func (s *Sweeper) nft(names *Names, remove bool) (bool, []string, error) {
	if names.NFTTable == nil {
		return false, nil, nil
	}
	c, err := nftables.New(nftables.WithNetNSFd(s.NS.FD()))
	if err != nil {
		return false, nil, fmt.Errorf("nftables: %w", err)
	}
	found := false
	var lines []string
	var errs []error
	for _, fam := range nftFamilies {
		tables, err := c.ListTablesOfFamily(fam.f)
		if err != nil {
			if noNFTables(err) {
				return false, nil, nil
			}
			return found, lines, errors.Join(append(errs, fmt.Errorf("nftables: list %s tables: %w", fam.name, err))...)
		}
		for _, t := range tables {
			if !names.NFTTable(t.Name) {
				continue
			}
			if names.NFTCheck != nil {
				if err := names.NFTCheck(s.NS, fam.f, fam.name, t.Name); err != nil {
					if remove {
						errs = append(errs, err)
					}
					continue
				}
			}
			found = true
			if !remove {
				continue
			}
			c.DelTable(t)
			if err := c.Flush(); err != nil {
				return found, lines, errors.Join(append(errs, fmt.Errorf("nftables: delete table %s %s: %w", fam.name, t.Name, err))...)
			}
			lines = append(lines, fmt.Sprintf("nftables table %s %s", fam.name, t.Name))
		}
	}
	return found, lines, errors.Join(errs...)
}

func noNFTables(err error) bool {
	return errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.EAFNOSUPPORT)
}

func (s *Sweeper) handle(families ...int) (*netlink.Handle, error) {
	if h, ok := s.NS.Handle(); ok {
		return netlink.NewHandleAt(h, families...)
	}
	return netlink.NewHandle(families...)
}

// ipsets sweeps the owned ipsets.
func (s *Sweeper) ipsets(names *Names, remove bool) (bool, []string, error) {
	if names.IPSet == nil {
		return false, nil, nil
	}
	h, err := s.handle(unix.NETLINK_NETFILTER)
	if err != nil {
		return false, nil, fmt.Errorf("ipset: %w", err)
	}
	defer h.Close()
	sets, err := h.IpsetListAll()
	if err != nil {
		if noIPSet(err) {
			return false, nil, nil
		}
		return false, nil, fmt.Errorf("ipset: list: %w", err)
	}
	found := false
	var lines []string
	var errs []error
	for _, set := range sets {
		if !names.IPSet(set.SetName) {
			continue
		}
		found = true
		if !remove {
			continue
		}
		if err := h.IpsetDestroy(set.SetName); err != nil {
			errs = append(errs, fmt.Errorf("ipset: destroy %s: %w", set.SetName, err))
			continue
		}
		lines = append(lines, "ipset "+set.SetName)
	}
	return found, lines, errors.Join(errs...)
}

// noIPSet says the kernel has no ip_set.
func noIPSet(err error) bool {
	return errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOENT)
}

// ownedLinks lists the owned interfaces.
func (s *Sweeper) ownedLinks(names *Names) ([]netlink.Link, *netlink.Handle, error) {
	h, err := s.handle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, nil, err
	}
	links, err := h.LinkList()
	if err != nil {
		h.Close()
		return nil, nil, fmt.Errorf("list interfaces: %w", err)
	}
	var out []netlink.Link
	for _, l := range links {
		if names.Link != nil && names.Link(l.Attrs().Name) && l.Type() == "dummy" {
			out = append(out, l)
		}
	}
	return out, h, nil
}

// links sweeps the owned dummy interfaces.
func (s *Sweeper) links(names *Names, remove bool) (bool, []string, error) {
	if names.Link == nil {
		return false, nil, nil
	}
	links, h, err := s.ownedLinks(names)
	if err != nil {
		return false, nil, err
	}
	defer h.Close()
	var lines []string
	var errs []error
	for _, l := range links {
		if !remove {
			continue
		}
		if err := h.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete interface %s: %w", l.Attrs().Name, err))
			continue
		}
		lines = append(lines, "interface "+l.Attrs().Name)
	}
	return len(links) > 0, lines, errors.Join(errs...)
}

// ipvs sweeps the IPVS virtual services whose address is on an owned
// interface. Without IPVS in the kernel there are none, and moby/ipvs is
// not opened (see ipvsfamily).
func (s *Sweeper) ipvs(names *Names, remove bool) (bool, []string, error) {
	if names.Link == nil {
		return false, nil, nil
	}
	if loaded, err := ipvsfamily.Loaded(); err != nil || !loaded {
		return false, nil, err
	}
	links, h, err := s.ownedLinks(names)
	if err != nil {
		return false, nil, err
	}
	defer h.Close()
	owned := map[string]bool{}
	for _, l := range links {
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return false, nil, fmt.Errorf("list the addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			owned[a.IP.String()] = true
		}
	}
	if len(owned) == 0 {
		return false, nil, nil
	}
	ih, err := ipvs.New(s.NS.Path())
	if err != nil {
		return false, nil, fmt.Errorf("ipvs: %w", err)
	}
	defer ih.Close()
	svcs, err := ih.GetServices()
	if err != nil {
		return false, nil, fmt.Errorf("ipvs: list services: %w", err)
	}
	found := false
	var lines []string
	var errs []error
	for _, svc := range OwnedIPVS(svcs, owned) {
		found = true
		if !remove {
			continue
		}
		if err := ih.DelService(svc); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: delete %s: %w", describeIPVS(svc), err))
			continue
		}
		lines = append(lines, "IPVS service "+describeIPVS(svc))
	}
	return found, lines, errors.Join(errs...)
}

// OwnedIPVS picks the virtual services whose address is one of addrs
// (address strings as net.IP prints them).
func OwnedIPVS(svcs []*ipvs.Service, addrs map[string]bool) []*ipvs.Service {
	var out []*ipvs.Service
	for _, svc := range svcs {
		if svc.Address != nil && addrs[svc.Address.String()] {
			out = append(out, svc)
		}
	}
	return out
}

func describeIPVS(svc *ipvs.Service) string {
	proto := map[uint16]string{unix.IPPROTO_TCP: "TCP", unix.IPPROTO_UDP: "UDP", unix.IPPROTO_SCTP: "SCTP"}[svc.Protocol]
	if proto == "" {
		proto = fmt.Sprintf("proto-%d", svc.Protocol)
	}
	return fmt.Sprintf("%s %s", proto, net.JoinHostPort(svc.Address.String(), fmt.Sprint(svc.Port)))
}
