package nft

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
)

// Hook is where a base chain is attached.
type Hook struct {
	Type nftables.ChainType
	// Name is the hook's name in nft's syntax (prerouting, input...).
	Name     string
	Num      nftables.ChainHook
	Priority nftables.ChainPriority
}

// Chain is a chain and its rules; Hook is nil for a regular chain.
type Chain struct {
	Name  string
	Hook  *Hook
	Rules []Rule
}

// Kernel is the google/nftables description of the chain, in table t.
func (c *Chain) Kernel(t *nftables.Table) *nftables.Chain {
	k := &nftables.Chain{Name: c.Name, Table: t}
	if h := c.Hook; h != nil {
		k.Type = h.Type
		k.Hooknum = nftables.ChainHookRef(h.Num)
		k.Priority = nftables.ChainPriorityRef(h.Priority)
	}
	return k
}

// SameHook says whether a chain found in the kernel can be kept for c:
// both regular, or attached alike.
func (c *Chain) SameHook(k *nftables.Chain) bool {
	if c.Hook == nil || k.Hooknum == nil || k.Priority == nil {
		return c.Hook == nil && k.Hooknum == nil
	}
	return k.Type == c.Hook.Type && *k.Hooknum == c.Hook.Num && *k.Priority == c.Hook.Priority
}

// Dump writes the chain as `nft list table` shows it, inside a table
// block.
func (c *Chain) Dump(b *strings.Builder) {
	fmt.Fprintf(b, "\tchain %s {\n", c.Name)
	if h := c.Hook; h != nil {
		fmt.Fprintf(b, "\t\ttype %s hook %s priority %d; policy accept;\n", h.Type, h.Name, h.Priority)
	}
	for _, r := range c.Rules {
		fmt.Fprintf(b, "\t\t%s\n", r.Text)
	}
	b.WriteString("\t}\n")
}

// Set is the definition of a named set or map.
type Set struct {
	Name    string
	KeyType nftables.SetDatatype
	// Concat says the key is a concatenation, each field in a 32-bit
	// register of its own; an interval set of such keys holds ranges
	// (the kernel's pipapo backend), any other interval set intervals of
	// one big-endian number (its rbtree).
	Concat   bool
	Interval bool
	// VerdictMap maps keys to verdicts; a DataType of non-zero length
	// makes the set a data map.
	VerdictMap bool
	DataType   nftables.SetDatatype
	// NumgenKey, when not zero, says the keys are results of "numgen
	// random mod NumgenKey" (in host byte order, or big-endian in an
	// interval map), which Txn.AddSet tells nft (see typeof.go).
	NumgenKey uint32
	// Timeout > 0 makes the set one the packet path fills itself, whose
	// elements expire.
	Timeout time.Duration
}

// Kernel is the google/nftables description of the set, in table t.
func (s *Set) Kernel(t *nftables.Table) *nftables.Set {
	k := &nftables.Set{
		Table:         t,
		Name:          s.Name,
		KeyType:       s.KeyType,
		IsMap:         s.VerdictMap || s.DataType.Bytes > 0,
		Interval:      s.Interval,
		Concatenation: s.Concat,
		KeyByteOrder:  binaryutil.BigEndian,
	}
	switch {
	case s.VerdictMap:
		k.DataType = nftables.TypeVerdict
	case k.IsMap:
		k.DataType = s.DataType
	}
	if s.Timeout > 0 {
		k.HasTimeout, k.Dynamic, k.Timeout = true, true, s.Timeout
	}
	return k
}

// Element is one element of a set or map.
type Element struct {
	Key []byte
	// KeyEnd, in interval sets, is the last key of the interval
	// (inclusive); nil for an interval of one key.
	KeyEnd  []byte
	Verdict *Verdict
	// Data is the value of a data map's element.
	Data    []byte
	Comment string
}

// kernelElements are the kernel's elements for elems of s, each read by
// elem (see queueElements for how intervals reach the kernel).
//
// A periodic resync compares every set this way, 100 000 endpoint
// elements at 10k services: the end elements' keys share one allocation.
func kernelElements[E any](s *nftables.Set, elems []E, elem func(*E) Element) []nftables.SetElement {
	n := len(elems)
	var endKeys []byte
	if hasEndElements(s) {
		size := 0
		for i := range elems {
			e := elem(&elems[i])
			size += max(len(e.KeyEnd), len(e.Key))
		}
		endKeys = make([]byte, 0, size)
		n *= 2
	}
	out := make([]nftables.SetElement, 0, n)
	for i := range elems {
		e := elem(&elems[i])
		ke := nftables.SetElement{Key: e.Key, Val: e.Data, Comment: e.Comment}
		if e.Verdict != nil {
			ke.VerdictData = e.Verdict.Expr()
		}
		if carriesKeyEnd(s) {
			ke.KeyEnd = e.KeyEnd
		}
		out = append(out, ke)
		if end, ok := intervalEnd(s, e, endKeys[len(endKeys):]); ok {
			endKeys = endKeys[:len(endKeys)+len(end)]
			out = append(out, nftables.SetElement{Key: end, IntervalEnd: true})
		}
	}
	return out
}

// carriesKeyEnd says whether s's elements carry the last key of their
// range (NFTA_SET_ELEM_KEY_END): those of an interval set of
// concatenations (the kernel's pipapo backend).
func carriesKeyEnd(s *nftables.Set) bool { return s.Interval && s.Concatenation }

// hasEndElements says whether s's intervals end with an element of their
// own (intervalEnd): those of an interval set of single keys.
func hasEndElements(s *nftables.Set) bool { return s.Interval && !s.Concatenation }

// intervalEnd is, in an interval set of single keys (the kernel's
// rbtree), the key of the element that ends e's interval: the first key
// after it, appended to buf. There is none (false) in other sets, and
// when the interval runs to the end of the key space.
func intervalEnd(s *nftables.Set, e Element, buf []byte) ([]byte, bool) {
	if !hasEndElements(s) {
		return nil, false
	}
	last := e.KeyEnd
	if last == nil {
		last = e.Key
	}
	end := append(buf, last...)
	return end, increment(end[len(buf):])
}

// increment adds one to the big-endian number b, in place, and says
// whether it did not overflow (b was not the highest number of its
// length).
func increment(b []byte) bool {
	for i := len(b) - 1; i >= 0; i-- {
		b[i]++
		if b[i] != 0 {
			return true
		}
	}
	return false
}
