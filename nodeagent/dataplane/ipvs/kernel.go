package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/ipvsfamily"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// The kernel side: IPVS over generic netlink (moby/ipvs), the dummy
// interface over rtnetlink (vishvananda/netlink), the helper table over
// nftables netlink (google/nftables). Each call targets the backend's
// network namespace through a socket opened there.

// kernel is one operation's sockets in the backend's network namespace.
// Every Sync, Programmed and Cleanup opens its own and closes them when
// done, so that a Backend holds no file descriptors between calls and
// needs no closing.
type kernel struct {
	netns nsexec.NS
	ipvs  ipvsHandle
	nl    *netlink.Handle
}

// open opens the sockets of one operation.
func (b *Backend) open() (*kernel, error) {
	h, err := b.openIPVS()
	if err != nil {
		return nil, err
	}
	// Routing netlink only: the default handle also opens XFRM, which
	// nodes without IPsec modules lack.
	var nl *netlink.Handle
	if ns, ok := b.netns.Handle(); ok {
		nl, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	} else {
		nl, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ipvs: open routing netlink: %w", err)
	}
	return &kernel{netns: b.netns, ipvs: h, nl: nl}, nil
}

// openLibIPVS opens moby/ipvs in the backend's namespace, and only once
// IPVS is loaded: moby/ipvs looks IPVS's netlink family up once per
// process, at the first handle opened, by a request that makes the kernel
// load ip_vs where it can, and runs `modprobe ip_vs` before (an agent's
// start must load no module). Where neither loads it, the failed lookup
// stays for the life of the process, and the ip_vs a switch's Preparing
// loads later would never answer the agent.
func (b *Backend) openLibIPVS() (ipvsHandle, error) {
	switch loaded, err := ipvsfamily.Loaded(); {
	case err != nil:
		return nil, fmt.Errorf("ipvs: %w", err)
	case !loaded:
		return nil, errors.New("ipvs: the kernel has no IPVS (ip_vs is not loaded)")
	}
	h, err := libipvs.New(b.netns.Path())
	if err != nil {
		return nil, fmt.Errorf("ipvs: open IPVS: %w", err)
	}
	return h, nil
}

func (kn *kernel) close() {
	kn.ipvs.Close()
	kn.nl.Close()
}

// ipvsHandle is the part of *libipvs.Handle the backend uses. Tests wrap
// it to see which calls a sync makes.
type ipvsHandle interface {
	GetServices() ([]*libipvs.Service, error)
	GetService(*libipvs.Service) (*libipvs.Service, error)
	GetDestinations(*libipvs.Service) ([]*libipvs.Destination, error)
	NewService(*libipvs.Service) error
	UpdateService(*libipvs.Service) error
	DelService(*libipvs.Service) error
	NewDestination(*libipvs.Service, *libipvs.Destination) error
	UpdateDestination(*libipvs.Service, *libipvs.Destination) error
	DelDestination(*libipvs.Service, *libipvs.Destination) error
	GetConfig() (*libipvs.Config, error)
	SetConfig(*libipvs.Config) error
	Close()
}

// IPVS virtual service flags (include/uapi/linux/ip_vs.h).
const (
	svcFlagPersistent = 0x1
	svcFlagHashed     = 0x2
)

// libService is the library's form of vs.
func libService(f *family, vs *virtualService) *libipvs.Service {
	s := keyService(f, vs.key)
	s.SchedName = vs.scheduler
	s.Netmask = f.netmask
	if vs.timeout > 0 {
		s.Flags, s.Timeout = svcFlagPersistent, vs.timeout
	}
	return s
}

// keyService identifies the virtual service k to the library.
func keyService(f *family, k vsKey) *libipvs.Service {
	return &libipvs.Service{AddressFamily: f.af, Address: net.IP(f.Bytes(k.addr)), Protocol: uint16(k.proto), Port: k.port}
}

func libDestination(f *family, d netip.AddrPort, weight int) *libipvs.Destination {
	return &libipvs.Destination{
		AddressFamily: f.af, Address: net.IP(f.Bytes(d.Addr())), Port: d.Port(),
		Weight: weight, ConnectionFlags: libipvs.ConnectionFlagMasq,
	}
}

