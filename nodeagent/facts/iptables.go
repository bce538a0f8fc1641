package facts

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// ProbeIPTables reports each iptables backend from its own tools, run in
// ns: Available is Yes when iptables-<backend>-save runs, No when the
// binary is not installed, Unknown when it fails otherwise; HasRules is Yes
// when the IPv4 or IPv6 save output has a rule or a chain of its own in
// any table, No when neither has, Unknown when a save failed.
func ProbeIPTables(ctx context.Context, ns nsexec.NS) []v1alpha1.IPTablesBackend {
	var out []v1alpha1.IPTablesBackend
	for _, b := range IPTablesBackends {
		r := v1alpha1.IPTablesBackend{Name: b}
		rules, failed := false, false
		for i, bin := range []string{"iptables-" + b + "-save", "ip6tables-" + b + "-save"} {
			data, err := ns.Output(ctx, nil, bin)
			state := v1alpha1.CapabilityYes
			switch {
			case errors.Is(err, exec.ErrNotFound):
				state, failed = v1alpha1.CapabilityNo, true
			case err != nil:
				state, failed = v1alpha1.CapabilityUnknown, true
			default:
				rules = rules || HasRules(data)
			}
			if i == 0 {
				r.Available = state
			}
		}
		switch {
		case rules:
			r.HasRules = v1alpha1.CapabilityYes
		case failed:
			r.HasRules = v1alpha1.CapabilityUnknown
		default:
			r.HasRules = v1alpha1.CapabilityNo
		}
		out = append(out, r)
	}
	return out
}

// builtinChains are the chains every iptables table starts with.
var builtinChains = map[string]bool{
	"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true,
}

// HasRules says whether iptables-save output holds any rule, or any chain
// besides the built-in ones.
func HasRules(save []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "-A "):
			return true
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if !builtinChains[name] {
				return true
			}
		}
	}
	return false
}

// IPVSFamily says whether the kernel's IPVS answers: its generic netlink
// family exists (it does once ip_vs is in the kernel). The family is not
// per namespace.
func IPVSFamily() (v1alpha1.Capability, string) {
	_, err := netlink.GenlFamilyGet("IPVS")
	switch {
	case err == nil:
		return v1alpha1.CapabilityYes, "the IPVS generic netlink family exists"
	case errors.Is(err, syscall.ENOENT):
		return v1alpha1.CapabilityNo, "the kernel has no IPVS generic netlink family (ip_vs is not in the kernel)"
	}
	return v1alpha1.CapabilityUnknown, "looking up the IPVS generic netlink family failed: " + err.Error()
}
