package kmod_test

// These tests load real modules into a real kernel: they run only in the
// test VM (make test-vm), which boots Debian's 6.1 cloud kernel with a
// modules tree holding the netfilter, IPVS, bridge, veth and dummy modules
// (hack/vm/modules.txt) and the real modules.dep, modules.builtin and
// modules.softdep. kmod's test binary runs first there (hack/vm/packages.txt),
// so the kernel has loaded no module when they start, and they run in
// source order: probing first, then loading.

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/moby/ipvs"
	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/facts"
	"github.com/proxyshift/proxyshift/nodeagent/kmod"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/vm"
)

// procModules is the set of modules /proc/modules lists as Live.
func procModules(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("/proc/modules")
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 5 && f[4] == "Live" {
			live[f[0]] = true
		}
	}
	return live
}

func requireLive(t *testing.T, names ...string) {
	t.Helper()
	live := procModules(t)
	for _, n := range names {
		if !live[n] {
			t.Errorf("/proc/modules does not list %s as Live", n)
		}
	}
}

func TestVMProbeRealTree(t *testing.T) {
	vm.Require(t, "Debian's stock kernel with loadable netfilter modules")
	tests := []struct {
		name, resolved string
		state          v1alpha1.ModuleState
		reason         string
	}{
		{"ip_vs", "ip_vs", v1alpha1.ModuleLoadable, "kernel/net/netfilter/ipvs/ip_vs.ko in /lib/modules/"},
		{"ip-vs", "ip_vs", v1alpha1.ModuleLoadable, ""},
		{"ip_vs_wrr", "ip_vs_wrr", v1alpha1.ModuleLoadable, ""},
		{"nf_tables", "nf_tables", v1alpha1.ModuleLoadable, ""},
		{"nf_conntrack_ipv4", "nf_conntrack", v1alpha1.ModuleLoadable, "it became nf_conntrack"},
		// Debian builds crc32c_generic into the image.
		{"crc32c_generic", "crc32c_generic", v1alpha1.ModuleBuiltIn, "modules.builtin"},
		// CONFIG_IP_VS_TWOS is not set in Debian's 6.1 kernels.
		{"ip_vs_twos", "ip_vs_twos", v1alpha1.ModuleMissing, "neither modules.builtin nor modules.dep"},
		{"proxyshift_no_such_module", "proxyshift_no_such_module", v1alpha1.ModuleMissing, ""},
		// modules.dep lists btrfs, but the VM's tree leaves its file out.
		{"btrfs", "btrfs", v1alpha1.ModuleMissing, "its file is not there"},
	}
	k := &kmod.Kernel{}
	for _, tt := range tests {
		got := k.Probe(tt.name)[0]
		if got.Resolved != tt.resolved || got.State != tt.state || !strings.Contains(got.Reason, tt.reason) {
			t.Errorf("Probe(%q) = %s %s (%s); want %s %s (reason containing %q)", tt.name, got.Resolved, got.State, got.Reason, tt.resolved, tt.state, tt.reason)
			if got.State == v1alpha1.ModuleLoaded {
				t.Log("already loaded: kmod's tests must run first in the VM (hack/vm/packages.txt)")
			}
		}
	}
}

func TestVMConntrackRename(t *testing.T) {
	vm.Require(t, "nf_conntrack as a loadable module")
	k := &kmod.Kernel{}
	if err := k.Load("nf_conntrack_ipv4"); err != nil {
		t.Fatalf("Load(nf_conntrack_ipv4): %v", err)
	}
	requireLive(t, "nf_conntrack", "nf_defrag_ipv4", "nf_defrag_ipv6", "libcrc32c")
	if got := k.Probe("nf_conntrack_ipv4")[0]; got.Resolved != "nf_conntrack" || got.State != v1alpha1.ModuleLoaded {
		t.Errorf("Probe(nf_conntrack_ipv4) = %+v; want nf_conntrack Loaded", got)
	}
}

