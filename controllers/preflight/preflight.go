// Package preflight says what a node's kernel must offer to run each proxy
// mode, and checks a node's reported kernel facts against it. It is the one
// place the mode -> requirements mapping lives: the operator uses it to
// block a rollout before any node moves, and the agent can use
// RequiredModules to know which modules to load. It imports nothing but the
// API types, so both sides can depend on it.
package preflight

import (
	"fmt"
	"sort"
	"strings"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// DefaultIPVSScheduler is the scheduler used when none is set; it matches
// the API default.
const DefaultIPVSScheduler v1alpha1.IPVSScheduler = "rr"

// ConntrackModule is the connection-tracking module IPVS mode needs (it
// replaced nf_conntrack_ipv4 in Linux 4.19; nf_conntrack exists on both).
const ConntrackModule = "nf_conntrack"

// RequiredModules are the kernel modules a mode needs with the given
// settings, sorted. Only ipvs needs named modules: the other modes are
// checked through the capabilities the agent probes (nf_tables over
// netlink, the iptables backends).
func RequiredModules(mode v1alpha1.ProxyMode, settings *v1alpha1.ProxySettings) []string {
	if mode != v1alpha1.ModeIPVS {
		return nil
	}
	sched := DefaultIPVSScheduler
	if settings != nil && settings.IPVS != nil && settings.IPVS.Scheduler != "" {
		sched = settings.IPVS.Scheduler
	}
	mods := []string{"ip_vs", "ip_vs_" + string(sched), ConntrackModule}
	sort.Strings(mods)
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

// Problems lists, in words a person can act on, why a node with these
// kernel facts cannot run the mode. Empty means it can. Nil facts (the
// agent has not reported) is itself a problem.
func Problems(mode v1alpha1.ProxyMode, settings *v1alpha1.ProxySettings, k *v1alpha1.KernelFacts) []string {
	if k == nil {
		return []string{"the agent has not reported kernel facts"}
	}
	var out []string
	switch mode {
	case v1alpha1.ModeIPVS:
		states := make(map[string]v1alpha1.ModuleState, len(k.Modules))
		for _, m := range k.Modules {
			states[m.Name] = m.State
		}
		for _, name := range RequiredModules(mode, settings) {
			st, ok := states[name]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("kernel module %s not reported", name))
			case !ModuleUsable(st):
				out = append(out, fmt.Sprintf("kernel module %s is %s", name, st))
			}
		}
	case v1alpha1.ModeNFTables:
		if k.NFTables != v1alpha1.CapabilityYes {
			st := k.NFTables
			if st == "" {
				st = v1alpha1.CapabilityUnknown
			}
			out = append(out, fmt.Sprintf("nf_tables is not usable (nftables: %s)", st))
		}
	case v1alpha1.ModeIPTables:
		var seen []string
		ok := false
		for _, b := range k.IPTablesBackends {
			if b.Available == v1alpha1.CapabilityYes {
				ok = true
			}
			seen = append(seen, fmt.Sprintf("%s: %s", b.Name, b.Available))
		}
		if !ok {
			if len(seen) == 0 {
				out = append(out, "no iptables backend reported")
			} else {
				out = append(out, "no usable iptables backend ("+strings.Join(seen, ", ")+")")
			}
		}
	default:
		out = append(out, fmt.Sprintf("unknown proxy mode %q", mode))
	}
	return out
}
