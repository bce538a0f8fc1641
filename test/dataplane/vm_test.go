package dataplane_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/kmod"
	"github.com/proxyshift/proxyshift/test/vm"
)

// TestMain loads, inside the test VM (make test-vm), the kernel modules
// the lab (bridges, veth pairs) and the nftables row need: the VM's
// kernel cannot load modules on demand, having no modprobe to call. Rows
// whose backends load their own modules (ipvs) do so in their
// constructors. Outside the VM it loads nothing.
func TestMain(m *testing.M) {
	if vm.Inside() {
		mods, err := kmod.ModulesFor(v1alpha1.ModeNFTables, "")
		if err == nil {
			err = (&kmod.Kernel{}).Load(append(mods, "bridge", "veth")...)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "load the lab's kernel modules in the test VM: %v\n", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}
