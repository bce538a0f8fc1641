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
// the lab (bridges with br_netfilter, veth pairs), the nftables row and the iptables rows
// (both variants' tables) need: the VM's kernel cannot load modules on
// demand, having no modprobe to call. Rows whose backends load their own
// modules (ipvs) do so in their constructors. Outside the VM it loads
// nothing.
func TestMain(m *testing.M) {
	if vm.Inside() {
		if err := loadVMModules(); err != nil {
			fmt.Fprintf(os.Stderr, "load the lab's kernel modules in the test VM: %v\n", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

func loadVMModules() error {
	// br_netfilter, as on every node with a bridge CNI (Kubernetes asks
	// for it, and the host kernel of the other tests has it built in):
	// a pod's reply to another pod on its bridge, after the node sent the
	// pod's connection to a Service there, must pass the node's netfilter
	// (conntrack, IPVS) to be translated back.
	mods := []string{"bridge", "br_netfilter", "veth"}
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeNFTables, v1alpha1.ModeIPTables} {
		l, err := kmod.ModulesFor(m, "")
		if err != nil {
			return err
		}
		mods = append(mods, l...)
	}
	for _, b := range []string{"legacy", "nft"} {
		l, err := kmod.IPTablesBackendModules(b)
		if err != nil {
			return err
		}
		mods = append(mods, l...)
	}
	return (&kmod.Kernel{}).Load(mods...)
}
