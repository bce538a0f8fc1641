package iptables

import (
	"context"
	"fmt"
	"slices"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// hintChains are the chains kubelet (Kubernetes 1.17 and later) creates in
// the mangle table of the variant the host uses, precisely so that
// containers can tell which one that is.
var hintChains = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// probe is what one variant's tools say about a network namespace.
type probe struct {
	variant Variant
	// missing names a command of the variant that is not installed.
	missing string
	// err is why the variant's tools failed for IPv4.
	err error
	// hinted says a kubelet hint chain exists in the variant.
	hinted bool
	// holds says the variant has any rule, or any chain besides the
	// built-in ones.
	holds bool
	// foreign counts the variant's foreign rules: those not in a
	// proxyshift chain and not leading into one. It is a function since
	// counting the nft variant's takes iptables-nft-save (see probeNFT),
	// which detection needs only when the hint chains are missing and
	// legacy holds foreign rules.
	foreign func() int
}

// available says whether the variant's tools are installed and work.
func (p *probe) available() bool { return p.missing == "" && p.err == nil }

// why says why the variant is not available.
func (p *probe) why() string {
	if p.missing != "" {
		return p.missing + " " + errNotInstalled.Error()
	}
	return p.err.Error()
}

// summarize builds the probe of variant v from its iptables-save outputs
// (IPv4 first; nil for a family whose save failed).
func summarize(v Variant, outputs ...[]byte) (*probe, error) {
	p := &probe{variant: v}
	foreign := 0
	for _, out := range outputs {
		if out == nil {
			continue
		}
		tables, err := parseSave(out)
		if err != nil {
			return nil, err
		}
		for _, t := range tables {
			p.hinted = p.hinted || slices.ContainsFunc(t.chains, func(c string) bool { return slices.Contains(hintChains, c) })
			p.holds = p.holds || len(t.rules) > 0 || len(t.chains) > len(t.builtin)
			foreign += foreignRules(t)
		}
	}
	p.foreign = func() int { return foreign }
	return p, nil
}

// foreignRules counts the rules of t that are not in a proxyshift chain
// and do not lead into one.
func foreignRules(t *savedTable) int {
	n := 0
	for c, specs := range t.rules {
		if owned(c) {
			continue
		}
		for _, s := range specs {
			if !owned(target(s)) {
				n++
			}
		}
	}
	return n
}

// probeVariant runs the variant's iptables-save for both families.
func probeVariant(ctx context.Context, v Variant, netns nsexec.NS) *probe {
	r := runner{variant: v, netns: netns}
	if ok, missing := r.installed(); !ok {
		return &probe{variant: v, missing: missing}
	}
	out4, err := r.save(ctx, ipv4)
	if err != nil {
		return &probe{variant: v, err: err}
	}
	// A host without IPv6 has no working ip6tables; IPv4 still works.
	out6, _ := r.save(ctx, ipv6)
	p, err := summarize(v, out4, out6)
	if err != nil {
		return &probe{variant: v, err: err}
	}
	return p
}

// probeNFT is probeVariant of the nft variant without iptables-nft-save,
// which prints every rule: at 10 000 services in iptables mode (or under
// kube-proxy's iptables mode, when a node is taken from it) that is
// hundreds of thousands of rules, seconds of CPU and a hundred MB or more
// in the child, only to learn whether two chains exist. The tools work
// when they list one built-in chain (which creates nothing); the hint
// chains are looked up by name and what the tables hold is read from use
// counts over netlink (nftHoldsRules). Only the count of foreign rules
// still takes the save, and only if detection gets that far.
func probeNFT(ctx context.Context, netns nsexec.NS) *probe {
	r := runner{variant: NFT, netns: netns}
	p := &probe{variant: NFT}
	if ok, missing := r.installed(); !ok {
		p.missing = missing
		return p
	}
	if _, p.err = r.run(ctx, ipv4.tool+"-nft", "-t", tableFilter, "-S", "INPUT"); p.err != nil {
		return p
	}
	if p.hinted, p.err = nftHinted(netns); p.err != nil {
		return p
	}
	if p.holds, p.err = nftHoldsRules(netns); p.err != nil {
		return p
	}
	p.foreign = func() int {
		if !p.holds {
			return 0
		}
		full := probeVariant(ctx, NFT, netns)
		if !full.available() {
			return 0
		}
		return full.foreign()
	}
	return p
}

// nftHinted says whether a kubelet hint chain exists in any iptables
// table of either family of the nft variant (as summarize finds them in
// a save): each looked up by name.
func nftHinted(netns nsexec.NS) (bool, error) {
	for _, f := range families {
		for _, table := range xtablesTables {
			for _, name := range hintChains {
				found, err := nft.ChainExists(netns, f.nft, table, name)
				if err != nil || found {
					return found, err
				}
			}
		}
	}
	return false, nil
}

// choose decides which variant the host uses, the way kube-proxy's
// iptables-wrappers do: a variant that is not available is out; else the
// one holding kubelet's hint chain; else the one with more rules, nft on
// a tie (the default of current distributions). Only foreign rules count:
// proxyshift's own must not make an earlier choice stick after the host
// moved.
func choose(legacy, nft *probe) (Variant, error) {
	switch {
	case !legacy.available() && !nft.available():
		return "", fmt.Errorf("iptables: no usable variant (legacy: %s; nft: %s)", legacy.why(), nft.why())
	case !legacy.available():
		return NFT, nil
	case !nft.available():
		return Legacy, nil
	case nft.hinted:
		return NFT, nil
	case legacy.hinted:
		return Legacy, nil
	}
	// Counts are never negative: legacy can only win with rules.
	if n := legacy.foreign(); n > 0 && n > nft.foreign() {
		return Legacy, nil
	}
	return NFT, nil
}

// Detect returns the iptables variant the host (or the network namespace
// WithNetNS names) uses. It only reads: iptables-legacy-save of both
// families, and the nft variant as probeNFT does.
func Detect(ctx context.Context, opts ...Option) (Variant, error) {
	return detect(ctx, newOptions(opts).netns)
}

func detect(ctx context.Context, netns nsexec.NS) (Variant, error) {
	return choose(probeVariant(ctx, Legacy, netns), probeNFT(ctx, netns))
}

// VariantFacts is what KernelFacts found of one variant.
type VariantFacts struct {
	Variant Variant
	// Installed says the variant's tools are installed.
	Installed bool
	// Err is why its tools failed although installed; nil when they
	// worked.
	Err error
	// HoldsRules says the variant holds anything: a rule or a chain of
	// its own in any table. It means something only when the tools
	// worked.
	HoldsRules bool
}

// KernelFacts reports, for the node's kernel facts, both iptables
// variants: whether their tools work and whether they hold anything. A
// variant holding rules the host does not use is how stale rules, such as
// kube-proxy's in legacy after the host moved to nft, show up.
func KernelFacts(ctx context.Context, opts ...Option) []VariantFacts {
	netns := newOptions(opts).netns
	return []VariantFacts{facts(probeVariant(ctx, Legacy, netns)), facts(probeNFT(ctx, netns))}
}

// xtablesTables are the tables iptables keeps its rules in (the only
// ones iptables-nft-save prints).
var xtablesTables = []string{"filter", "nat", "mangle", "raw", "security"}

// nftHoldsRules says whether iptables-nft's tables hold anything, in
// either family: a rule, or a chain besides the built-in ones. It lists
// no chain and no rule (a listing of the family's chains costs the
// square of their number; see Reader.EachChain): a table's use count,
// from the listing of tables, counts its chains, and each built-in chain,
// asked for by name, has a use count that counts its rules (no verdict
// may name a base chain).
func nftHoldsRules(netns nsexec.NS) (bool, error) {
	for _, f := range families {
		uses, err := nft.TableUses(netns, f.nft)
		if err != nil {
			return false, fmt.Errorf("iptables: %w", err)
		}
		for _, table := range xtablesTables {
			use, ok := uses[table]
			if !ok {
				continue
			}
			var found uint32
			for name := range builtinChains {
				c, rules, err := nft.LookupChainUse(netns, f.nft, table, name)
				switch {
				case err != nil:
					return false, fmt.Errorf("iptables: %w", err)
				case c == nil:
					continue
				case c.Hooknum == nil || rules > 0:
					// A rule, or a chain of a built-in's name that is
					// not one.
					return true, nil
				}
				found++
			}
			if use > found {
				return true, nil
			}
		}
	}
	return false, nil
}

// facts is what a probe found.
func facts(p *probe) VariantFacts {
	f := VariantFacts{Variant: p.variant, Installed: p.missing == "", Err: p.err}
	if p.available() {
		f.HoldsRules = p.holds
	}
	return f
}
