// Package backends builds the agent's dataplane backends: one factory per
// proxy mode, in one map. It is where the operator–agent contract's
// reading of a ProxyNode's spec.settings (api/contract) meets the
// backends' plain options, so that the backends themselves know nothing of
// the API, and the agent's main holds flags and wiring only.
package backends

import (
	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/iptables"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/ipvs"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/nftables"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Factory builds a mode's backend for the node cfg describes, with the
// ProxyNode's spec.settings (empty when no ProxyNode sets them). The agent
// builds backends to look at what the kernel holds and to clean up, not
// only to program, on every node from its start: a factory programs
// nothing and loads no kernel module (installing changes nothing; a
// switch loads the modules of its target when it prepares). The ipvs one
// checks that IPVS answers, so it fails where IPVS is not loaded, which
// tells a look at the kernel that IPVS holds nothing there.
type Factory func(cfg dataplane.NodeConfig, settings v1alpha1.ProxySettings) (dataplane.Backend, error)

// Env is where the backends work.
type Env struct {
	// NS is the node's network namespace (the zero value: the agent's).
	NS nsexec.NS
	// ProcSys is where the ipvs and iptables modes read and write their
	// sysctls ("" is /proc/sys; see ipvs.WithProcSys).
	ProcSys string
}

// Factories returns a factory for every mode of contract.Modes.
func Factories(env Env) map[v1alpha1.ProxyMode]Factory {
	return map[v1alpha1.ProxyMode]Factory{
		v1alpha1.ModeNFTables: func(cfg dataplane.NodeConfig, _ v1alpha1.ProxySettings) (dataplane.Backend, error) {
			return nftables.New(cfg, nftables.WithNetNS(env.NS))
		},
		v1alpha1.ModeIPTables: func(cfg dataplane.NodeConfig, s v1alpha1.ProxySettings) (dataplane.Backend, error) {
			return iptables.New(cfg, iptables.WithNetNS(env.NS), iptables.WithProcSys(env.ProcSys),
				iptables.WithLocalhostNodePorts(contract.LocalhostNodePorts(s.IPTables)))
		},
		v1alpha1.ModeIPVS: func(cfg dataplane.NodeConfig, s v1alpha1.ProxySettings) (dataplane.Backend, error) {
			opts, err := IPVSOptions(s.IPVS)
			if err != nil {
				return nil, err
			}
			return ipvs.New(cfg, append(opts, ipvs.WithNetNS(env.NS), ipvs.WithProcSys(env.ProcSys))...)
		},
	}
}

// IPVSOptions are the ipvs backend's options for the IPVS section of a
// ProxyNode's settings (nil: the defaults), read by the contract: the
// scheduler, strict ARP, the timeouts and the excluded CIDRs.
func IPVSOptions(s *v1alpha1.IPVSSettings) ([]ipvs.Option, error) {
	o, err := contract.IPVSOptions(s)
	if err != nil {
		return nil, err
	}
	opts := []ipvs.Option{
		ipvs.WithScheduler(string(o.Scheduler)),
		ipvs.WithStrictARP(o.StrictARP),
		ipvs.WithTimeouts(ipvs.Timeouts{TCP: o.TCPTimeout, TCPFin: o.TCPFinTimeout, UDP: o.UDPTimeout}),
		ipvs.WithExcludeCIDRs(o.ExcludeCIDRs...),
	}
	return opts, nil
}
