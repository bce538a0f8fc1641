package facts

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/iptables"
	"github.com/proxyshift/proxyshift/nodeagent/kmod"
)

// fixture is a kernel whose modules.builtin lists every module the modes
// need but missing, with nothing loaded.
func fixture(t *testing.T, missing string) *kmod.Kernel {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS} {
		mods, _ := contract.ModulesFor(m, "")
		for _, n := range mods {
			if n != missing {
				b.WriteString("kernel/" + n + ".ko\n")
			}
		}
	}
	for p, c := range map[string]string{"modules.builtin": b.String(), "modules.dep": "", "proc-modules": ""} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &kmod.Kernel{ModulesDir: dir, ProcModules: filepath.Join(dir, "proc-modules"), SysModule: t.TempDir()}
}

func TestPrepareFailsClosedOnAMissingModule(t *testing.T) {
	g := &Gatherer{Kernel: fixture(t, "ip_vs_rr"), IPVS: func(context.Context) (v1alpha1.Capability, string) {
		return v1alpha1.CapabilityYes, "pretend"
	}}
	err := g.Prepare(context.Background(), v1alpha1.ModeIPVS, "rr")
	var fe *Error
	if !errors.As(err, &fe) || fe.Reason != contract.ReasonModuleMissing || !strings.Contains(fe.Message, "ip_vs_rr") {
		t.Fatalf("Prepare = %v; want ModuleMissing naming ip_vs_rr even though the capability probe works", err)
	}
}

func TestPrepareUnknownNeedsTheCapability(t *testing.T) {
	// No modules directory at all: every module not in /sys/module is
	// Unknown; the capability decides.
	k := &kmod.Kernel{ModulesDir: filepath.Join(t.TempDir(), "none"), ProcModules: filepath.Join(t.TempDir(), "none"), SysModule: t.TempDir()}
	works := &Gatherer{Kernel: k, IPVS: func(context.Context) (v1alpha1.Capability, string) { return v1alpha1.CapabilityYes, "answers" }}
	if err := works.Prepare(context.Background(), v1alpha1.ModeIPVS, ""); err != nil {
		t.Errorf("unknown modules with a working capability: %v", err)
	}
	broken := &Gatherer{Kernel: k, IPVS: func(context.Context) (v1alpha1.Capability, string) { return v1alpha1.CapabilityNo, "no IPVS family" }}
	err := broken.Prepare(context.Background(), v1alpha1.ModeIPVS, "")
	var fe *Error
	if !errors.As(err, &fe) || fe.Reason != contract.ReasonModuleUnknown || !strings.Contains(fe.Message, "no IPVS family") {
		t.Errorf("unknown modules without the capability: %v; want ModuleUnknown with the probe's reason", err)
	}
}

func TestGatherReportsEveryModuleOnce(t *testing.T) {
	g := &Gatherer{Kernel: fixture(t, "nft_numgen"), IPTables: func(context.Context) []v1alpha1.IPTablesBackend {
		return []v1alpha1.IPTablesBackend{{Name: "nft", Available: v1alpha1.CapabilityYes, HasRules: v1alpha1.CapabilityNo}}
	}}
	f := g.Gather(context.Background())
	seen := map[string]v1alpha1.ModuleState{}
	for _, m := range f.Modules {
		if _, dup := seen[m.Name]; dup {
			t.Errorf("module %s reported twice", m.Name)
		}
		seen[m.Name] = m.State
	}
	for name, want := range map[string]v1alpha1.ModuleState{
		"nft_numgen": v1alpha1.ModuleMissing, "nf_tables": v1alpha1.ModuleBuiltIn, "ip_vs": v1alpha1.ModuleBuiltIn,
		"ip_vs_rr": v1alpha1.ModuleBuiltIn, "ip_vs_sh": v1alpha1.ModuleMissing, "ip_vs_wrr": v1alpha1.ModuleMissing,
		"iptable_nat": v1alpha1.ModuleMissing, "nft_compat": v1alpha1.ModuleMissing,
	} {
		if seen[name] != want {
			t.Errorf("module %s = %q, want %s", name, seen[name], want)
		}
	}
	// Every scheduler's module, whatever the node runs now: the
	// operator checks the one a ProxyConfig asks for before moving it.
	for _, s := range contract.Schedulers {
		if _, ok := seen[contract.SchedulerModule(s)]; !ok {
			t.Errorf("the module of scheduler %s is not reported", s)
		}
	}
	if f.Version == "" || len(f.IPTablesBackends) != 1 {
		t.Errorf("facts %+v", f)
	}
}

func TestIPTablesBackends(t *testing.T) {
	boom := errors.New("boom")
	got := IPTablesBackends([]iptables.VariantFacts{
		{Variant: iptables.NFT, Installed: true},
		{Variant: iptables.Legacy, Installed: true, HoldsRules: true},
		{Variant: iptables.Legacy},
		{Variant: iptables.NFT, Installed: true, Err: boom},
	})
	want := []v1alpha1.IPTablesBackend{
		{Name: "nft", Available: "Yes", HasRules: "No"},
		{Name: "legacy", Available: "Yes", HasRules: "Yes"},
		{Name: "legacy", Available: "No", HasRules: "Unknown"},
		{Name: "nft", Available: "Unknown", HasRules: "Unknown"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("IPTablesBackends = %+v, want %+v", got, want)
	}
}

// settingsReporter reports fixed settings and an error.
type settingsReporter struct {
	settings []dataplane.KernelSetting
	err      error
}

func (r settingsReporter) KernelSettings() ([]dataplane.KernelSetting, error) {
	return r.settings, r.err
}

func TestGatherReportsTheServingModesSettings(t *testing.T) {
	noIPTables := func(context.Context) []v1alpha1.IPTablesBackend { return nil }
	none := &Gatherer{Kernel: fixture(t, ""), IPTables: noIPTables}
	if f := none.Gather(context.Background()); f.Settings != nil {
		t.Errorf("without a settings reporter: %+v; want none", f.Settings)
	}
	want := []v1alpha1.KernelSetting{
		{Name: "net.ipv4.vs.conntrack", Want: "1", Value: "1"},
		{Name: "net.ipv4.conf.all.arp_ignore", Want: "1"},
	}
	read := []dataplane.KernelSetting{
		{Name: "net.ipv4.vs.conntrack", Want: "1", Value: "1"},
		{Name: "net.ipv4.conf.all.arp_ignore", Want: "1"},
	}
	g := &Gatherer{Kernel: fixture(t, ""), IPTables: noIPTables,
		Settings: settingsReporter{settings: read, err: errors.New("could not enter the namespace")}}
	if f := g.Gather(context.Background()); !reflect.DeepEqual(f.Settings, want) {
		t.Errorf("settings = %+v; want %+v (what could be read, despite the error)", f.Settings, want)
	}
}
