package kmod

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// The fixture in testdata is a small modules tree in the shape of Debian's
// 6.1 kernel: ip_vs and a scheduler with the conntrack chain they need,
// modules compressed three ways, built-ins, a modules.dep entry whose file
// is gone (xt_gone) and one that depends on it, soft dependencies and
// aliases. proc-modules has ip_vs and its dependencies loaded and
// ip_vs_wrr on its way in; sys/module has a built-in nf_tables and bridge
// (no initstate) and a loaded ip_vs.

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

// recorder is a fake insert that records the modules loaded, failing
// those in fail with their errno.
type recorder struct {
	loaded []string
	fail   map[string]error
}

func (r *recorder) insert(path string) error {
	name := canonical(path)
	if err := r.fail[name]; err != nil {
		return err
	}
	r.loaded = append(r.loaded, name)
	return nil
}

func recording(k *Kernel, fail map[string]error) *recorder {
	r := &recorder{fail: fail}
	k.insert = r.insert
	return r
}

func TestLoadOrder(t *testing.T) {
	tests := []struct {
		name  string
		proc  string
		load  []string
		order []string
	}{{
		// Dependencies first, from the end of the modules.dep line;
		// libcrc32c's soft dependency "crc32c" is an alias of
		// crc32c_intel; ip_vs_wrr's pre soft dependency does not exist
		// (ignored) and its post one comes after it.
		name:  "ip_vs_wrr from scratch",
		proc:  "proc-modules-empty",
		load:  []string{"ip_vs_wrr"},
		order: []string{"crc32c_intel", "libcrc32c", "nf_defrag_ipv4", "nf_defrag_ipv6", "nf_conntrack", "ip_vs", "ip_vs_wrr", "dummy"},
	}, {
		name:  "dependencies already loaded",
		proc:  "proc-modules",
		load:  []string{"ip_vs_sh"},
		order: []string{"ip_vs_sh"},
	}, {
		name:  "loaded and built in: nothing to do",
		proc:  "proc-modules",
		load:  []string{"ip_vs", "nf_tables", "bridge"},
		order: nil,
	}, {
		name:  "built-in dependencies are skipped",
		proc:  "proc-modules",
		load:  []string{"nft_ct"},
		order: []string{"nft_ct"},
	}, {
		name:  "each module once",
		proc:  "proc-modules-empty",
		load:  []string{"nf_conntrack", "ip-vs", "ip_vs", "xt_u32", "ip_vs_mh"},
		order: []string{"crc32c_intel", "libcrc32c", "nf_defrag_ipv4", "nf_defrag_ipv6", "nf_conntrack", "ip_vs", "x_tables", "xt_u32", "ip_vs_mh"},
	}, {
		name:  "renamed",
		proc:  "proc-modules-empty",
		load:  []string{"nf_conntrack_ipv4"},
		order: []string{"crc32c_intel", "libcrc32c", "nf_defrag_ipv4", "nf_defrag_ipv6", "nf_conntrack"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := fixture(tt.proc)
			r := recording(k, nil)
			if err := k.Load(tt.load...); err != nil {
				t.Fatalf("Load(%v): %v", tt.load, err)
			}
			if !slices.Equal(r.loaded, tt.order) {
				t.Errorf("Load(%v) loaded %v; want %v", tt.load, r.loaded, tt.order)
			}
		})
	}
}

func TestLoadSoftDependencyFailureIgnored(t *testing.T) {
	k := fixture("proc-modules-empty")
	r := recording(k, map[string]error{"crc32c_intel": unix.ENOEXEC, "dummy": unix.EPERM})
	if err := k.Load("ip_vs_wrr"); err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := []string{"libcrc32c", "nf_defrag_ipv4", "nf_defrag_ipv6", "nf_conntrack", "ip_vs", "ip_vs_wrr"}
	if !slices.Equal(r.loaded, want) {
		t.Errorf("loaded %v; want %v", r.loaded, want)
	}
}

