// Package facts finds out what the node's kernel offers the proxy modes,
// for the agent's ProxyNode status, and makes sure a mode's needs are met
// before the agent switches to it (the Preparing phase).
//
// It never guesses. A module's state comes from kmod (Loaded, BuiltIn,
// Loadable, Missing or Unknown, each with its source); a capability is Yes
// only when the kernel answered, No only when it answered that it cannot,
// and Unknown otherwise.
package facts

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/iptables"
	"github.com/proxyshift/proxyshift/nodeagent/ipvsfamily"
	"github.com/proxyshift/proxyshift/nodeagent/kmod"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Gatherer reads the kernel facts of one node.
type Gatherer struct {
	// Kernel probes and loads modules; the zero value is the running
	// kernel's /proc/modules, /lib/modules/$(uname -r) and /sys/module.
	Kernel *kmod.Kernel
	// NS is the node's network namespace (nsexec.Current for the agent's).
	NS nsexec.NS
	// IPTables reports the iptables backends; nil asks the iptables
	// dataplane (iptables.KernelFacts) in NS, read by IPTablesBackends.
	IPTables func(ctx context.Context) []v1alpha1.IPTablesBackend
	// IPVS says whether IPVS answers; nil probes the generic netlink
	// family "IPVS".
	IPVS func(ctx context.Context) (v1alpha1.Capability, string)
	// Settings, if set, reports the kernel settings the serving mode sets
	// (the agent's Fanout, which asks its serving backend); nil reports
	// none.
	Settings dataplane.SettingsReporter
}

// Gather reads the facts. Modules are those every mode needs, with every
// IPVS scheduler's module (contract.Schedulers: the operator checks the
// one a ProxyConfig asks for before it moves the node), and the tables of
// both iptables backends; each is listed once, under the name the kernel
// knows it by.
func (g *Gatherer) Gather(ctx context.Context) v1alpha1.KernelFacts {
	f := v1alpha1.KernelFacts{Version: Release()}
	var names []string
	for _, m := range contract.Modes {
		mods, _ := contract.ModulesFor(m, contract.DefaultScheduler)
		names = append(names, mods...)
	}
	for _, s := range contract.Schedulers {
		names = append(names, contract.SchedulerModule(s))
	}
	for _, v := range []iptables.Variant{iptables.Legacy, iptables.NFT} {
		mods, _ := contract.IPTablesBackendModules(string(v))
		names = append(names, mods...)
	}
	seen := map[string]bool{}
	for _, m := range g.kernel().Probe(dedupe(names)...) {
		km := m.KernelModule()
		if seen[km.Name] {
			continue
		}
		seen[km.Name] = true
		f.Modules = append(f.Modules, km)
	}
	slices.SortFunc(f.Modules, func(a, b v1alpha1.KernelModule) int { return strings.Compare(a.Name, b.Name) })
	f.NFTables, _ = g.NFTables()
	f.IPTablesBackends = g.iptables(ctx)
	f.Settings = g.settings()
	return f
}

// settings reads back the serving mode's kernel settings. A failure to
// read them is logged; what could be listed is still reported.
func (g *Gatherer) settings() []v1alpha1.KernelSetting {
	if g.Settings == nil {
		return nil
	}
	s, err := g.Settings.KernelSettings()
	if err != nil {
		klog.ErrorS(err, "Could not read back every kernel setting of the serving mode")
	}
	var out []v1alpha1.KernelSetting
	for _, k := range s {
		out = append(out, v1alpha1.KernelSetting{Name: k.Name, Want: k.Want, Value: k.Value})
	}
	return out
}

func (g *Gatherer) iptables(ctx context.Context) []v1alpha1.IPTablesBackend {
	if g.IPTables != nil {
		return g.IPTables(ctx)
	}
	return IPTablesBackends(iptables.KernelFacts(ctx, iptables.WithNetNS(g.NS)))
}

// IPTablesBackends describes what the iptables dataplane found of its
// variants in the API's terms: Available is No when the tools are not
// installed and Unknown when they fail; HasRules is Unknown unless
// Available is Yes.
func IPTablesBackends(variants []iptables.VariantFacts) []v1alpha1.IPTablesBackend {
	var out []v1alpha1.IPTablesBackend
	for _, v := range variants {
		b := v1alpha1.IPTablesBackend{Name: string(v.Variant), Available: v1alpha1.CapabilityYes, HasRules: v1alpha1.CapabilityNo}
		switch {
		case !v.Installed:
			b.Available, b.HasRules = v1alpha1.CapabilityNo, v1alpha1.CapabilityUnknown
		case v.Err != nil:
			b.Available, b.HasRules = v1alpha1.CapabilityUnknown, v1alpha1.CapabilityUnknown
		case v.HoldsRules:
			b.HasRules = v1alpha1.CapabilityYes
		}
		out = append(out, b)
	}
	return out
}

func (g *Gatherer) kernel() *kmod.Kernel {
	if g.Kernel == nil {
		return &kmod.Kernel{}
	}
	return g.Kernel
}

