package netlab

import (
	"github.com/vishvananda/netlink"
)

// bringLoopbackUp sets "lo" up in the calling thread's namespace.
func bringLoopbackUp() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
}
