package kmod

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

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
