// Package vm lets tests tell whether they run inside proxyshift's test VM
// (make test-vm, see hack/vm). The VM boots Debian's stock kernel, where
// IPVS, nf_tables and iptables are loadable modules, and runs each listed
// package's test binary as root with nothing else on the machine, so tests
// there may load modules and change host-wide kernel state.
//
// Tests that need the VM call Require (or LoadModules) first: outside the
// VM they skip, naming the kernel feature they need, so that `make test`
// on a workstation lists them as skipped instead of passing them silently.
package vm

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/kmod"
)

const (
	// EnvVar is set to "1" by the VM's /init for every test binary.
	EnvVar = "PROXYSHIFT_VM"
	// CmdlineFlag is on the VM kernel's command line.
	CmdlineFlag = "proxyshift.vm=1"
)

// Inside says whether this process runs in the test VM: /init set EnvVar
// and the kernel was booted with CmdlineFlag. Both are needed, so that a
// stray variable on a workstation does not let tests that load kernel
// modules loose on it.
func Inside() bool {
	if os.Getenv(EnvVar) != "1" {
		return false
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	return err == nil && strings.Contains(" "+strings.TrimSpace(string(cmdline))+" ", " "+CmdlineFlag+" ")
}

// Require skips the test outside the VM, naming the kernel feature it
// needs: Require(t, "IPVS (ip_vs module)") skips with "needs IPVS (ip_vs
// module): run make test-vm".
func Require(t testing.TB, feature string) {
	t.Helper()
	if !Inside() {
		t.Skipf("needs %s: run make test-vm", feature)
	}
}

// LoadModules loads kernel modules, with their dependencies, inside the
// VM, and fails the test when one cannot be loaded. Outside the VM it
// skips like Require, naming the modules.
func LoadModules(t testing.TB, names ...string) {
	t.Helper()
	Require(t, "kernel modules "+strings.Join(names, ", "))
	if err := (&kmod.Kernel{}).Load(names...); err != nil {
		t.Fatal(err)
	}
}

// LoadForModes loads, inside the VM only, the modules the given proxy
// modes need (contract.ModulesFor; for iptables also both backends' tables)
// and extra ones, for a package's TestMain: the VM's kernel has no modprobe
// to load them on demand, as a node's has. Outside the VM it does nothing.
func LoadForModes(extra []string, modes ...v1alpha1.ProxyMode) error {
	if !Inside() {
		return nil
	}
	mods := append([]string(nil), extra...)
	for _, m := range modes {
		l, err := contract.ModulesFor(m, "")
		if err != nil {
			return err
		}
		mods = append(mods, l...)
		if m == v1alpha1.ModeIPTables {
			for _, b := range []string{"legacy", "nft"} {
				t, err := contract.IPTablesBackendModules(b)
				if err != nil {
					return err
				}
				mods = append(mods, t...)
			}
		}
	}
	if err := (&kmod.Kernel{}).Load(mods...); err != nil {
		return fmt.Errorf("load the kernel modules in the test VM: %w", err)
	}
	return nil
}

// Main is a TestMain for packages whose tests need their modes' modules
// inside the VM: it loads them (LoadForModes), then runs the tests and
// exits with their status.
func Main(m *testing.M, extra []string, modes ...v1alpha1.ProxyMode) {
	if err := LoadForModes(extra, modes...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