func TestLoadAlreadyThere(t *testing.T) {
	// Someone else loaded it between our read and our insert.
	k := fixture("proc-modules")
	recording(k, map[string]error{"ip_vs_sh": unix.EEXIST})
	if err := k.Load("ip_vs_sh"); err != nil {
		t.Errorf("Load with EEXIST: %v; want success", err)
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name       string
		kernel     func() *Kernel
		fail       map[string]error
		load       string
		dependency string
		is         error
		msg        []string
	}{{
		name:   "missing",
		kernel: func() *Kernel { return fixture("proc-modules-empty") },
		load:   "ip_vs_lc",
		is:     ErrMissing,
		msg:    []string{"load kernel module ip_vs_lc: module not found", "neither modules.builtin nor modules.dep"},
	}, {
		name:       "dependency missing",
		kernel:     func() *Kernel { return fixture("proc-modules-empty") },
		load:       "xt-needs-gone",
		dependency: "xt_gone",
		is:         ErrMissing,
		msg:        []string{"load kernel module xt_needs_gone: dependency xt_gone: module not found", "testdata/modules/kernel/net/netfilter/xt_gone.ko does not exist"},
	}, {
		name:       "permission",
		kernel:     func() *Kernel { return fixture("proc-modules-empty") },
		fail:       map[string]error{"nf_conntrack": unix.EPERM},
		load:       "ip_vs",
		dependency: "nf_conntrack",
		is:         unix.EPERM,
		msg:        []string{"load kernel module ip_vs: dependency nf_conntrack: testdata/modules/kernel/net/netfilter/nf_conntrack.ko: operation not permitted (permission denied: loading modules needs CAP_SYS_MODULE"},
	}, {
		name:   "wrong kernel",
		kernel: func() *Kernel { return fixture("proc-modules") },
		fail:   map[string]error{"ip_vs_sh": unix.ENOEXEC},
		load:   "ip_vs_sh",
		is:     unix.ENOEXEC,
		msg:    []string{"ip_vs_sh.ko.xz: exec format error (invalid module format"},
	}, {
		name:   "half loaded",
		kernel: func() *Kernel { return fixture("proc-modules") },
		load:   "ip_vs_wrr",
		is:     ErrUnknown,
		msg:    []string{"load kernel module ip_vs_wrr: module state unknown: Loading in testdata/proc-modules"},
	}, {
		name: "cannot tell",
		kernel: func() *Kernel {
			k := fixture("no-such-file")
			k.SysModule = "testdata/no-such-dir"
			return k
		},
		load: "ip_vs",
		is:   ErrUnknown,
		msg:  []string{"load kernel module ip_vs: module state unknown: cannot read testdata/no-such-file"},
	}, {
		name:       "renamed",
		kernel:     func() *Kernel { return fixture("proc-modules-empty") },
		fail:       map[string]error{"libcrc32c": unix.ENOENT},
		load:       "nf_conntrack_ipv4",
		dependency: "libcrc32c",
		is:         unix.ENOENT,
		msg:        []string{"load kernel module nf_conntrack_ipv4: dependency libcrc32c: this kernel has it as nf_conntrack:", "unknown symbol"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := tt.kernel()
			recording(k, tt.fail)
			err := k.Load(tt.load)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Load(%q) = %v; want an *Error", tt.load, err)
			}
			if e.Module != canonical(tt.load) || e.Dependency != tt.dependency || !errors.Is(err, tt.is) {
				t.Errorf("Load(%q) = %+v; want module %s, dependency %q, wrapping %v", tt.load, e, canonical(tt.load), tt.dependency, tt.is)
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("Load(%q) = %q; want it to contain %q", tt.load, err, m)
				}
			}
		})
	}
}

func TestLoadReportsEveryFailure(t *testing.T) {
	k := fixture("proc-modules-empty")
	r := recording(k, nil)
	err := k.Load("ip_vs_lc", "dummy", "xt_gone")
	if err == nil {
		t.Fatal("Load succeeded; want two errors")
	}
	msg := err.Error()
	for _, m := range []string{"ip_vs_lc", "xt_gone"} {
		if !strings.Contains(msg, "load kernel module "+m+":") {
			t.Errorf("error %q does not name %s", msg, m)
		}
	}
	if !slices.Equal(r.loaded, []string{"dummy"}) {
		t.Errorf("loaded %v; want the one module that exists, dummy", r.loaded)
	}
}

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"ip_vs":                                  "ip_vs",
		"ip-vs":                                  "ip_vs",
		"xt_MASQUERADE":                          "xt_MASQUERADE",
		"kernel/arch/x86/crypto/crc32c-intel.ko": "crc32c_intel",
		"kernel/net/netfilter/nft_ct.ko.zst":     "nft_ct",
		"/lib/modules/6.1.0/kernel/lib/libcrc32c.ko.xz": "libcrc32c",
	} {
		if got := canonical(in); got != want {
			t.Errorf("canonical(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestKernelModule(t *testing.T) {
	m := Module{Name: "nf_conntrack_ipv4", Resolved: "nf_conntrack", State: v1alpha1.ModuleLoaded}
	if got, want := m.KernelModule(), (v1alpha1.KernelModule{Name: "nf_conntrack", State: v1alpha1.ModuleLoaded}); got != want {
		t.Errorf("KernelModule() = %+v; want %+v", got, want)
	}
}
