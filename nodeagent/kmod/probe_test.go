package kmod

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// fixture is the testdata kernel with the given /proc/modules file.
func fixture(proc string) *Kernel {
	return &Kernel{
		ModulesDir:  "testdata/modules",
		ProcModules: filepath.Join("testdata", proc),
		SysModule:   "testdata/sys/module",
	}
}

// copyTree copies the fixture's modules tree to a temporary directory, for
// tests that break part of it.
func copyTree(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS("testdata/modules")); err != nil {
		t.Fatal(err)
	}
	return dst
}

// unreadable replaces a file with a directory, which cannot be read as a
// file even by root.
func unreadable(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

type want struct {
	name, resolved string
	state          v1alpha1.ModuleState
	reason         string // a substring of the reason
}

func checkProbe(t *testing.T, k *Kernel, tests []want) {
	t.Helper()
	for _, w := range tests {
		got := k.Probe(w.name)[0]
		resolved := w.resolved
		if resolved == "" {
			resolved = canonical(w.name)
		}
		if got.Resolved != resolved || got.State != w.state || !strings.Contains(got.Reason, w.reason) {
			t.Errorf("Probe(%q) = %s %s (%q); want %s %s (reason containing %q)",
				w.name, got.Resolved, got.State, got.Reason, resolved, w.state, w.reason)
		}
	}
}

func TestProbeNothingLoaded(t *testing.T) {
	checkProbe(t, fixture("proc-modules-empty"), []want{
		{name: "ip_vs", state: v1alpha1.ModuleLoadable, reason: "kernel/net/netfilter/ipvs/ip_vs.ko in testdata/modules/modules.dep"},
		{name: "ip-vs", resolved: "ip_vs", state: v1alpha1.ModuleLoadable},
		{name: "ip_vs_wrr", state: v1alpha1.ModuleLoadable},
		{name: "ip_vs_sh", state: v1alpha1.ModuleLoadable, reason: "ip_vs_sh.ko.xz"},
		{name: "ip_vs_mh", state: v1alpha1.ModuleLoadable, reason: "ip_vs_mh.ko.zst"},
		{name: "xt_u32", state: v1alpha1.ModuleLoadable, reason: "xt_u32.ko.gz"},
		{name: "crc32c-intel", resolved: "crc32c_intel", state: v1alpha1.ModuleLoadable},
		// nft_ct's dependencies nf_tables and nfnetlink are built in: no
		// file needed.
		{name: "nft_ct", state: v1alpha1.ModuleLoadable},
		{name: "nf_tables", state: v1alpha1.ModuleBuiltIn, reason: "modules.builtin"},
		{name: "crc32c_generic", state: v1alpha1.ModuleBuiltIn},
		// Not in modules.builtin, but /sys/module/bridge has no initstate.
		{name: "bridge", state: v1alpha1.ModuleBuiltIn, reason: "testdata/sys/module/bridge has no initstate"},
		{name: "ip_vs_lc", state: v1alpha1.ModuleMissing, reason: "neither modules.builtin nor modules.dep"},
		{name: "xt_gone", state: v1alpha1.ModuleMissing, reason: "xt_gone is in modules.dep but its file is not there"},
		{name: "xt_needs_gone", state: v1alpha1.ModuleMissing, reason: "dependency xt_gone"},
		{name: "nf_conntrack_ipv4", resolved: "nf_conntrack", state: v1alpha1.ModuleLoadable, reason: "has no nf_conntrack_ipv4: it became nf_conntrack"},
		{name: "nf_nat_ipv4", resolved: "nf_nat", state: v1alpha1.ModuleMissing},
	})
}

func TestProbeLoaded(t *testing.T) {
	checkProbe(t, fixture("proc-modules"), []want{
		{name: "ip_vs", state: v1alpha1.ModuleLoaded, reason: "Live in testdata/proc-modules"},
		{name: "libcrc32c", state: v1alpha1.ModuleLoaded},
		{name: "nf_conntrack_ipv4", resolved: "nf_conntrack", state: v1alpha1.ModuleLoaded},
		{name: "ip_vs_wrr", state: v1alpha1.ModuleUnknown, reason: "Loading in testdata/proc-modules"},
		{name: "ip_vs_sh", state: v1alpha1.ModuleLoadable},
		{name: "nf_tables", state: v1alpha1.ModuleBuiltIn},
		{name: "ip_vs_lc", state: v1alpha1.ModuleMissing},
	})
}

func TestProbeUnknown(t *testing.T) {
	t.Run("no /proc/modules, no sysfs", func(t *testing.T) {
		k := fixture("no-such-file")
		k.SysModule = "testdata/no-such-dir"
		checkProbe(t, k, []want{
			// Loaded or Loadable? Cannot tell.
			{name: "ip_vs", state: v1alpha1.ModuleUnknown, reason: "cannot read testdata/no-such-file"},
			{name: "ip_vs_lc", state: v1alpha1.ModuleUnknown},
			// modules.builtin still tells.
			{name: "nf_tables", state: v1alpha1.ModuleBuiltIn},
		})
	})
	t.Run("no /proc/modules, sysfs tells", func(t *testing.T) {
		checkProbe(t, fixture("no-such-file"), []want{
			{name: "ip_vs", state: v1alpha1.ModuleLoaded, reason: "Live in testdata/sys/module/ip_vs/initstate"},
			{name: "dummy", state: v1alpha1.ModuleLoadable},
			{name: "ip_vs_lc", state: v1alpha1.ModuleMissing},
		})
	})
	t.Run("modules.dep unreadable", func(t *testing.T) {
		k := fixture("proc-modules")
		k.ModulesDir = copyTree(t)
		unreadable(t, filepath.Join(k.ModulesDir, "modules.dep"))
		checkProbe(t, k, []want{
			{name: "ip_vs", state: v1alpha1.ModuleLoaded},
			{name: "nf_tables", state: v1alpha1.ModuleBuiltIn},
			{name: "ip_vs_sh", state: v1alpha1.ModuleUnknown, reason: "cannot read modules.dep"},
			{name: "ip_vs_lc", state: v1alpha1.ModuleUnknown, reason: "cannot read modules.dep"},
			// The old name might exist: no rename on a guess.
			{name: "nf_conntrack_ipv4", state: v1alpha1.ModuleUnknown},
		})
	})
	t.Run("modules.builtin unreadable", func(t *testing.T) {
		k := fixture("proc-modules-empty")
		k.ModulesDir = copyTree(t)
		unreadable(t, filepath.Join(k.ModulesDir, "modules.builtin"))
		checkProbe(t, k, []want{
			{name: "ip_vs", state: v1alpha1.ModuleLoadable},
			// sysfs still shows nf_tables as built in...
			{name: "nf_tables", state: v1alpha1.ModuleBuiltIn, reason: "has no initstate"},
			// ...but not crc32c_generic, nor whether ip_vs_lc is.
			{name: "crc32c_generic", state: v1alpha1.ModuleUnknown, reason: "cannot read modules.builtin"},
			{name: "ip_vs_lc", state: v1alpha1.ModuleUnknown, reason: "cannot read modules.builtin"},
		})
	})
	t.Run("no modules directory", func(t *testing.T) {
		k := fixture("proc-modules")
		k.ModulesDir = "testdata/no-such-dir"
		checkProbe(t, k, []want{
			{name: "ip_vs", state: v1alpha1.ModuleLoaded},
			{name: "bridge", state: v1alpha1.ModuleBuiltIn},
			{name: "ip_vs_sh", state: v1alpha1.ModuleUnknown, reason: "cannot read modules.dep"},
		})
	})
}

func TestRenameOnOldKernel(t *testing.T) {
	// A 4.x kernel still has nf_conntrack_ipv4: asking for it gets it.
	k := fixture("proc-modules-empty")
	k.ModulesDir = copyTree(t)
	old := "kernel/net/ipv4/netfilter/nf_conntrack_ipv4.ko"
	dep, err := os.ReadFile(filepath.Join(k.ModulesDir, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	dep = append(dep, []byte(old+": kernel/net/netfilter/nf_conntrack.ko kernel/net/ipv6/netfilter/nf_defrag_ipv6.ko kernel/net/ipv4/netfilter/nf_defrag_ipv4.ko kernel/lib/libcrc32c.ko\n")...)
	if err := os.WriteFile(filepath.Join(k.ModulesDir, "modules.dep"), dep, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.ModulesDir, old), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	checkProbe(t, k, []want{{name: "nf_conntrack_ipv4", state: v1alpha1.ModuleLoadable}})
}

func TestKernelModule(t *testing.T) {
	m := Module{Name: "nf_conntrack_ipv4", Resolved: "nf_conntrack", State: v1alpha1.ModuleLoaded}
	if got, want := m.KernelModule(), (v1alpha1.KernelModule{Name: "nf_conntrack", State: v1alpha1.ModuleLoaded}); got != want {
		t.Errorf("KernelModule() = %+v; want %+v", got, want)
	}
}
