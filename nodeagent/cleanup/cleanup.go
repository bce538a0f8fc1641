// Package cleanup removes a proxy's objects from a node by their names,
// wherever they can be, whatever program or agent made them: the chains
// of both iptables backends (legacy and nft) in both IP families, nftables
// tables of both families, ipsets, dummy interfaces, and the IPVS virtual
// services whose addresses sit on such an interface. It touches nothing
// whose name it does not own.
//
// Two sets of names exist. Proxyshift is everything proxyshift's own
// backends create (used by `proxyshift-agent --cleanup`, for uninstall).
// KubeProxy is what kube-proxy leaves behind in any of its modes, used
// only when a node is taken over from kube-proxy, after kube-proxy's pod
// left it (ProxyNode spec.kubeProxyStopped). KubeProxy names kube-proxy's chains one
// by one, not "KUBE-*": kubelet's KUBE-FIREWALL, KUBE-KUBELET-CANARY,
// KUBE-MARK-DROP and KUBE-IPTABLES-HINT, and other programs' KUBE-*
// chains and ipsets (kube-router's KUBE-ROUTER-*, KUBE-NWPLCY-*, KUBE-SRC-*
// for one) are not kube-proxy's and stay.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	gnftables "github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/nftables"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Names says which objects are owned.
type Names struct {
	// What names the owner, for messages.
	What string
	// Chain says whether a chain of an iptables table is owned.
	Chain func(table, chain string) bool
	// RuleComment, if set, says whether a rule in a chain that is not
	// owned is owned by its comment.
	RuleComment func(comment string) bool
	// NFTTable says whether an nftables table (of the ip, ip6 or inet
	// family) is owned by its name.
	NFTTable func(name string) bool
	// NFTCheck, if set, checks a table NFTTable owns by its name for the
	// owner's mark: a table it refuses is someone else's look-alike, left
	// alone, and its error reported by Remove.
	NFTCheck func(ns nsexec.NS, fam gnftables.TableFamily, famName, name string) error
	// IPSet says whether an ipset is owned.
	IPSet func(name string) bool
	// Link says whether a dummy interface is owned; the IPVS virtual
	// services whose address is on an owned interface are owned too.
	Link func(name string) bool
}

// Proxyshift are proxyshift's own objects: iptables chains PROXYSHIFT-*
// (and rules commented "proxyshift..." in other chains), the nftables
// tables proxyshift and proxyshift-* (the nftables backend's service
// tables are proxyshift-services-0 to -15, the IPVS backend's helper
// table is proxyshift-ipvs), ipsets and dummy interfaces whose names start with
// proxyshift (in any case; the IPVS backend's is proxyshift-ipvs). A
// table is proxyshift's only if it also carries proxyshift's mark
// (nftables.CheckOwned).
var Proxyshift = &Names{
	What:        "proxyshift",
	Chain:       func(_, c string) bool { return strings.HasPrefix(c, "PROXYSHIFT-") },
	RuleComment: func(c string) bool { return hasFoldPrefix(c, "proxyshift") },
	NFTTable:    func(n string) bool { return n == nftables.TableName || hasFoldPrefix(n, nftables.TableName+"-") },
	NFTCheck:    nftables.CheckOwned,
	IPSet:       func(n string) bool { return hasFoldPrefix(n, "proxyshift") },
	Link:        func(n string) bool { return hasFoldPrefix(n, "proxyshift") },
}

