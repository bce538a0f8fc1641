package nft

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END (Linux 5.6), the last key of
// a range of a concatenation; golang.org/x/sys does not name it.
const nftaSetElemKeyEnd = 10

// ElementTexts are the kernel's elements for elems of s (as AddElements
// writes them), each as the text ElementText gives a kernel element: what
// a listing of s must hold when nothing changed it since.
func ElementTexts[E any](s *nftables.Set, elems []E, elem func(*E) Element) []string {
	kernel := kernelElements(s, elems, elem)
	out := make([]string, len(kernel))
	for i, e := range kernel {
		out[i] = ElementText(e)
	}
	return out
}

// ElementText is one element of a set as the kernel lists it, as text
// that compares (not for reading: ElementString is): key, end of the
// range, interval-end flag, data and verdict, each behind its length
// (not the comment, which is the element's user data).
func ElementText(e nftables.SetElement) string {
	b := make([]byte, 0, 16+len(e.Key)+len(e.KeyEnd)+len(e.Val))
	field := func(v []byte) {
		b = append(b, byte(len(v)))
		b = append(b, v...)
	}
	field(e.Key)
	field(e.KeyEnd)
	if e.IntervalEnd {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	field(e.Val)
	if v := e.VerdictData; v != nil {
		b = binary.BigEndian.AppendUint32(b, uint32(int32(v.Kind)))
		field([]byte(v.Chain))
	}
	return string(b)
}

// ElementString makes a text of ElementText readable, for messages.
func ElementString(text string) string { return hex.EncodeToString([]byte(text)) }

// Reader reads one table's objects back over one netlink socket, one
// request at a time, and stops as soon as its context ends: it closes
// the socket then, which ends a request under way (a dump of every rule
// of a large table is one long request: each of its messages resumes by
// skipping the rules already sent).
type Reader struct {
	ctx   context.Context
	netns nsexec.NS
	c     *netlink.Conn
	fam   nftables.TableFamily
	table string
	stop  func() bool
}

// NewReader opens a Reader of table (family fam) in network namespace
// netns, until ctx ends. Close it after use.
func NewReader(ctx context.Context, netns nsexec.NS, fam nftables.TableFamily, table string) (*Reader, error) {
	c, err := dialDumps(netns)
	if err != nil {
		return nil, err
	}
	r := &Reader{ctx: ctx, netns: netns, c: c, fam: fam, table: table}
	r.stop = context.AfterFunc(ctx, func() { _ = c.Close() })
	return r, nil
}

// Close closes the socket.
func (r *Reader) Close() error {
	if r.stop() {
		return r.c.Close()
	}
	return nil
}

// failed is err, or the context's error when the context ended.
func (r *Reader) failed(err error) error {
	if err == nil {
		return nil
	}
	if cerr := r.ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}

// EachChain calls fn with every chain of the Reader's family, of every
// table (the kernel's dump of chains takes no table), in the kernel's
// order: its table's name (Table.Name), its name, and for a base chain
// its type, hook, priority and policy. A caller that needs the chains of two
// tables reads them from one call: each dump of chains costs as much as
// every chain of the family (iptables-nft's 110 000 at 10 000 services
// make it 3 s).
func (r *Reader) EachChain(fn func(*nftables.Chain)) error {
	return r.EachChainUse(func(c *nftables.Chain, _ uint32) { fn(c) })
}

// EachChainUse is EachChain that also gives each chain's use count: the
// number of its rules plus the number of jump and goto verdicts that name
// it (the kernel counts both, to refuse deleting a chain still in use).
// Compared with what a ruleset implies, the counts of one dump of chains
// verify every chain's rules without a dump of rules per chain.
func (r *Reader) EachChainUse(fn func(*nftables.Chain, uint32)) error {
	return r.failed(eachChainOn(r.c, r.fam, fn))
}

// RuleCounts returns the number of rules of each chain that has any,
// from one dump of the table's rules.
func (r *Reader) RuleCounts() (map[string]int, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_RULE_TABLE, r.table)
	counts := map[string]int{}
	err := dumpOn(r.c, r.fam, unix.NFT_MSG_GETRULE, ae, func(a *attrs) {
		for a.next() {
			if a.typ == unix.NFTA_RULE_CHAIN {
				counts[a.str()]++
			}
		}
	})
	if err != nil {
		return nil, r.failed(fmt.Errorf("nft: list the rules of %s: %w", r.table, err))
	}
	return counts, nil
}