// TestVMAgentStartLoadsNoModule is the agent's sequence on a node where
// ip_vs is not loaded. Its start gathers the kernel's facts and builds
// every mode's backend to look at the kernel: on a node that runs
// kube-proxy (whose modes' modules are loaded), that must ask for no
// module, neither through a modprobe on PATH (moby/ipvs runs one when a
// process opens its first IPVS handle) nor through the kernel's own
// module requests (a lookup of IPVS's netlink family by name is one), and
// the ipvs backend must fail, as nothing of IPVS can be there. A switch to
// ipvs then loads the modules (Preparing) and builds the backend again,
// which must work: it did not while the first build opened moby/ipvs,
// which kept the failed lookup of the family for the life of the process.
// It runs before anything here loads ip_vs.
func TestVMAgentStartLoadsNoModule(t *testing.T) {
	vm.Require(t, "IPVS (ip_vs module)")
	if procModules(t)["ip_vs"] {
		t.Fatal("ip_vs is loaded already: kmod's tests must run first in the VM (hack/vm/packages.txt), this one before TestVMLoadIPVS")
	}
	ns := netlab.NewNetNS(t, "agent-start")
	g := &facts.Gatherer{NS: ns.NS()}
	// Before nfnetlink is loaded (nothing here loaded it), nf_tables does
	// not answer: the facts say so. (mdlayher/socket before v0.6 lost the
	// error of a socket made in another namespace, and this panicked.)
	requests := recordModuleRequests(t)
	if c, why := g.NFTables(); c != v1alpha1.CapabilityNo {
		t.Errorf("without nfnetlink, nf_tables is %s (%s); want No", c, why)
	}
	var node []string
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeNFTables, v1alpha1.ModeIPTables} {
		mods, err := contract.ModulesFor(m, "")
		if err != nil {
			t.Fatal(err)
		}
		node = append(node, mods...)
	}
	for _, v := range []string{"legacy", "nft"} {
		mods, err := contract.IPTablesBackendModules(v)
		if err != nil {
			t.Fatal(err)
		}
		node = append(node, mods...)
	}
	vm.LoadModules(t, append(node, "nfnetlink")...)
	before := procModules(t)
	asked := requests()

	g.Gather(context.Background())
	if c, why := g.Capability(context.Background(), v1alpha1.ModeIPVS); c != v1alpha1.CapabilityNo {
		t.Errorf("before ip_vs was loaded, IPVS is %s (%s); want No", c, why)
	}
	cfg := dataplane.NodeConfig{NodeName: "vm", MasqueradeBit: 14}
	factories := backends.Factories(backends.Env{NS: ns.NS()})
	for mode, build := range factories {
		_, err := build(cfg, v1alpha1.ProxySettings{})
		if mode == v1alpha1.ModeIPVS && (err == nil || !strings.Contains(err.Error(), "ip_vs is not loaded")) {
			t.Errorf("ipvs backend built before ip_vs was loaded: %v; want an error saying ip_vs is not loaded", err)
		}
	}
	if got := strings.TrimPrefix(requests(), asked); got != "" {
		t.Errorf("the agent's start asked for modules:\n%s", got)
	}
	for name := range procModules(t) {
		if !before[name] {
			t.Errorf("the agent's start loaded %s", name)
		}
	}

	if err := g.Prepare(context.Background(), v1alpha1.ModeIPVS, ""); err != nil {
		t.Fatalf("Prepare(ipvs): %v", err)
	}
	b, err := factories[v1alpha1.ModeIPVS](cfg, v1alpha1.ProxySettings{})
	if err != nil {
		t.Fatalf("ipvs backend after Preparing loaded ip_vs: %v", err)
	}
	if c, err := b.Programmed(context.Background()); err != nil || c != (dataplane.Counts{}) {
		t.Errorf("Programmed in a fresh namespace = %+v, %v; want nothing and no error", c, err)
	}
}

// recordModuleRequests makes every module request, the kernel's own
// (kernel.modprobe, which the VM's kernel does not find otherwise) and
// a modprobe run from PATH, write its arguments to a file and fail, until
// the test ends. It returns what was requested so far.
func recordModuleRequests(t *testing.T) func() string {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "requests")
	script := filepath.Join(dir, "modprobe")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"modprobe $*\" >> "+log+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const sysctl = "/proc/sys/kernel/modprobe"
	old, err := os.ReadFile(sysctl)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sysctl, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(sysctl, old, 0o644); err != nil {
			t.Errorf("restore %s: %v", sysctl, err)
		}
	})
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return func() string {
		got, _ := os.ReadFile(log)
		return string(got)
	}
}

