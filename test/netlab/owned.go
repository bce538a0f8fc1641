package netlab

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Harnesses that outlive a test (the local clusters, benchmarks) name what
// they create on the host "<prefix><pid>-<rest>", with their own pid, so
// that a later run can remove what a killed run left behind without ever
// touching what a live run owns.

// OwnedName is "<prefix><pid>-<rest>" with the calling process's pid.
func OwnedName(prefix, rest string) string {
	return fmt.Sprintf("%s%d-%s", prefix, os.Getpid(), rest)
}

// StaleOwned tells whether name was made by OwnedName with prefix by a
// process that is gone (not this one, not a live one).
func StaleOwned(prefix, name string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	pidStr, _, ok := strings.Cut(rest, "-")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == syscall.ESRCH
}

// NamedWithPrefix lists the named network namespaces (under /run/netns)
// whose names start with prefix.
func NamedWithPrefix(prefix string) ([]string, error) {
	ents, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// SweepStale removes the named network namespaces that StaleOwned says a
// dead process of prefix left behind. Their processes died with it, so
// nothing holds them any more. It reports each removal, and each failure,
// to logf.
func SweepStale(prefix string, logf func(string, ...any)) {
	names, _ := NamedWithPrefix(prefix)
	for _, name := range names {
		if !StaleOwned(prefix, name) {
			continue
		}
		ns := &NetNS{Name: name, Handle: -1}
		if err := ns.Delete(); err != nil {
			logf("remove stale namespace %s: %v", name, err)
		} else {
			logf("removed stale namespace %s (its harness is gone)", name)
		}
	}
}

// Namespaces are the named network namespaces one harness run creates,
// "<prefix><pid>-<run>-<role>" (run numbers the runs within a process),
// removed together.
type Namespaces struct {
	prefix string
	run    int64

	mu   sync.Mutex
	list []*NetNS
}

var namespaceRuns atomic.Int64

// NewNamespaces starts a run's set of namespaces named with prefix.
func NewNamespaces(prefix string) *Namespaces {
	return &Namespaces{prefix: prefix, run: namespaceRuns.Add(1)}
}

// Name is the name of the run's thing called role,
// "<prefix><pid>-<run>-<role>": its namespace's, or a cgroup's that should
// be swept like one.
func (s *Namespaces) Name(role string) string {
	return OwnedName(s.prefix, fmt.Sprintf("%d-%s", s.run, role))
}

// Create creates the run's namespace for role (see CreateNetNS).
func (s *Namespaces) Create(role string) (*NetNS, error) {
	ns, err := CreateNetNS(s.Name(role))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.list = append(s.list, ns)
	s.mu.Unlock()
	return ns, nil
}

// Names lists the names of the run's namespaces that exist.
func (s *Namespaces) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for _, ns := range s.list {
		names = append(names, ns.Name)
	}
	return names
}

// Prefix starts the names of every namespace of the run.
func (s *Namespaces) Prefix() string { return s.Name("") }

// DeleteAll removes the run's namespaces, the last created first.
func (s *Namespaces) DeleteAll() error {
	s.mu.Lock()
	list := s.list
	s.list = nil
	s.mu.Unlock()
	var errs []error
	for i := len(list) - 1; i >= 0; i-- {
		if err := list[i].Delete(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Fabric is a namespace holding one bridge that joins other namespaces on
// one segment (a cluster's "network"), each through a veth whose end in
// the fabric is a port of the bridge. The fabric namespace holds the
// segment's gateway address and does not forward: what is sent there
// beyond the segment is dropped, never routed anywhere.
type Fabric struct {
	NS     *NetNS
	Bridge string
	// Gateway is the fabric namespace's address, with the segment's length.
	Gateway netip.Prefix
}

// NewFabric turns ns into a fabric: forwarding off, and a bridge called
// bridge holding gateway.
func NewFabric(ns *NetNS, bridge string, gateway netip.Prefix) (*Fabric, error) {
	if err := ns.SetSysctl("net/ipv4/ip_forward", "0"); err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	if err := ns.AddBridge(bridge, gateway); err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	return &Fabric{NS: ns, Bridge: bridge, Gateway: gateway}, nil
}

// Plug joins ns to the fabric with a veth called link in the fabric and
// ifname in ns, and gives ns addr on the segment.
func (f *Fabric) Plug(ns *NetNS, link, ifname string, addr netip.Addr) error {
	if err := f.NS.AddVeth(link, ns, ifname); err != nil {
		return err
	}
	if err := f.NS.SetMaster(link, f.Bridge); err != nil {
		return err
	}
	return ns.AddAddr(ifname, netip.PrefixFrom(addr, f.Gateway.Bits()))
}

// AddServer puts ns on the fabric as a server (the control plane):
// forwarding off, address addr, no route beyond the segment.
func (f *Fabric) AddServer(ns *NetNS, link, ifname string, addr netip.Addr) error {
	if err := ns.SetSysctl("net/ipv4/ip_forward", "0"); err != nil {
		return err
	}
	return f.Plug(ns, link, ifname, addr)
}

// AddRouter puts ns on the fabric as a router (a node): forwarding on, no
// ICMP redirects (the routers and the hosts share one segment, and a
// router sending a packet back out where it came from must not tell the
// sender to go elsewhere), address addr, default route to the fabric's
// gateway, which drops what it gets, as the world beyond a real node
// would.
func (f *Fabric) AddRouter(ns *NetNS, link, ifname string, addr netip.Addr) error {
	for _, step := range []func() error{
		func() error { return ns.SetSysctl("net/ipv4/ip_forward", "1") },
		func() error { return ns.SetSysctl("net/ipv4/conf/all/send_redirects", "0") },
		func() error { return ns.SetSysctl("net/ipv4/conf/default/send_redirects", "0") },
		func() error { return f.Plug(ns, link, ifname, addr) },
		func() error { return ns.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), f.Gateway.Addr()) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// AddHost puts ns on the fabric as a host outside the routers (a client):
// no forwarding, no ICMP redirects taken, address addr, default route via
// the router at via.
func (f *Fabric) AddHost(ns *NetNS, link, ifname string, addr, via netip.Addr) error {
	for _, step := range []func() error{
		func() error { return ns.SetSysctl("net/ipv4/ip_forward", "0") },
		func() error { return ns.SetSysctl("net/ipv4/conf/all/accept_redirects", "0") },
		func() error { return f.Plug(ns, link, ifname, addr) },
		func() error { return ns.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), via) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}
