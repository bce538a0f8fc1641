package iptables

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Reading the tables back.
//
// A sync, a cleanup and Programmed need different parts of what a variant
// holds: every chain's name, the text of the rules of a few chains (the
// built-in chains, for the jump rules; the fixed dispatch chains, for the
// service ports' comments) and how many rules each chain has.
//
// For the legacy variant, iptables-legacy-save is the way: the kernel
// hands the whole table over in one piece, and printing it costs little.
// iptables-nft-save (1.8.x) instead asks the kernel for the rules of one
// chain at a time, each a dump that walks every chain, and looks chains up
// by name in lists; with 100 000 chains it takes minutes. For the nft
// variant the backend therefore reads the chains and the rule counts with
// two netlink dumps of the nf_tables table iptables-nft keeps the table
// in (same name, family ip or ip6), and the text of the few chains it
// needs with iptables-nft -S <chain>, which reads only that chain. The
// dump of chains gives each chain's use count too (its rules plus the
// jumps to it), which verifies the rules without reading them (see
// compareChains); rule counts, when a caller asks, come from one dump per
// chain (nft.Reader.RuleCountsOf): one dump of the table's rules took 6
// minutes at 10 000 services.

// read returns the nat and filter tables of family f as far as a caller
// needs them: every chain, the rules' text of the built-in chains and of
// the chains text names, and, if counts, how many rules each chain has
// and how many of them DNAT.
// (Counting the rules is a dump per chain: syncs do not ask.)
func (r runner) read(ctx context.Context, f *family, text map[string]bool, counts bool) (savedTables, error) {
	if r.variant == Legacy {
		out, err := r.save(ctx, f)
		if err != nil {
			return nil, err
		}
		cur, err := parseSave(out)
		if err != nil {
			return nil, fmt.Errorf("iptables: %s: %w", r.command(f, "save"), err)
		}
		return cur, nil
	}
	cur, err := nftTables(ctx, r.netns, f, counts)
	if err != nil {
		return nil, fmt.Errorf("iptables: read %s's tables over netlink: %w", r.tool(f), err)
	}
	for _, table := range tables {
		t := cur[table]
		if t == nil {
			continue
		}
		for _, c := range t.chains {
			if !t.builtin[c] && !text[c] {
				continue
			}
			out, err := r.run(ctx, f.tool+"-nft", "-t", table, "-S", c)
			if err != nil {
				return nil, err
			}
			sub, err := parseRules(out)
			if err != nil {
				return nil, fmt.Errorf("iptables: %s -t %s -S %s: %w", r.tool(f), table, c, err)
			}
			t.rules[c] = sub[c]
		}
	}
	return cur, nil
}

// builtinChains are the names iptables gives the base chains of its
// tables.
var builtinChains = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

// nftTables reads the chains of the nf_tables tables of family f that
// iptables-nft keeps the tables proxyshift uses in, with their use
// counts, and if counts how many rules each has, in network namespace
// netns. A table that does not
// exist is not in the result. Rule texts are left to the caller. The
// chains of both tables come from one dump (the kernel's dump of chains
// sends every chain of the family, whatever table it names); it stops as
// soon as ctx ends, a dump under way included (nft.Reader).
func nftTables(ctx context.Context, netns nsexec.NS, f *family, counts bool) (savedTables, error) {
	r, err := nft.NewReader(ctx, netns, f.nft, "")
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cur := savedTables{}
	err = r.EachChainUse(func(c *nftables.Chain, use uint32) {
		table := c.Table.Name
		if !slices.Contains(tables, table) {
			return
		}
		t := cur[table]
		if t == nil {
			t = &savedTable{builtin: map[string]bool{}, rules: map[string][]string{}, counts: map[string]int{}, dnats: map[string]int{}, uses: map[string]int{}}
			cur[table] = t
		}
		t.chains = append(t.chains, c.Name)
		t.uses[c.Name] = int(use)
		// A base chain iptables did not make is not one to read.
		t.builtin[c.Name] = c.Hooknum != nil && builtinChains[c.Name]
	})
	if err != nil || !counts {
		return cur, err
	}
	for table, t := range cur {
		n, dnats, err := r.RuleCountsOf(table, t.chains, targetDNAT)
		if err != nil {
			return nil, err
		}
		maps.Copy(t.counts, n)
		maps.Copy(t.dnats, dnats)
	}
	return cur, nil
}

// presenceChains are the fixed chain of each table that every sync
// creates in each family it programs, and a cleanup removes with the
// table's other chains in one transaction (or restore): while any is
// there, so are proxyshift's rules (on a node left half cleaned up too).
var presenceChains = map[string]string{tableNAT: chainServices, tableFilter: chainFilter}

// holdsPresenceChain says whether family f holds one of presenceChains.
// The nft variant looks each up by name over netlink; the legacy one
// reads the tables (the kernel hands each over in one piece).
func (r runner) holdsPresenceChain(ctx context.Context, f *family) (bool, error) {
	if r.variant == Legacy {
		cur, err := r.read(ctx, f, nil, false)
		if err != nil {
			return false, err
		}
		for table, chain := range presenceChains {
			if t := cur[table]; t != nil && slices.Contains(t.chains, chain) {
				return true, nil
			}
		}
		return false, nil
	}
	for table, chain := range presenceChains {
		ok, err := nft.ChainExists(r.netns, f.nft, table, chain)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}