func TestVMLoadIPVS(t *testing.T) {
	vm.Require(t, "IPVS (ip_vs module)")
	k := &kmod.Kernel{}
	if err := k.Load("ip_vs", "ip_vs_wrr"); err != nil {
		t.Fatalf("Load: %v", err)
	}
	requireLive(t, "ip_vs", "ip_vs_wrr", "nf_conntrack")
	for _, m := range k.Probe("ip_vs", "ip_vs_wrr") {
		if m.State != v1alpha1.ModuleLoaded {
			t.Errorf("after Load, Probe(%s) = %s (%s); want Loaded", m.Name, m.State, m.Reason)
		}
	}
	// Loading again is a no-op.
	if err := k.Load("ip_vs_wrr"); err != nil {
		t.Errorf("second Load: %v", err)
	}

	// IPVS answers: a virtual service comes and goes in a fresh namespace.
	// (moby/ipvs resolves the IPVS netlink family once per process, so
	// ip_vs must be loaded before the first ipvs.New.)
	ns := netlab.NewNetNS(t, "ipvs")
	h, err := ipvs.New(filepath.Join("/run/netns", ns.Name))
	if err != nil {
		t.Fatalf("ipvs.New: %v", err)
	}
	defer h.Close()
	svc := &ipvs.Service{
		Address:       net.ParseIP("198.18.0.10").To4(),
		Protocol:      unix.IPPROTO_TCP,
		Port:          80,
		AddressFamily: unix.AF_INET,
		SchedName:     "wrr",
		Netmask:       0xffffffff,
	}
	if err := h.NewService(svc); err != nil {
		t.Fatalf("NewService: %v", err)
	}
	got, err := h.GetServices()
	if err != nil || len(got) != 1 || got[0].SchedName != "wrr" || !got[0].Address.Equal(svc.Address) {
		t.Fatalf("GetServices = %v, %v; want the one wrr service", got, err)
	}
	if err := h.DelService(svc); err != nil {
		t.Fatalf("DelService: %v", err)
	}
	if got, err := h.GetServices(); err != nil || len(got) != 0 {
		t.Errorf("GetServices after delete = %v, %v; want none", got, err)
	}
}

func TestVMLoadMissing(t *testing.T) {
	vm.Require(t, "Debian's stock kernel modules tree")
	for name, reason := range map[string]string{
		"ip_vs_twos": "neither modules.builtin nor modules.dep",
		"btrfs":      "its file is not there",
	} {
		err := (&kmod.Kernel{}).Load(name)
		var e *kmod.Error
		if !errors.As(err, &e) || e.Module != name || !errors.Is(err, kmod.ErrMissing) || !strings.Contains(err.Error(), reason) {
			t.Errorf("Load(%s) = %v; want a kmod.Error naming it, wrapping ErrMissing, saying %q", name, err, reason)
		}
	}
}

func TestVMLoadWithoutPermission(t *testing.T) {
	vm.Require(t, "loadable kernel modules")
	k := &kmod.Kernel{}
	if got := k.Probe("ip_vs_nq")[0]; got.State != v1alpha1.ModuleLoadable {
		t.Fatalf("Probe(ip_vs_nq) = %+v; want Loadable", got)
	}
	// Capabilities belong to a thread: drop CAP_SYS_MODULE on one locked
	// thread, load from it, and let the thread die with the goroutine.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		data[unix.CAP_SYS_MODULE/32].Effective &^= 1 << (unix.CAP_SYS_MODULE % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		errc <- k.Load("ip_vs_nq")
	}()
	err := <-errc
	var e *kmod.Error
	if !errors.As(err, &e) || e.Module != "ip_vs_nq" || !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "CAP_SYS_MODULE") {
		t.Errorf("Load without CAP_SYS_MODULE = %v; want a kmod.Error naming ip_vs_nq, wrapping EPERM, naming CAP_SYS_MODULE", err)
	}
	if got := k.Probe("ip_vs_nq")[0]; got.State != v1alpha1.ModuleLoadable {
		t.Errorf("after the refused load, Probe(ip_vs_nq) = %+v; want Loadable", got)
	}
}

