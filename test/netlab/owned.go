package netlab

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
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

// SweepStale removes the named network namespaces that StaleOwned says a
// dead process of prefix left behind. Their processes died with it, so
// nothing holds them any more. It reports each removal, and each failure,
// to logf.
func SweepStale(prefix string, logf func(string, ...any)) {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		if !StaleOwned(prefix, e.Name()) {
			continue
		}
		ns := &NetNS{Name: e.Name(), Handle: -1}
		if err := ns.Delete(); err != nil {
			logf("remove stale namespace %s: %v", e.Name(), err)
		} else {
			logf("removed stale namespace %s (its harness is gone)", e.Name())
		}
	}
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
