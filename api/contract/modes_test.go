package contract

import (
	"slices"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestModulesFor(t *testing.T) {
	tests := []struct {
		name     string
		got      func() ([]string, error)
		contains []string
		lacks    []string
	}{
		{"ipvs default scheduler", func() ([]string, error) { return ModulesFor("ipvs", "") },
			[]string{"ip_vs", "ip_vs_rr", "nf_conntrack", "nf_nat", "dummy", "nf_conntrack_netlink", "nf_tables", "nft_ct", "nft_chain_nat", "nft_masq", "nft_reject_ipv4", "nft_reject_ipv6", "nft_fib_ipv4", "nft_fib_ipv6"},
			[]string{"ip_vs_wrr", "x_tables", "xt_set", "ip_set", "xt_MASQUERADE", "nft_nat", "nft_numgen"}},
		{"ipvs typed", func() ([]string, error) { return ModulesFor(v1alpha1.ModeIPVS, v1alpha1.IPVSScheduler("wrr")) },
			[]string{"ip_vs", "ip_vs_wrr"}, []string{"ip_vs_rr"}},
		{"nftables", func() ([]string, error) { return ModulesFor(v1alpha1.ModeNFTables, "") },
			[]string{"nf_tables", "nf_conntrack", "nf_nat", "nft_ct", "nft_nat", "nft_chain_nat", "nft_masq", "nft_numgen", "nft_fib_ipv4", "nft_reject_ipv6"}, []string{"ip_vs", "x_tables"}},
		{"iptables", func() ([]string, error) { return ModulesFor("iptables", "wrr") },
			[]string{"nf_conntrack", "xt_statistic", "xt_recent", "xt_mark", "xt_comment", "xt_conntrack", "xt_MASQUERADE", "xt_nat"}, []string{"ip_vs_wrr", "ip_tables"}},
		{"legacy backend", func() ([]string, error) { return IPTablesBackendModules("legacy") },
			[]string{"ip_tables", "iptable_nat", "ip6table_nat"}, []string{"nft_compat"}},
		{"nft backend", func() ([]string, error) { return IPTablesBackendModules("nft") },
			[]string{"nf_tables", "nft_compat", "nft_chain_nat"}, []string{"ip_tables"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mods, err := tt.got()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range tt.contains {
				if !slices.Contains(mods, m) {
					t.Errorf("%v lacks %s", mods, m)
				}
			}
			for _, m := range tt.lacks {
				if slices.Contains(mods, m) {
					t.Errorf("%v has %s", mods, m)
				}
			}
			seen := map[string]bool{}
			for _, m := range mods {
				// The kernel's spelling: underscores, never dashes.
				if seen[m] || strings.Contains(m, "-") {
					t.Errorf("%s listed twice or not in canonical form", m)
				}
				seen[m] = true
			}
		})
	}
	for _, s := range Schedulers {
		mods, err := ModulesFor(v1alpha1.ModeIPVS, s)
		if err != nil || !slices.Contains(mods, SchedulerModule(s)) || SchedulerModule(s) != "ip_vs_"+string(s) {
			t.Errorf("ModulesFor(ipvs, %s) = %v, %v", s, mods, err)
		}
	}
}

func TestModulesForRejects(t *testing.T) {
	if _, err := ModulesFor("userspace", ""); err == nil {
		t.Error("ModulesFor(userspace) succeeded")
	}
	if _, err := ModulesFor("ipvs", "twos"); err == nil {
		t.Error("ModulesFor(ipvs, twos) succeeded")
	}
	if _, err := IPTablesBackendModules("ebtables"); err == nil {
		t.Error("IPTablesBackendModules(ebtables) succeeded")
	}
}

// TestPreflightModulesAreLoaded checks that what the operator checks by
// name before moving a node is among what the agent loads for the mode,
// for every scheduler: the two sides agree on what a mode needs.
func TestPreflightModulesAreLoaded(t *testing.T) {
	for _, mode := range Modes {
		for _, s := range Schedulers {
			settings := &v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{Scheduler: s}}
			loaded, err := ModulesFor(mode, s)
			if err != nil {
				t.Fatal(err)
			}
			checked := PreflightModules(mode, settings)
			for _, m := range checked {
				if !slices.Contains(loaded, m) {
					t.Errorf("%s/%s: the operator checks %s, which the agent does not load (%v)", mode, s, m, loaded)
				}
			}
			if mode == v1alpha1.ModeIPVS && !slices.Contains(checked, SchedulerModule(s)) {
				t.Errorf("ipvs/%s: the operator does not check the scheduler's module: %v", s, checked)
			}
		}
	}
	if got, want := PreflightModules(v1alpha1.ModeIPVS, nil), []string{"ip_vs", "ip_vs_rr", "nf_conntrack"}; !slices.Equal(got, want) {
		t.Errorf("PreflightModules(ipvs, nil) = %v, want %v (the default scheduler's)", got, want)
	}
	wlc := &v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{Scheduler: "wlc"}}
	if got, want := PreflightModules(v1alpha1.ModeIPVS, wlc), []string{"ip_vs", "ip_vs_wlc", "nf_conntrack"}; !slices.Equal(got, want) {
		t.Errorf("PreflightModules(ipvs, wlc) = %v, want %v", got, want)
	}
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables} {
		if got := PreflightModules(m, wlc); got != nil {
			t.Errorf("PreflightModules(%s) = %v, want none (checked by capability)", m, got)
		}
	}
}

func TestModuleUsable(t *testing.T) {
	for st, want := range map[v1alpha1.ModuleState]bool{
		v1alpha1.ModuleLoaded: true, v1alpha1.ModuleBuiltIn: true, v1alpha1.ModuleLoadable: true,
		v1alpha1.ModuleMissing: false, v1alpha1.ModuleUnknown: false, "": false,
	} {
		if got := ModuleUsable(st); got != want {
			t.Errorf("ModuleUsable(%q) = %v, want %v", st, got, want)
		}
	}
}