// compressors write the formats distributions compress modules with.
var compressors = map[string]func(io.Writer) (io.WriteCloser, error){
	"gz":  func(w io.Writer) (io.WriteCloser, error) { return gzip.NewWriter(w), nil },
	"xz":  func(w io.Writer) (io.WriteCloser, error) { return xz.NewWriter(w) },
	"zst": func(w io.Writer) (io.WriteCloser, error) { return zstd.NewWriter(w) },
}

func TestVMLoadCompressed(t *testing.T) {
	vm.Require(t, "loadable kernel modules")
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	srcDir := filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]), "kernel/net/netfilter")
	if _, err := os.Stat("/sys/module/compression"); err == nil {
		t.Log("this kernel decompresses modules itself: finit_module gets the compressed files")
	} else {
		t.Log("this kernel does not decompress modules: kmod decompresses them for init_module")
	}

	// A modules tree of its own: three leaf modules, each compressed
	// another way, on an uncompressed x_tables.
	dir := t.TempDir()
	leaves := map[string]string{"xt_u32": "xz", "xt_time": "zst", "xt_length": "gz"}
	dep := "kernel/x_tables.ko:\n"
	copyModule(t, filepath.Join(srcDir, "x_tables.ko"), filepath.Join(dir, "kernel/x_tables.ko"), "")
	k := &kmod.Kernel{ModulesDir: dir}
	var names []string
	for name, comp := range leaves {
		if got := (&kmod.Kernel{}).Probe(name)[0]; got.State != v1alpha1.ModuleLoadable {
			t.Fatalf("Probe(%s) = %+v; want Loadable (no other test may load it)", name, got)
		}
		rel := "kernel/" + name + ".ko." + comp
		copyModule(t, filepath.Join(srcDir, name+".ko"), filepath.Join(dir, rel), comp)
		dep += rel + ": kernel/x_tables.ko\n"
		names = append(names, name)
	}
	for file, content := range map[string]string{"modules.dep": dep, "modules.builtin": ""} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range k.Probe(names...) {
		if m.State != v1alpha1.ModuleLoadable || !strings.Contains(m.Reason, ".ko."+leaves[m.Name]) {
			t.Errorf("Probe(%s) in the compressed tree = %+v; want Loadable from its .ko.%s", m.Name, m, leaves[m.Name])
		}
	}
	if err := k.Load(names...); err != nil {
		t.Fatalf("Load(%v): %v", names, err)
	}
	requireLive(t, append(names, "x_tables")...)
}

// copyModule copies a module file, compressing it when comp is set.
func copyModule(t *testing.T, src, dst, comp string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if comp != "" {
		var buf bytes.Buffer
		w, err := compressors[comp](&buf)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		data = buf.Bytes()
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestVMModes checks the module lists against Debian's 6.1 kernel: every
// module each mode (every scheduler, both iptables backends) needs exists
// there, and loads.
func TestVMModes(t *testing.T) {
	vm.Require(t, "Debian's stock kernel with loadable netfilter modules")
	var all []string
	add := func(mods []string, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, mods...)
	}
	add(contract.ModulesFor(v1alpha1.ModeNFTables, ""))
	add(contract.ModulesFor(v1alpha1.ModeIPTables, ""))
	for _, s := range contract.Schedulers {
		add(contract.ModulesFor(v1alpha1.ModeIPVS, s))
	}
	add(contract.IPTablesBackendModules("legacy"))
	add(contract.IPTablesBackendModules("nft"))

	k := &kmod.Kernel{}
	for _, m := range k.Probe(all...) {
		if m.State == v1alpha1.ModuleMissing || m.State == v1alpha1.ModuleUnknown {
			t.Errorf("%s is %s on Debian's 6.1 kernel: %s", m.Name, m.State, m.Reason)
		}
	}
	vm.LoadModules(t, all...)
	for _, m := range k.Probe(all...) {
		if m.State != v1alpha1.ModuleLoaded && m.State != v1alpha1.ModuleBuiltIn {
			t.Errorf("after loading, %s is %s: %s", m.Name, m.State, m.Reason)
		}
	}
}
