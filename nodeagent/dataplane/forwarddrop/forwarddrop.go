// Package forwarddrop finds what makes a node drop forwarded packets by
// default: netfilter base chains at the forward hook whose policy is
// drop and that are not proxyshift's. The common one is iptables' filter
// FORWARD chain with policy DROP, which Docker sets, in either iptables
// variant; firewalls written in nftables have their own.
//
// Why a package of its own: service traffic to endpoints is forwarded,
// and in netfilter a drop in any base chain is final, so an accept in a
// chain of ours cannot overrule a drop policy in another program's. The
// iptables mode puts its accept rules into iptables' FORWARD chain itself
// (as kube-proxy does), but the nftables and IPVS modes program nftables
// tables of their own and cannot; they use this package to find such
// chains and report them (a dataplane.Warning) instead of failing
// silently. What each mode needs from the host is in their READMEs.
package forwarddrop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Find returns the base chains at the forward hook with policy drop in
// network namespace ns that are not in a table of ownTables, one line
// each, sorted: "nftables ip filter FORWARD" for an nftables chain (which
// is what iptables-nft's filter FORWARD is), "iptables-legacy filter
// FORWARD" (and ip6tables-legacy) for the legacy variant's. The legacy
// variant is read from the kernel only when its filter table exists in
// ns (listed in ip_tables_names under /proc/thread-self/net, the
// namespace of the thread, not of the process), so Find never creates it.
// A family whose tables hold more than listedChains (20 000) chains is
// not listed: each of its tables is asked for its forward chain by name
// instead.
func Find(ctx context.Context, ns nsexec.NS, ownTables ...string) ([]string, error) {
	var found []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyINet} {
		tables, err := nft.TableUses(ns, fam)
		if err != nil {
			return nil, fmt.Errorf("forwarddrop: %w", err)
		}
		chains := 0
		for _, use := range tables {
			chains += int(use)
		}
		note := func(c *nftables.Chain) {
			if c != nil && dropsForwarded(c) && !slices.Contains(ownTables, c.Table.Name) {
				found = append(found, fmt.Sprintf("nftables %s %s %s", familyName(c.Table.Family), c.Table.Name, c.Name))
			}
		}
		if chains > listedChains {
			if err := lookUpForwardChains(ns, fam, tables, ownTables, note); err != nil {
				return nil, err
			}
			continue
		}
		r, err := nft.NewReader(ctx, ns, fam, "")
		if err != nil {
			return nil, fmt.Errorf("forwarddrop: %w", err)
		}
		err = r.EachChain(note)
		_ = r.Close()
		if err != nil {
			return nil, fmt.Errorf("forwarddrop: list nftables chains: %w", err)
		}
	}
	legacy, err := legacyForwardDrop(ctx, ns)
	if err != nil {
		return nil, err
	}
	found = append(found, legacy...)
	slices.Sort(found)
	return found, nil
}

// listedChains is the most chains a family's tables may hold (as their
// use counts say: chains, sets and other objects) for Find to list them
// all. The kernel lists a family's chains in pieces of at most 32 KB and
// walks every chain before a piece's first to resume it, so a listing
// costs the square of the chains: 20 000 take about 40 ms, 110 000
// (iptables-nft's tables at 10 000 services, while a node switches from
// iptables to nftables mode, whose first sync looks) 0.4 s in
// BenchmarkFindBesideIPTables10k's namespace and 1.1 s of the agent's CPU
// in that switch, half its Programming phase. Above it, Find asks each
// table for its forward chain by the names programs give it
// (lookUpForwardChains), 4 ms in all. A variable for the tests.
var listedChains = 20000

// forwardChainNames are the names base chains at the forward hook have
// in the tables that grow that large, which programs generate: iptables'
// FORWARD (iptables-nft's filter table), kube-proxy's and proxyshift's
// filter-forward, and forward, the name nft's own examples give it.
var forwardChainNames = []string{"FORWARD", "filter-forward", "forward"}

// lookUpForwardChains calls note with each chain named in
// forwardChainNames of tables (family fam) but ownTables, found by name;
// a forward chain of another name is not seen. It asks for each chain
// alone, which the kernel finds in a hash table.
func lookUpForwardChains(ns nsexec.NS, fam nftables.TableFamily, tables map[string]uint32, ownTables []string, note func(*nftables.Chain)) error {
	for table := range tables {
		if slices.Contains(ownTables, table) {
			continue
		}
		for _, name := range forwardChainNames {
			c, err := nft.LookupChain(ns, fam, table, name)
			if err != nil {
				return fmt.Errorf("forwarddrop: %w", err)
			}
			note(c)
		}
	}
	return nil
}