// serviceKey reads the key of a virtual service the kernel reports; false
// for one keyed by firewall mark.
func serviceKey(s *libipvs.Service) (vsKey, bool) {
	addr, ok := netip.AddrFromSlice(s.Address)
	if !ok || s.FWMark != 0 {
		return vsKey{}, false
	}
	return vsKey{addr: addr.Unmap(), proto: uint8(s.Protocol), port: s.Port}, true
}

// probeIPVS checks that the handle reaches IPVS: asking for a virtual
// service that does not exist must fail with ESRCH. The library resolves
// the IPVS netlink family once per process; when that happened before
// ip_vs was loaded, its requests go nowhere and "succeed", which this
// catches.
func probeIPVS(h ipvsHandle) error {
	_, err := h.GetService(&libipvs.Service{AddressFamily: unix.AF_INET, Protocol: unix.IPPROTO_TCP, Address: net.IPv4zero.To4()})
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return fmt.Errorf("ipvs: IPVS does not answer: %v", err)
}

// readServices reads the virtual services of family f, ours with their
// real servers and the keys of everyone else's. A virtual service is
// ours when the helper table records it, when its address is bound to
// the dummy interface, or when known says so (what this process
// programmed).
func (kn *kernel) readServices(f *family, records map[vsKey]string, dummyAddrs []netip.Addr, known map[vsKey]bool) (ours map[vsKey]*virtualService, foreign map[vsKey]bool, err error) {
	all, err := kn.ipvs.GetServices()
	if err != nil {
		return nil, nil, fmt.Errorf("ipvs: list virtual services: %w", err)
	}
	ours, foreign = map[vsKey]*virtualService{}, map[vsKey]bool{}
	bound := make(map[netip.Addr]bool, len(dummyAddrs))
	for _, a := range dummyAddrs {
		bound[a] = true
	}
	for _, s := range all {
		k, ok := serviceKey(s)
		if s.AddressFamily != f.af || !ok {
			continue
		}
		if _, recorded := records[k]; !recorded && !known[k] && !bound[k.addr] {
			foreign[k] = true
			continue
		}
		if ours[k], err = kn.readService(f, k, s); err != nil {
			return nil, nil, err
		}
	}
	return ours, foreign, nil
}

// readService reads virtual service s (key k) with its real servers, as
// the backend describes one: what it would not have set itself (flags, a
// netmask, a forwarding method other than NAT) makes it differ from any
// virtual service the backend wants, so that a sync rewrites it.
func (kn *kernel) readService(f *family, k vsKey, s *libipvs.Service) (*virtualService, error) {
	vs := &virtualService{key: k, scheduler: s.SchedName, dests: map[netip.AddrPort]int{}}
	if s.Flags&svcFlagPersistent != 0 {
		vs.timeout = s.Timeout
	}
	if s.Flags&^(svcFlagPersistent|svcFlagHashed) != 0 || s.Netmask != f.netmask {
		// Flags or a netmask we never set: make the next sync
		// rewrite it.
		vs.scheduler = ""
	}
	dests, err := kn.ipvs.GetDestinations(s)
	if err != nil {
		return nil, fmt.Errorf("ipvs: list real servers of %s: %w", k, err)
	}
	for _, d := range dests {
		addr, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		weight := d.Weight
		if d.ConnectionFlags&libipvs.ConnectionFlagFwdMask != libipvs.ConnectionFlagMasq {
			weight = -1 // not NAT: rewrite it
		}
		vs.dests[netip.AddrPortFrom(addr.Unmap(), d.Port)] = weight
	}
	return vs, nil
}