// RuleCountsOf returns the number of rules of each of chains (of table)
// that has any, and of those the number whose xtables target (the
// `target` expression iptables-nft writes for `-j DNAT` and the like) is
// named target, from one dump per chain. The kernel finds a named chain through
// its hash table, so each dump walks that chain's rules only; RuleCounts'
// dump of the whole table instead walks the table again from its first
// rule for every buffer it fills, which grows with the square of the
// table's rules: for a table of many small chains (iptables-nft's, 320 000
// rules in 110 000 chains at 10 000 services) this is the way.
//
// A dump per chain is a round trip per chain, most of it waiting: the
// chains are shared among ruleCountSockets sockets, each read by a
// goroutine of its own.
func (r *Reader) RuleCountsOf(table string, chains []string, target string) (rules, targeted map[string]int, err error) {
	counts := make([]ruleCount, len(chains))
	workers := min(ruleCountSockets, (len(chains)+ruleCountMinChains-1)/ruleCountMinChains)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := r.c
		if w > 0 {
			var err error
			if c, err = dialDumps(r.netns); err != nil {
				errs[w] = err
				continue
			}
			stop := context.AfterFunc(r.ctx, func() { _ = c.Close() })
			defer func() {
				if stop() {
					_ = c.Close()
				}
			}()
		}
		wg.Go(func() {
			for i := w; i < len(chains); i += workers {
				if errs[w] = ruleCountOn(c, r.fam, table, chains[i], target, &counts[i]); errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, r.failed(err)
	}
	rules, targeted = map[string]int{}, map[string]int{}
	for i, n := range counts {
		if n.rules > 0 {
			rules[chains[i]] = n.rules
		}
		if n.targeted > 0 {
			targeted[chains[i]] = n.targeted
		}
	}
	return rules, targeted, nil
}

// ruleCount is what ruleCountOn counts in a chain.
type ruleCount struct{ rules, targeted int }

// ruleCountSockets is how many sockets RuleCountsOf reads on at once, and
// ruleCountMinChains the fewest chains worth a socket of its own. On the
// 2-core test machine, iptables-nft's Programmed at 10 000 services (a
// 3 s dump of the chains, then the rules of 110 000 chains) took 9.3 s
// with one socket, 7.1 s with two, 6.5 s with four, 7.6 s with eight
// (BenchmarkProgrammed/nft/10k).
const (
	ruleCountSockets   = 4
	ruleCountMinChains = 256
)

// ruleCountOn counts into n the rules of chain (of table), and those
// whose xtables target is named target, from one dump on socket c.
func ruleCountOn(c *netlink.Conn, fam nftables.TableFamily, table, chain, target string, n *ruleCount) error {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_RULE_TABLE, table)
	ae.String(unix.NFTA_RULE_CHAIN, chain)
	// Every message of the dump is one rule.
	err := dumpObjectOn(c, fam, unix.NFT_MSG_GETRULE, ae, func(a *attrs) {
		n.rules++
		if hasTarget(a, target) {
			n.targeted++
		}
	})
	if err != nil {
		return fmt.Errorf("nft: list the rules of %s chain %s: %w", table, chain, err)
	}
	return nil
}

// hasTarget says whether the rule whose attributes a reads has an
// xtables target expression named name.
func hasTarget(a *attrs, name string) bool {
	found := false
	for a.next() {
		if a.typ != unix.NFTA_RULE_EXPRESSIONS {
			continue
		}
		list := a.nested()
		for list.next() {
			e := list.nested()
			found = found || targetName(&e) == name
		}
		a.nestedErr(&list)
	}
	return found
}

// targetName is the name of the xtables target the expression e reads
// (expression "target", which iptables-nft writes for `-j DNAT` and the
// like); "" for any other expression.
func targetName(e *attrs) string {
	var kind, target string
	for e.next() {
		switch e.typ {
		case unix.NFTA_EXPR_NAME:
			kind = e.str()
		case unix.NFTA_EXPR_DATA:
			for data := e.nested(); data.next(); {
				if data.typ == unix.NFTA_TARGET_NAME {
					target = data.str()
				}
			}
		}
	}
	if kind != "target" {
		return ""
	}
	return target
}

// ElementTexts lists the elements of set, each as ElementText gives it,
// from one dump. (google/nftables reads elements back without their
// verdicts.)
func (r *Reader) ElementTexts(set string) ([]string, error) {
	var out []string
	err := r.EachElement(set, func(e nftables.SetElement) { out = append(out, ElementText(e)) })
	return out, err
}

// EachElement calls fn with every element of set (of the Reader's table),
// as decodeElement reads it, from one dump read in large batches (where
// google/nftables' GetSetElements reads a page at a time and decodes each
// element into more objects: at 10 000 services, an nftables Programmed
// through it allocated 267 MB). The element's byte slices are valid
// during the call only.
func (r *Reader) EachElement(set string, fn func(nftables.SetElement)) error {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, r.table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	err := dumpObjectOn(r.c, r.fam, unix.NFT_MSG_GETSETELEM, ae, func(a *attrs) {
		for a.next() {
			if a.typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			list := a.nested()
			for list.next() {
				elem := list.nested()
				e := decodeElement(&elem)
				list.nestedErr(&elem)
				fn(e)
			}
			a.nestedErr(&list)
		}
	})
	if err != nil {
		return r.failed(fmt.Errorf("nft: list the elements of %s: %w", set, err))
	}
	return nil
}

// decodeElement reads one NFTA_LIST_ELEM: its key, the end of its range,
// its interval-end flag, its data or verdict and its comment. A
// malformed attribute is a's error.
func decodeElement(a *attrs) nftables.SetElement {
	var e nftables.SetElement
	// value is the NFTA_DATA_VALUE of the NFTA_DATA nested in a's
	// current attribute.
	value := func() []byte {
		var v []byte
		d := a.nested()
		for d.next() {
			if d.typ == unix.NFTA_DATA_VALUE {
				v = d.val
			}
		}
		a.nestedErr(&d)
		return v
	}
	for a.next() {
		switch a.typ {
		case unix.NFTA_SET_ELEM_KEY:
			e.Key = value()
		case nftaSetElemKeyEnd:
			e.KeyEnd = value()
		case unix.NFTA_SET_ELEM_FLAGS:
			e.IntervalEnd = a.be32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
		case unix.NFTA_SET_ELEM_USERDATA:
			e.Comment, _ = userdata.GetString(a.val, userdata.NFTNL_UDATA_SET_ELEM_COMMENT)
		case unix.NFTA_SET_ELEM_DATA:
			d := a.nested()
			for d.next() {
				switch d.typ {
				case unix.NFTA_DATA_VALUE:
					e.Val = d.val
				case unix.NFTA_DATA_VERDICT:
					v := d.nested()
					e.VerdictData = decodeVerdict(&v).Expr()
					d.nestedErr(&v)
				}
			}
			a.nestedErr(&d)
		}
	}
	return e
}

// decodeVerdict reads an NFTA_DATA_VERDICT's attributes.
func decodeVerdict(a *attrs) *Verdict {
	v := &Verdict{}
	for a.next() {
		switch a.typ {
		case unix.NFTA_VERDICT_CODE:
			v.Kind = expr.VerdictKind(int32(a.be32()))
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = a.str()
		}
	}
	return v
}

// Generation returns the nf_tables ruleset generation of network
// namespace netns: the kernel increments it with every transaction it
// commits, whatever program sends it and whatever table it writes (the
// iptables-nft tools use it the same way, to know their cache is
// current). A generation that has not moved since a program's last
// commit means nothing in nf_tables changed since.
func Generation(netns nsexec.NS) (gen uint32, err error) {
	s, err := takeSocket(netns)
	if err != nil {
		return 0, err
	}
	defer func() { s.done(err) }()
	return generationOn(s.Conn)
}

// generationOn reads the ruleset's generation on socket c.
func generationOn(c *netlink.Conn) (uint32, error) {
	gen, found := uint32(0), false
	err := requestOn(c, unix.AF_UNSPEC, unix.NFT_MSG_GETGEN, netlink.Request, netlink.NewAttributeEncoder(), func(a *attrs) {
		for a.next() {
			if a.typ == unix.NFTA_GEN_ID {
				gen, found = a.be32(), true
			}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("nft: ruleset generation: %w", err)
	}
	if !found {
		return 0, errors.New("nft: ruleset generation: no NFTA_GEN_ID in the answer")
	}
	return gen, nil
}