func hasFoldPrefix(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// kube-proxy's iptables chains, from its iptables and IPVS proxiers.
var (
	kubeProxyChains = map[string]bool{
		"KUBE-SERVICES": true, "KUBE-EXTERNAL-SERVICES": true, "KUBE-NODEPORTS": true,
		"KUBE-POSTROUTING": true, "KUBE-MARK-MASQ": true, "KUBE-FORWARD": true,
		"KUBE-PROXY-FIREWALL": true, "KUBE-PROXY-CANARY": true,
		// IPVS mode.
		"KUBE-NODE-PORT": true, "KUBE-LOAD-BALANCER": true, "KUBE-SOURCE-RANGES-FIREWALL": true,
		"KUBE-IPVS-FILTER": true, "KUBE-IPVS-OUT-FILTER": true,
	}
	// Per-service chains of the iptables mode.
	kubeProxyChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-", "KUBE-XLB-"}
	// kube-proxy's IPVS ipsets (IPv6 ones are KUBE-6-…).
	kubeProxyIPSets = []string{
		"LOOP-BACK", "CLUSTER-IP", "EXTERNAL-IP", "EXTERNAL-IP-LOCAL", "LOAD-BALANCER", "LOAD-BALANCER-LOCAL",
		"LOAD-BALANCER-FW", "LOAD-BALANCER-SOURCE-IP", "LOAD-BALANCER-SOURCE-CIDR", "NODE-PORT-TCP",
		"NODE-PORT-LOCAL-TCP", "NODE-PORT-UDP", "NODE-PORT-LOCAL-UDP", "NODE-PORT-SCTP-HASH",
		"NODE-PORT-LOCAL-SCTP-HASH", "HEALTH-CHECK-NODE-PORT", "IPVS-IPS",
	}
)

// KubeProxyIPVSLink is the dummy interface kube-proxy's IPVS mode binds
// every service address to. Its addresses are Services', never the
// node's own.
const KubeProxyIPVSLink = "kube-ipvs0"

// KubeProxy are kube-proxy's leftovers in any of its modes: its KUBE-*
// chains (listed by name; KUBE-FIREWALL only in the nat table, where the
// IPVS mode has it; in filter it is kubelet's), its kube-proxy nftables
// tables, its KUBE-* ipsets, kube-ipvs0 and the IPVS services on
// kube-ipvs0's addresses.
var KubeProxy = &Names{
	What: "kube-proxy",
	Chain: func(table, c string) bool {
		if kubeProxyChains[c] || (c == "KUBE-FIREWALL" && table == "nat") {
			return true
		}
		return slices.ContainsFunc(kubeProxyChainPrefixes, func(p string) bool { return strings.HasPrefix(c, p) })
	},
	NFTTable: func(n string) bool { return n == "kube-proxy" },
	IPSet: func(n string) bool {
		for _, s := range kubeProxyIPSets {
			if n == "KUBE-"+s || n == "KUBE-6-"+s {
				return true
			}
		}
		return false
	},
	Link: func(n string) bool { return n == KubeProxyIPVSLink },
}

// Sweeper finds and removes owned objects in one network namespace.
type Sweeper struct {
	NS nsexec.NS
	// IPTablesBackends are the iptables backends to sweep (default legacy
	// and nft).
	IPTablesBackends []string
}

var iptablesFamilies = []struct{ bin, name string }{{"iptables", "IPv4"}, {"ip6tables", "IPv6"}}

func (s *Sweeper) backends() []string {
	if len(s.IPTablesBackends) > 0 {
		return s.IPTablesBackends
	}
	return []string{"legacy", "nft"}
}

// Present says whether any object names owns exists.
func (s *Sweeper) Present(ctx context.Context, names *Names) (bool, error) {
	found, _, err := s.run(ctx, names, false)
	return found, err
}

// Remove removes every object names owns and describes each, one line
// per object. Missing tools or kernel features are skipped (nothing of
// theirs can be there, or nothing can remove it: both said in the lines).
// IPVS services go first (their addresses are read from the interfaces),
// then iptables rules and chains (which may match ipsets), then ipsets,
// nftables tables and the interfaces.
func (s *Sweeper) Remove(ctx context.Context, names *Names) ([]string, error) {
	_, lines, err := s.run(ctx, names, true)
	return lines, err
}

func (s *Sweeper) run(ctx context.Context, names *Names, remove bool) (bool, []string, error) {
	var lines []string
	var errs []error
	found := false
	note := func(f bool, l []string, err error) {
		found = found || f
		lines = append(lines, l...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	note(s.ipvs(names, remove))
	for _, b := range s.backends() {
		for _, fam := range iptablesFamilies {
			note(s.iptables(ctx, names, fam.bin, b, fam.name, remove))
		}
	}
	note(s.ipsets(names, remove))
	note(s.nft(names, remove))
	note(s.links(names, remove))
	return found, lines, errors.Join(errs...)
}

// iptables sweeps one iptables backend of one family.
func (s *Sweeper) iptables(ctx context.Context, names *Names, bin, backend, family string, remove bool) (bool, []string, error) {
	where := fmt.Sprintf("%s-%s (%s)", bin, backend, family)
	save, err := s.NS.Output(ctx, nil, bin+"-"+backend+"-save")
	if errors.Is(err, exec.ErrNotFound) {
		return false, nil, nil // the tools are not installed: nothing can have made rules there through them
	}
	if err != nil {
		return false, nil, fmt.Errorf("%s: %w", where, err)
	}
	plan := planIPTables(save, names)
	if plan.empty() {
		return false, nil, nil
	}
	if !remove {
		return true, nil, nil
	}
	if _, err := s.NS.Output(ctx, plan.script(), bin+"-"+backend+"-restore", "-w", "5", "--noflush"); err != nil {
		return true, nil, fmt.Errorf("%s: remove %s's rules: %w", where, names.What, err)
	}
	return true, plan.describe(where), nil
}