// dropsForwarded says whether c is a base chain at the forward hook of
// an IP family (not bridge or netdev) whose policy is drop.
func dropsForwarded(c *nftables.Chain) bool {
	if c.Hooknum == nil || *c.Hooknum != *nftables.ChainHookForward || c.Policy == nil || *c.Policy != nftables.ChainPolicyDrop {
		return false
	}
	switch c.Table.Family {
	case nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyINet:
		return true
	}
	return false
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return "inet"
}

// legacyForwardDrop returns the legacy variant's filter FORWARD chains
// (IPv4, IPv6) whose policy is DROP, read with iptables-legacy -S, when
// their filter table exists.
func legacyForwardDrop(ctx context.Context, ns nsexec.NS) ([]string, error) {
	var found []string
	for _, fam := range []struct{ names, tool string }{
		{"/proc/thread-self/net/ip_tables_names", "iptables-legacy"},
		{"/proc/thread-self/net/ip6_tables_names", "ip6tables-legacy"},
	} {
		var tables []byte
		err := ns.Do(func() error {
			var err error
			tables, err = os.ReadFile(fam.names)
			return err
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("forwarddrop: %w", err)
		}
		if !slices.Contains(strings.Fields(string(tables)), "filter") {
			continue // no legacy tables at all, or no filter table
		}
		path, err := nsexec.LookPath(fam.tool)
		if err != nil {
			// A filter table without the tools to read it: someone
			// else's, unknown; not a finding.
			continue
		}
		out, err := ns.Output(ctx, nil, path, "-w", "5", "-t", "filter", "-S", "FORWARD")
		if err != nil {
			return nil, fmt.Errorf("forwarddrop: %w", err)
		}
		if policyDrop(string(out)) {
			found = append(found, fam.tool+" filter FORWARD")
		}
	}
	return found, nil
}

// policyDrop says whether the output of iptables -S FORWARD sets the
// chain's policy to DROP.
func policyDrop(out string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == "-P FORWARD DROP" {
			return true
		}
	}
	return false
}

// Warning says that forwarded service traffic meets chains the backend
// cannot overrule: the sync programmed everything, but connections to
// endpoints the node forwards to are dropped unless the host's own rules
// accept them. It is a dataplane.Warning (Degraded while the node
// serves), naming the chains.
type Warning struct {
	// Mode is the backend's mode (nftables, ipvs).
	Mode string
	// Chains are what Find found.
	Chains []string
}

// Error says what is dropped, why the backend cannot help it, and what
// the host must do.
func (w *Warning) Error() string {
	return fmt.Sprintf("%s: the node drops forwarded packets by default (%s): Service connections the node forwards to endpoints, "+
		"and their replies, are dropped unless the host's own rules accept them; an accept in proxyshift's table cannot overrule a drop "+
		"elsewhere. Accept forwarded traffic to and from the pod networks there (many CNIs do), or use the iptables mode, "+
		"which adds its accept rules to iptables' FORWARD chain", w.Mode, strings.Join(w.Chains, ", "))
}

// LeftAlone names the chains (dataplane.Warning).
func (w *Warning) LeftAlone() []string { return w.Chains }

// Check is what a backend keeps to report such chains on every sync
// while looking for them only on full syncs (a netlink dump of every
// chain, and maybe an iptables-legacy run, is not for every endpoint
// change). The zero value needs Mode, NS and Own set.
type Check struct {
	// Mode names the backend in the warning.
	Mode string
	// NS is the node's network namespace.
	NS nsexec.NS
	// Own are the backend's own tables, whose chains never count.
	Own []string

	looked bool
	chains []string
}

// Sync looks again when full (or when it never looked) and returns a
// *Warning naming what it found, nil when nothing drops forwarded
// packets by default. A failed look is not a finding: it keeps what it
// found before and looks again on the next full sync.
func (c *Check) Sync(ctx context.Context, full bool) error {
	if full || !c.looked {
		if chains, err := Find(ctx, c.NS, c.Own...); err == nil {
			c.chains, c.looked = chains, true
		}
	}
	if len(c.chains) == 0 {
		return nil
	}
	return &Warning{Mode: c.Mode, Chains: slices.Clone(c.chains)}
}
