package dataplane_test

import (
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/vm"
)

// TestMain loads, inside the test VM (make test-vm), the kernel modules
// the lab (bridges with br_netfilter, veth pairs), the nftables row and
// the iptables rows (both variants' tables) need: the VM's kernel cannot
// load modules on demand, having no modprobe to call. Rows whose backends
// load their own modules (ipvs) do so in their constructors. Outside the
// VM it loads nothing.
func TestMain(m *testing.M) {
	// br_netfilter, as on every node with a bridge CNI (Kubernetes asks
	// for it, and the host kernel of the other tests has it built in):
	// a pod's reply to another pod on its bridge, after the node sent the
	// pod's connection to a Service there, must pass the node's netfilter
	// (conntrack, IPVS) to be translated back.
	vm.Main(m, []string{"bridge", "br_netfilter", "veth"}, v1alpha1.ModeNFTables, v1alpha1.ModeIPTables)
}
