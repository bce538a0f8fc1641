package kmod

import (
	"fmt"
	"slices"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Schedulers are the IPVS schedulers the API accepts; each is a module
// ip_vs_<name>.
var Schedulers = []v1alpha1.IPVSScheduler{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh"}

// DefaultScheduler is the scheduler used when none is set (the API's
// default).
const DefaultScheduler v1alpha1.IPVSScheduler = "rr"

// The modules each mode needs, by what uses them. nf_tables, x_tables and
// their expressions, matches and targets are separate modules in
// distribution kernels; names are those of current kernels (see renamed
// for older ones).
var (
	// conntrack tracks connections; NAT rewrites them. Every mode's
	// DNAT to endpoints and masquerading rest on them.
	natCore = []string{"nf_conntrack", "nf_nat"}

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
	ipvsModules = []string{"ip_vs", "dummy"}

	// iptablesBackends are the tables of each iptables backend: the
	// legacy one's ip_tables and ip6_tables with their filter and nat
	// tables, or nf_tables running the same rules through nft_compat in
	// nat-type chains.
	iptablesBackends = map[string][]string{
		"legacy": {"ip_tables", "iptable_filter", "iptable_nat", "ip6_tables", "ip6table_filter", "ip6table_nat"},
		"nft":    {"nf_tables", "nft_compat", "nft_chain_nat"},
	}
)

// ModulesFor lists the kernel modules a proxy mode needs, in the order to
// load them. mode is an api/v1alpha1 ProxyMode or its string ("iptables",
// "nftables", "ipvs"); scheduler matters for ipvs only, where it adds
// ip_vs_<scheduler> (empty means DefaultScheduler). The iptables mode
// also needs the tables of the iptables backend that runs its rules: see
// IPTablesBackendModules.
func ModulesFor[M, S ~string](mode M, scheduler S) ([]string, error) {
	var lists [][]string
	switch v1alpha1.ProxyMode(mode) {
	case v1alpha1.ModeNFTables:
		lists = [][]string{natCore, nftablesCommon, nftablesModules}
	case v1alpha1.ModeIPTables:
		lists = [][]string{natCore, iptablesModules}
	case v1alpha1.ModeIPVS:
		sched := v1alpha1.IPVSScheduler(scheduler)
		if sched == "" {
			sched = DefaultScheduler
		}
		if !slices.Contains(Schedulers, sched) {
			return nil, fmt.Errorf("unknown IPVS scheduler %q (want one of %v)", sched, Schedulers)
		}
		lists = [][]string{natCore, ipvsModules, {"ip_vs_" + string(sched)}, nftablesCommon}
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
	return append([]string(nil), mods...), nil
}
