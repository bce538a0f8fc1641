package ipvs

import (
	"slices"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/kmod"
)

// ModuleLoader loads kernel modules with their dependencies;
// *kmod.Kernel is one.
type ModuleLoader interface {
	Load(names ...string) error
}

// helperModules are what the helper table's rules use beyond nf_tables
// itself: ct state (nft_ct), the nat-type postrouting chain
// (nft_chain_nat), masquerade (nft_masq), reject (nft_reject_ipv4/6) and
// "fib saddr type local" (nft_fib_ipv4/6).
var helperModules = []string{
	"nf_tables", "nft_ct", "nft_chain_nat", "nft_masq",
	"nft_reject_ipv4", "nft_reject_ipv6", "nft_fib_ipv4", "nft_fib_ipv6",
}

// Modules lists the kernel modules the backend needs with scheduler (""
// is kmod.DefaultScheduler): kmod's list for the ipvs mode, which holds
// IPVS, the scheduler and the dummy interface, plus the modules of the
// nftables helper table.
func Modules(scheduler v1alpha1.IPVSScheduler) ([]string, error) {
	mods, err := kmod.ModulesFor(v1alpha1.ModeIPVS, scheduler)
	if err != nil {
		return nil, err
	}
	for _, m := range helperModules {
		if !slices.Contains(mods, m) {
			mods = append(mods, m)
		}
	}
	return mods, nil
}
