package iptables

import (
	"context"
	"fmt"

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
	// err is why iptables-save failed for IPv4.
	err error
	// saved are the parsed iptables-save outputs of the families whose
	// save worked.
	saved []savedTables
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

// hint says whether a kubelet hint chain exists in the variant.
func (p *probe) hint() bool {
	for _, tables := range p.saved {
		for _, t := range tables {
			for _, c := range t.chains {
				for _, h := range hintChains {
					if c == h {
						return true
					}
				}
			}
		}
	}
	return false
}

// rules counts the variant's rules; foreign ones only (not in a
// proxyshift chain, not leading into one) if foreign is set.
func (p *probe) rules(foreign bool) int {
	n := 0
	for _, tables := range p.saved {
		for _, t := range tables {
			for c, specs := range t.rules {
				if !foreign {
					n += len(specs)
					continue
				}
				if owned(c) {
					continue
				}
				for _, s := range specs {
					if !owned(target(s)) {
						n++
					}
				}
			}
		}
	}
	return n
}

// holds says whether the variant has any rule, or any chain besides the
// built-in ones.
func (p *probe) holds() bool {
	for _, tables := range p.saved {
		for _, t := range tables {
			if len(t.rules) > 0 || len(t.chains) > len(t.builtin) {
				return true
			}
		}
	}
	return false
}

// summarize builds the probe of variant v from its iptables-save outputs
// (IPv4 first; nil for a family whose save failed).
func summarize(v Variant, outputs ...[]byte) (*probe, error) {
	p := &probe{variant: v}
	for _, out := range outputs {
		if out == nil {
			continue
		}
		tables, err := parseSave(out)
		if err != nil {
			return nil, err
		}
		p.saved = append(p.saved, tables)
	}
	return p, nil
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
	case nft.hint():
		return NFT, nil
	case legacy.hint():
		return Legacy, nil
	case legacy.rules(true) > nft.rules(true):
		return Legacy, nil
	}
	return NFT, nil
}

// Detect returns the iptables variant the host (or the network namespace
// WithNetNS names) uses. It only reads: iptables-save of both variants
// and both families.
func Detect(ctx context.Context, opts ...Option) (Variant, error) {
	return detect(ctx, newOptions(opts).netns)
}

func detect(ctx context.Context, netns nsexec.NS) (Variant, error) {
	return choose(probeVariant(ctx, Legacy, netns), probeVariant(ctx, NFT, netns))
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
	return []VariantFacts{facts(probeVariant(ctx, Legacy, netns)), nftFacts(ctx, netns)}
}

// nftFacts is what KernelFacts finds of the nft variant without
// iptables-save: the facts are gathered every minute, and in iptables
// mode at 10 000 services iptables-nft-save took about 1.9 s of CPU and
// 97 MB to print 120 000 rules only their existence was asked of. The
// tools work when they list one built-in chain (which creates nothing);
// what the tables hold is read over netlink (nftHoldsRules).
func nftFacts(ctx context.Context, netns nsexec.NS) VariantFacts {
	r := runner{variant: NFT, netns: netns}
	f := VariantFacts{Variant: NFT}
	if f.Installed, _ = r.installed(); !f.Installed {
		return f
	}
	if _, err := r.run(ctx, ipv4.tool+"-nft", "-t", tableFilter, "-S", "INPUT"); err != nil {
		f.Err = err
		return f
	}
	f.HoldsRules, f.Err = nftHoldsRules(netns)
	return f
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
		f.HoldsRules = p.holds()
	}
	return f
}
