// Package preflight checks a node's reported kernel facts against what a
// proxy mode needs, so that the operator can block a rollout before any
// node moves. What a mode needs is the operator–agent contract
// (api/contract): the modules checked by name, and the capabilities the
// agent probes.
package preflight

import (
	"fmt"
	"strings"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

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
		for _, name := range contract.PreflightModules(mode, settings) {
			st, ok := states[name]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("kernel module %s not reported", name))
			case !contract.ModuleUsable(st):
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
	case v1alpha1.ModeKubeProxy:
		// kube-proxy brings its own dataplane; whether its DaemonSet
		// exists is the planner's check (plan.KubeProxy).
	default:
		out = append(out, fmt.Sprintf("unknown proxy mode %q", mode))
	}
	return out
}

// KubeProxyOverlap says why proxyshift in mode cannot pass a node to or
// from kube-proxy in kubeProxyMode; "" when it can. Both IPVS modes
// program the one IPVS table of the node, where a virtual service is one
// per address, protocol and port: taking a node over, proxyshift finds
// kube-proxy's virtual services where its own go (and takes none over);
// handing one back, kube-proxy adopts proxyshift's, which proxyshift's
// cleanup then deletes under it. Neither can be made before the other is
// broken, so the pair is refused rather than tried.
func KubeProxyOverlap(mode, kubeProxyMode v1alpha1.ProxyMode) string {
	if mode == v1alpha1.ModeIPVS && kubeProxyMode == v1alpha1.ModeIPVS {
		return "kube-proxy's IPVS mode and proxyshift's ipvs mode program the same IPVS virtual services (one per address, protocol and port), " +
			"so neither can take over from the other make-before-break"
	}
	return ""
}
