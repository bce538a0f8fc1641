package contract

import (
	"fmt"
	"slices"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Modes are the proxy modes, in the order the agent lists them.
var Modes = []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS}

// ValidMode says whether mode is one of Modes.
func ValidMode(mode v1alpha1.ProxyMode) bool { return slices.Contains(Modes, mode) }

// Targets are what a ProxyConfig or a ProxyNode may ask a node to run:
// one of Modes, or kube-proxy (the node handed back to the cluster's
// kube-proxy DaemonSet).
var Targets = append(slices.Clone(Modes), v1alpha1.ModeKubeProxy)

// ValidTarget says whether mode is one of Targets.
func ValidTarget(mode v1alpha1.ProxyMode) bool { return slices.Contains(Targets, mode) }

// The modules each mode needs, by what uses them. nf_tables, x_tables and
// their expressions, matches and targets are separate modules in
// distribution kernels; names are those of current kernels (kmod resolves
// renamed ones).
var (
	// natCore: conntrack tracks connections; NAT rewrites them. Every
	// mode's DNAT to endpoints and masquerading rest on them.
	natCore = []string{ConntrackModule, "nf_nat"}

	// nftablesCommon are what both the nftables dataplane's rules and
	// the ipvs dataplane's helper table use, in ip and ip6 tables: ct
	// state and status (nft_ct), nat-type chains (nft_chain_nat),
	// masquerade (nft_masq), fib lookups of local addresses
	// (nft_fib_ipv4/6) and reject for Services without endpoints
	// (nft_reject_ipv4/6). Lookups, concatenations, ranges, verdict maps,
	// dynamic sets and counters are part of nf_tables itself.
	nftablesCommon = []string{
		"nf_tables", "nft_ct", "nft_chain_nat", "nft_masq",
		"nft_fib_ipv4", "nft_fib_ipv6", "nft_reject_ipv4", "nft_reject_ipv6",
	}

	// nftablesModules are what the nftables dataplane adds: dnat
	// statements (nft_nat) and random endpoint choice (nft_numgen).
	nftablesModules = []string{"nft_nat", "nft_numgen"}

	// iptablesModules are the matches and targets kube-proxy's iptables
	// rules use, whichever backend runs them: -m comment, -m mark and -j
	// MARK (xt_mark), -m conntrack, -m statistic (random endpoint
	// choice), -m recent (ClientIP affinity), -m addrtype (local
	// destinations), -p tcp/udp/sctp port matches (xt_tcpudp, xt_sctp),
	// -j MASQUERADE, -j DNAT (xt_nat) and -j REJECT.
	iptablesModules = []string{
		"x_tables", "xt_comment", "xt_mark", "xt_conntrack", "xt_statistic", "xt_recent",
		"xt_addrtype", "xt_tcpudp", "xt_sctp", "xt_MASQUERADE", "xt_nat", "ipt_REJECT", "ip6t_REJECT",
	}

	// ipvsModules are the IPVS core (the scheduler is added by mode) and
	// the dummy interface that holds Service IPs. The ipvs dataplane
	// filters and masquerades with an nftables helper table
	// (nodeagent/dataplane/ipvs), which needs nftablesCommon: no ipset
	// or xtables module, which is how kube-proxy's IPVS mode does it.
	// nf_conntrack_netlink (ctnetlink) is for leaving ipvs: Cleanup hands
	// the connections IPVS forwarded over to conntrack NAT entries it
	// writes over ctnetlink.
	ipvsModules = []string{IPVSModule, "dummy", "nf_conntrack_netlink"}

	// iptablesBackends are the tables of each iptables backend: the
	// legacy one's ip_tables and ip6_tables with their filter and nat
	// tables, or nf_tables running the same rules through nft_compat in
	// nat-type chains.
	iptablesBackends = map[string][]string{
		"legacy": {"ip_tables", "iptable_filter", "iptable_nat", "ip6_tables", "ip6table_filter", "ip6table_nat"},
		"nft":    {"nf_tables", "nft_compat", "nft_chain_nat"},
	}
)

// IPVSModule is the IPVS core.
const IPVSModule = "ip_vs"

// ConntrackModule is connection tracking, which every mode needs (it
// replaced nf_conntrack_ipv4 in Linux 4.19; nf_conntrack exists on both).
const ConntrackModule = "nf_conntrack"

// ModulesFor lists the kernel modules a proxy mode needs, in the order to
// load them. scheduler matters for ipvs only, where it adds its module
// (SchedulerModule; empty means DefaultScheduler). The iptables mode also
// needs the tables of the iptables backend that runs its rules: see
// IPTablesBackendModules.
func ModulesFor(mode v1alpha1.ProxyMode, scheduler v1alpha1.IPVSScheduler) ([]string, error) {
	var lists [][]string
	switch mode {
	case v1alpha1.ModeNFTables:
		lists = [][]string{natCore, nftablesCommon, nftablesModules}
	case v1alpha1.ModeIPTables:
		lists = [][]string{natCore, iptablesModules}
	case v1alpha1.ModeIPVS:
		sched, err := Scheduler(scheduler)
		if err != nil {
			return nil, err
		}
		lists = [][]string{natCore, ipvsModules, {SchedulerModule(sched)}, nftablesCommon}
	default:
		return nil, fmt.Errorf("unknown proxy mode %q (want %s, %s or %s)", mode, v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS)
	}
	var out []string
	seen := map[string]bool{}
	for _, l := range lists {
		for _, m := range l {
			if !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// IPTablesBackendModules lists the table modules of one iptables backend,
// named as v1alpha1.IPTablesBackend names it: "legacy" or "nft".
func IPTablesBackendModules(backend string) ([]string, error) {
	mods, ok := iptablesBackends[backend]
	if !ok {
		return nil, fmt.Errorf("unknown iptables backend %q (want legacy or nft)", backend)
	}
	return slices.Clone(mods), nil
}

// PreflightModules are the modules the operator checks by name in a
// node's kernel facts before it moves the node to mode, sorted. Only ipvs
// has any: the IPVS core, the scheduler's module and connection tracking,
// which distribution kernels ship as loadable modules that may be absent.
// The other modes are checked through the capabilities the agent probes
// (nf_tables answering over netlink, a working iptables backend), which
// say more than module states: nf_tables and x_tables are built into many
// kernels.
func PreflightModules(mode v1alpha1.ProxyMode, settings *v1alpha1.ProxySettings) []string {
	if mode != v1alpha1.ModeIPVS {
		return nil
	}
	var sched v1alpha1.IPVSScheduler
	if settings != nil && settings.IPVS != nil {
		sched = settings.IPVS.Scheduler
	}
	if sched == "" {
		sched = DefaultScheduler
	}
	mods := []string{IPVSModule, SchedulerModule(sched), ConntrackModule}
	slices.Sort(mods)
	return mods
}

// ModuleUsable says whether a module in this state can be used: it is
// loaded, built in, or can be loaded. Missing and Unknown are not usable;
// the operator fails closed on Unknown.
func ModuleUsable(s v1alpha1.ModuleState) bool {
	switch s {
	case v1alpha1.ModuleLoaded, v1alpha1.ModuleBuiltIn, v1alpha1.ModuleLoadable:
		return true
	}
	return false
}