// Release is the running kernel's release (uname -r), or "" if uname fails.
func Release() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// NFTables says whether nf_tables answers over netlink in the node's
// namespace: Yes when listing tables works, No when the kernel says it has
// no such protocol or subsystem, Unknown for any other error (permission
// denied, for one), with the reason.
func (g *Gatherer) NFTables() (v1alpha1.Capability, string) {
	c, err := nftables.New(nftables.WithNetNSFd(g.NS.FD()))
	if err == nil {
		_, err = c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	}
	switch {
	case err == nil:
		return v1alpha1.CapabilityYes, "nf_tables answered over netlink"
	case errors.Is(err, syscall.EPROTONOSUPPORT), errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.EAFNOSUPPORT):
		return v1alpha1.CapabilityNo, "nf_tables does not answer over netlink: " + err.Error()
	}
	return v1alpha1.CapabilityUnknown, "listing nftables tables failed: " + err.Error()
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// Error is why a mode cannot run here, with a condition reason a person
// can act on.
type Error struct {
	// Reason is one of the contract's reasons of a failed preparation
	// (contract.ReasonModuleMissing, ReasonModuleUnknown,
	// ReasonModuleLoadFailed, ReasonCapabilityMissing,
	// ReasonUnsupportedMode).
	Reason  string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Prepare makes sure the kernel can run mode: it loads the modules the
// mode needs that are Loadable and fails closed, naming the module, when
// one is definitely Missing or cannot be loaded. A module whose state is
// Unknown (no /lib/modules in the container, no /proc/modules) is accepted
// only if the mode's capability probe shows the kernel does what the mode
// needs: nf_tables answering for nftables, an iptables backend whose tools
// work for iptables, the IPVS netlink family for ipvs. The error is an
// *Error.
func (g *Gatherer) Prepare(ctx context.Context, mode v1alpha1.ProxyMode, scheduler v1alpha1.IPVSScheduler) error {
	mods, err := contract.ModulesFor(mode, scheduler)
	if err != nil {
		return &Error{Reason: contract.ReasonUnsupportedMode, Message: err.Error()}
	}
	k := g.kernel()
	var load []string
	var unknown []kmod.Module
	for _, m := range k.Probe(mods...) {
		switch m.State {
		case v1alpha1.ModuleLoaded, v1alpha1.ModuleBuiltIn:
		case v1alpha1.ModuleLoadable:
			load = append(load, m.Name)
		case v1alpha1.ModuleMissing:
			return &Error{Reason: contract.ReasonModuleMissing, Message: fmt.Sprintf("kernel module %s is missing (%s); %s mode needs it: install it, or choose another mode", m.Resolved, m.Reason, mode)}
		default:
			unknown = append(unknown, m)
		}
	}
	if len(load) > 0 {
		if err := k.Load(load...); err != nil {
			return &Error{Reason: contract.ReasonModuleLoadFailed, Message: fmt.Sprintf("%v; %s mode needs it", err, mode)}
		}
	}
	capability, why := g.Capability(ctx, mode)
	if capability == v1alpha1.CapabilityYes {
		return nil
	}
	if len(unknown) > 0 {
		m := unknown[0]
		return &Error{Reason: contract.ReasonModuleUnknown, Message: fmt.Sprintf("the state of kernel module %s is unknown (%s) and the %s capability probe did not succeed (%s); mount /lib/modules and /proc into the agent, or load the module on the host", m.Resolved, m.Reason, mode, why)}
	}
	return &Error{Reason: contract.ReasonCapabilityMissing, Message: fmt.Sprintf("%s mode cannot run on this kernel: %s", mode, why)}
}

// Capability probes whether the kernel does what mode needs, and why.
func (g *Gatherer) Capability(ctx context.Context, mode v1alpha1.ProxyMode) (v1alpha1.Capability, string) {
	switch mode {
	case v1alpha1.ModeNFTables:
		return g.NFTables()
	case v1alpha1.ModeIPTables:
		backends := g.iptables(ctx)
		var seen []string
		result := v1alpha1.CapabilityNo
		for _, b := range backends {
			if b.Available == v1alpha1.CapabilityYes {
				return v1alpha1.CapabilityYes, "iptables backend " + b.Name + " works"
			}
			if b.Available == v1alpha1.CapabilityUnknown {
				result = v1alpha1.CapabilityUnknown
			}
			seen = append(seen, b.Name+": "+string(b.Available))
		}
		return result, "no iptables backend works (" + strings.Join(seen, ", ") + ")"
	case v1alpha1.ModeIPVS:
		if g.IPVS != nil {
			return g.IPVS(ctx)
		}
		return IPVSFamily()
	}
	return v1alpha1.CapabilityUnknown, fmt.Sprintf("unknown mode %q", mode)
}

// IPVSFamily says whether the kernel's IPVS answers: its generic netlink
// family exists (it does once ip_vs is in the kernel). It asks in a way
// that loads nothing (see ipvsfamily).
func IPVSFamily() (v1alpha1.Capability, string) {
	switch loaded, err := ipvsfamily.Loaded(); {
	case err != nil:
		return v1alpha1.CapabilityUnknown, "looking for the IPVS generic netlink family failed: " + err.Error()
	case loaded:
		return v1alpha1.CapabilityYes, "the IPVS generic netlink family exists"
	}
	return v1alpha1.CapabilityNo, "the kernel has no IPVS generic netlink family (ip_vs is not in the kernel)"
}
