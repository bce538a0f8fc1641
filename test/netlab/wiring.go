package netlab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Every link helper below works through a netlink handle bound to one of
// the test's namespaces, so a link is created inside its namespace (a
// veth's peer directly inside the other one) and never, even for a
// moment, in the root namespace.

// handle opens a netlink handle bound to ns. The caller closes it.
func (ns *NetNS) handle() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(ns.Handle, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", ns.Name, err)
	}
	return h, nil
}

// AddBridge creates a bridge called name in ns, gives it addr (when
// valid) and sets it up.
func (ns *NetNS) AddBridge(name string, addr netip.Prefix) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s in %s: %w", name, ns.Name, err)
	}
	if addr.IsValid() {
		if err := addAddr(h, br, addr); err != nil {
			return fmt.Errorf("bridge %s in %s: %w", name, ns.Name, err)
		}
	}
	if err := h.LinkSetUp(br); err != nil {
		return fmt.Errorf("set bridge %s up in %s: %w", name, ns.Name, err)
	}
	return nil
}

// AddVeth creates a veth pair with one end called name in ns and the other
// called peerName in peer, and sets both ends up. Addresses and bridge
// ports are set with AddAddr and SetMaster.
func (ns *NetNS) AddVeth(name string, peer *NetNS, peerName string) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      peerName,
		PeerNamespace: netlink.NsFd(peer.FD()),
	}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s (%s) / %s (%s): %w", name, ns.Name, peerName, peer.Name, err)
	}
	if err := ns.SetUp(name); err != nil {
		return err
	}
	return peer.SetUp(peerName)
}

// withLink opens a handle bound to ns, finds the link called name and
// calls f with both; f's error is said to be about that link.
func (ns *NetNS) withLink(name string, f func(h *netlink.Handle, link netlink.Link) error) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", name, ns.Name, err)
	}
	if err := f(h, link); err != nil {
		return fmt.Errorf("%s in %s: %w", name, ns.Name, err)
	}
	return nil
}

// SetUp sets the link called name in ns up.
func (ns *NetNS) SetUp(name string) error {
	return ns.withLink(name, func(h *netlink.Handle, link netlink.Link) error {
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
		return nil
	})
}

// DeleteLink deletes the link called name in ns; deleting one end of a
// veth pair deletes the other end too.
func (ns *NetNS) DeleteLink(name string) error {
	return ns.withLink(name, func(h *netlink.Handle, link netlink.Link) error {
		if err := h.LinkDel(link); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		return nil
	})
}

// AddAddr adds addr to the link called name in ns.
func (ns *NetNS) AddAddr(name string, addr netip.Prefix) error {
	return ns.withLink(name, func(h *netlink.Handle, link netlink.Link) error {
		return addAddr(h, link, addr)
	})
}

// addAddr adds addr to link. An IPv6 address skips duplicate address
// detection (nodad), so it is usable at once.
func addAddr(h *netlink.Handle, link netlink.Link, addr netip.Prefix) error {
	a := &netlink.Addr{IPNet: ipNet(addr)}
	if addr.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(link, a); err != nil {
		return fmt.Errorf("add address %s: %w", addr, err)
	}
	return nil
}

// SetMaster makes the link called name in ns a port of the bridge called
// bridge in the same namespace, with hairpin mode on so a pod can reach
// itself through a service, as bridge CNI plugins set it.
func (ns *NetNS) SetMaster(name, bridge string) error {
	return ns.withLink(name, func(h *netlink.Handle, link netlink.Link) error {
		br, err := h.LinkByName(bridge)
		if err != nil {
			return fmt.Errorf("find bridge %s: %w", bridge, err)
		}
		if err := h.LinkSetMaster(link, br); err != nil {
			return fmt.Errorf("attach to %s: %w", bridge, err)
		}
		if err := h.LinkSetHairpin(link, true); err != nil {
			return fmt.Errorf("hairpin on: %w", err)
		}
		return nil
	})
}

// ipNet is p as net.IPNet, IPv4 or IPv6.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// AddRoute routes dst via the gateway via in ns; dst 0.0.0.0/0 (::/0) is
// the default route. Both are IPv4 or both IPv6.
func (ns *NetNS) AddRoute(dst netip.Prefix, via netip.Addr) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	route := &netlink.Route{
		Dst: ipNet(dst),
		Gw:  via.AsSlice(),
	}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("route %s via %s in %s: %w", dst, via, ns.Name, err)
	}
	return nil
}

// SetSysctl writes value to the sysctl key (e.g. "net/ipv4/ip_forward")
// of ns. /proc/sys/net shows the namespace of the thread that opens it, so
// the write happens inside Do and never reaches the root namespace.
func (ns *NetNS) SetSysctl(key, value string) error {
	return ns.Do(func() error {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, ns.Name, err)
		}
		return nil
	})
}

// Sysctl reads the sysctl key of ns.
func (ns *NetNS) Sysctl(key string) (string, error) {
	var v []byte
	err := ns.Do(func() error {
		var err error
		v, err = os.ReadFile(filepath.Join("/proc/sys", key))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("sysctl %s in %s: %w", key, ns.Name, err)
	}
	return strings.TrimSpace(string(v)), nil
}

// ipv4Only turns IPv6 off in ns (DisableIPv6), so it sends no IPv6
// packets at all (no router solicitations, no duplicate address
// detection): what the namespaces of programs outside tests (CreateNetNS:
// the local cluster, the demo, benchmarks) are, the test labs being
// dual-stack. It also turns reverse-path filtering off, which new
// namespaces otherwise inherit from the host and which would drop
// service traffic whose reply path differs from its request path.
func (ns *NetNS) ipv4Only() error {
	for _, key := range []string{"net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter"} {
		if err := ns.SetSysctl(key, "0"); err != nil {
			return err
		}
	}
	return ns.DisableIPv6()
}