// applyIPVS creates and updates virtual services and their real servers:
// new real servers first, so that a virtual service never runs out of
// them in passing.
func (kn *kernel) applyIPVS(f *family, create []*virtualService, update []serviceUpdate) error {
	var errs []error
	for _, vs := range create {
		svc := libService(f, vs)
		if err := kn.ipvs.NewService(svc); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: create virtual service %s: %w", vs.key, err))
			continue
		}
		for _, d := range sortedAddrPorts(vs.dests) {
			if err := kn.ipvs.NewDestination(svc, libDestination(f, d, vs.dests[d])); err != nil {
				errs = append(errs, fmt.Errorf("ipvs: add real server %s to %s: %w", d, vs.key, err))
			}
		}
	}
	for _, u := range update {
		svc := libService(f, u.want)
		if u.attrs {
			if err := kn.ipvs.UpdateService(svc); err != nil {
				errs = append(errs, fmt.Errorf("ipvs: update virtual service %s: %w", u.want.key, err))
				continue
			}
		}
		for _, d := range u.add {
			if err := kn.ipvs.NewDestination(svc, libDestination(f, d, u.want.dests[d])); err != nil {
				errs = append(errs, fmt.Errorf("ipvs: add real server %s to %s: %w", d, u.want.key, err))
			}
		}
		for _, d := range u.set {
			if err := kn.ipvs.UpdateDestination(svc, libDestination(f, d, u.want.dests[d])); err != nil {
				errs = append(errs, fmt.Errorf("ipvs: set the weight of real server %s of %s: %w", d, u.want.key, err))
			}
		}
		for _, d := range u.del {
			if err := kn.ipvs.DelDestination(svc, libDestination(f, d, 0)); err != nil {
				errs = append(errs, fmt.Errorf("ipvs: delete real server %s of %s: %w", d, u.want.key, err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeServices deletes virtual services of ours.
func (kn *kernel) removeServices(f *family, keys []vsKey) error {
	var errs []error
	for _, k := range keys {
		if err := kn.ipvs.DelService(keyService(f, k)); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("ipvs: delete virtual service %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// dummy returns the dummy interface, creating it if create is set; nil
// if it does not exist and create is not set. A link of that name that
// is not a dummy interface is someone else's and an error.
func (kn *kernel) dummy(create bool) (netlink.Link, error) {
	l, err := kn.nl.LinkByName(DummyInterface)
	var notFound netlink.LinkNotFoundError
	switch {
	case err == nil && l.Type() != "dummy":
		return nil, fmt.Errorf("ipvs: interface %s exists and is a %s, not proxyshift's dummy interface", DummyInterface, l.Type())
	case err == nil:
		return l, nil
	case !errors.As(err, &notFound):
		return nil, fmt.Errorf("ipvs: look up interface %s: %w", DummyInterface, err)
	case !create:
		return nil, nil
	}
	// It stays down, as kube-ipvs0 does: addresses of a down interface
	// are local (the kernel adds their local routes), and nothing routes
	// through it.
	if err := kn.nl.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DummyInterface}}); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("ipvs: create dummy interface %s: %w", DummyInterface, err)
	}
	return kn.dummy(false)
}

// addrsOf lists the addresses of family f on link (every link if nil),
// except those of the links in skip.
func (kn *kernel) addrsOf(link netlink.Link, f *family, skip ...int) ([]netip.Addr, error) {
	nlFamily := netlink.FAMILY_V4
	if f == ipv6 {
		nlFamily = netlink.FAMILY_V6
	}
	list, err := kn.nl.AddrList(link, nlFamily)
	if err != nil {
		return nil, fmt.Errorf("ipvs: list %s addresses: %w", f.Name, err)
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !slices.Contains(skip, a.LinkIndex) {
			out = append(out, ip.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// dummyAddrs lists the addresses of family f bound to the dummy
// interface; none if it does not exist.
func (kn *kernel) dummyAddrs(f *family) ([]netip.Addr, error) {
	l, err := kn.dummy(false)
	if err != nil || l == nil {
		return nil, err
	}
	return kn.addrsOf(l, f)
}

// localAddrs lists the node's addresses of family f that node ports
// answer on when NodeConfig.NodeIPs is empty: every address but those of
// the dummy interface, loopback and IPv6 link-local ones.
func (kn *kernel) localAddrs(f *family, loopback netip.Prefix) ([]netip.Addr, error) {
	var skip []int
	if l, err := kn.dummy(false); err != nil {
		return nil, err
	} else if l != nil {
		skip = append(skip, l.Attrs().Index)
	}
	all, err := kn.addrsOf(nil, f, skip...)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(a netip.Addr) bool {
		return loopback.Contains(a) || a.Is6() && a.IsLinkLocalUnicast()
	}), nil
}

// bindAddrs binds addresses to the dummy interface, creating it if
// needed, and unbinds others from it.
func (kn *kernel) bindAddrs(ensure bool, bind, unbind []netip.Addr) error {
	if !ensure && len(bind)+len(unbind) == 0 {
		return nil
	}
	l, err := kn.dummy(true)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range bind {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
		if a.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := kn.nl.AddrAdd(l, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("ipvs: bind %s to %s: %w", a, DummyInterface, err))
		}
	}
	for _, a := range unbind {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
		if err := kn.nl.AddrDel(l, addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("ipvs: unbind %s from %s: %w", a, DummyInterface, err))
		}
	}
	return errors.Join(errs...)
}

// apply carries out a plan in its order (see plan). It stops at the first
// step that fails, so that nothing is served without the helper table or
// bound before its virtual services exist.
func (kn *kernel) apply(f *family, st *familyState, p *plan) error {
	if p.replace {
		if err := kn.writeTable(func(t *nft.Txn) error { return queueTable(t, f, st.chains, p.elems) }); err != nil {
			return fmt.Errorf("ipvs: write the %s helper table: %w", f.Name, err)
		}
	} else if len(p.preDel)+len(p.add) > 0 {
		if err := kn.writeTable(func(t *nft.Txn) error { return queueElements(t, f, p.preDel, p.add) }); err != nil {
			return fmt.Errorf("ipvs: write the %s helper table: %w", f.Name, err)
		}
	}
	if err := kn.applyIPVS(f, p.create, p.update); err != nil {
		return err
	}
	if err := kn.bindAddrs(p.ensureLink, p.bind, p.unbind); err != nil {
		return err
	}
	if err := kn.removeServices(f, p.remove); err != nil {
		return err
	}
	if len(p.postDel) > 0 {
		if err := kn.writeTable(func(t *nft.Txn) error { return queueElements(t, f, p.postDel, nil) }); err != nil {
			return fmt.Errorf("ipvs: clean the %s helper table: %w", f.Name, err)
		}
	}
	return nil
}

// writeTable sends, as one transaction, what queue queues.
func (kn *kernel) writeTable(queue func(*nft.Txn) error) error {
	t := nft.NewTxn(kn.netns)
	if err := queue(t); err != nil {
		return err
	}
	return t.Commit()
}

// tableExists says whether the helper table exists in either family.
func (kn *kernel) tableExists() (bool, error) { return nft.TableExists(kn.netns, TableName) }

// deleteTable deletes family f's helper table, and says so ("" when there
// was none).
func (kn *kernel) deleteTable(f *family) (string, error) {
	return nft.DeleteTable(kn.netns, f.Family, TableName)
}

// tableContents is what the kernel holds in a helper table.
type tableContents struct {
	// records are the recorded virtual services with their comments.
	records map[vsKey]string
	// elements counts the elements of every set and map, rules the rules
	// of every chain (zero unless readTable counts).
	elements, rules int
}

// readTable reads the family's helper table; the zero contents if there
// is none. With counts it counts every element and rule too (for
// Programmed); without, it reads the records only (for syncs, which
// rewrite the rest anyway).
func (kn *kernel) readTable(f *family, counts bool) (*tableContents, error) {
	tc := &tableContents{records: map[vsKey]string{}}
	conn, t, err := nft.OpenTable(kn.netns, f.Family, TableName)
	if err != nil || t == nil {
		return tc, err
	}
	sets, err := conn.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("ipvs: list the sets of %s %s: %w", f.Name, TableName, err)
	}
	for _, s := range sets {
		if s.Anonymous || !counts && s.Name != setVirtualServices {
			continue
		}
		elems, err := conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("ipvs: list %s %s set %s: %w", f.Name, TableName, s.Name, err)
		}
		for _, e := range elems {
			if e.IntervalEnd {
				continue
			}
			tc.elements++
			if s.Name == setVirtualServices {
				if k, ok := decodeKey(f, e.Key); ok {
					tc.records[k] = e.Comment
				}
			}
		}
	}
	if !counts {
		return tc, nil
	}
	rules, err := nft.RuleCounts(kn.netns, f.Table, TableName)
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	for _, n := range rules {
		tc.rules += n
	}
	return tc, nil
}
