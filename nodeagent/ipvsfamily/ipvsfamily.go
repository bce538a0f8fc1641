// Package ipvsfamily says whether the kernel's IPVS is loaded, without
// loading it.
//
// The usual test, looking IPVS's generic netlink family up by name, is a
// request the kernel answers by loading ip_vs when it can (ip_vs declares
// the module alias net-pf-16-proto-16-family-IPVS, and the kernel runs the
// host's modprobe for an unknown family): asked on every node at an
// agent's start, it would load IPVS wherever it is a module. A dump of the
// families loads nothing. moby/ipvs looks the family up by name, and runs
// `modprobe ip_vs` before, when a process opens its first handle; it is
// opened only once Loaded says yes.
package ipvsfamily

import (
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
)

// Name is IPVS's generic netlink family.
const Name = "IPVS"

// Loaded says whether the kernel has IPVS's generic netlink family, as
// it has once ip_vs is loaded or built in. It lists the families (the
// family is not per namespace, and IPVS's is listed in every one).
func Loaded() (bool, error) { return listed(Name) }

// listed says whether the kernel lists the generic netlink family name.
func listed(name string) (bool, error) {
	families, err := netlink.GenlFamilyList()
	if err != nil {
		return false, fmt.Errorf("list the generic netlink families: %w", err)
	}
	return slices.ContainsFunc(families, func(f *netlink.GenlFamily) bool { return f.Name == name }), nil
}
