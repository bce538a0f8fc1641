package nftables

import (
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
)

// queue turns a plan into google/nftables calls on conn, for the table of
// family f. Nothing reaches the kernel before the transaction commits.
func queue(conn *nftables.Conn, f *family, ops []op) error {
	table := &nftables.Table{Name: TableName, Family: f.table}
	chainRef := func(name string) *nftables.Chain { return &nftables.Chain{Name: name, Table: table} }
	var setID uint32
	for _, o := range ops {
		switch o.kind {
		case opAddTable:
			conn.AddTable(table)
		case opDelTable:
			conn.DelTable(table)
		case opAddChain:
			c := chainRef(o.name)
			if h := o.chain.hook; h != nil {
				c.Type = h.typ
				c.Hooknum = nftables.ChainHookRef(h.num)
				c.Priority = nftables.ChainPriorityRef(h.priority)
			}
			conn.AddChain(c)
		case opFlushChain:
			conn.FlushChain(chainRef(o.name))
		case opDelChain:
			conn.DelChain(chainRef(o.name))
		case opAddRule:
			conn.AddRule(&nftables.Rule{Table: table, Chain: chainRef(o.name), Exprs: o.rule.exprs})
		case opAddSet:
			// Our own set IDs: the library's counter is a global without
			// a lock.
			setID++
			s := kernelSet(table, o.set)
			s.ID = setID
			if err := conn.AddSet(s, nil); err != nil {
				return err
			}
		case opFlushSet:
			conn.FlushSet(&nftables.Set{Table: table, Name: o.name})
		case opDelSet:
			conn.DelSet(&nftables.Set{Table: table, Name: o.name})
		case opAddElems, opDelElems:
			s := kernelSet(table, o.set)
			for _, chunk := range chunks(o.elems) {
				var err error
				if o.kind == opAddElems {
					err = conn.SetAddElements(s, kernelElements(o.set, chunk))
				} else {
					err = conn.SetDeleteElements(s, kernelElements(o.set, chunk))
				}
				if err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// kernelSet is the google/nftables description of s.
func kernelSet(table *nftables.Table, s *set) *nftables.Set {
	ks := &nftables.Set{
		Table:         table,
		Name:          s.name,
		KeyType:       s.keyType,
		IsMap:         s.isMap(),
		Interval:      s.interval,
		Concatenation: s.concat(),
		KeyByteOrder:  binaryutil.BigEndian,
	}
	switch {
	case s.verdictMap:
		ks.DataType = nftables.TypeVerdict
	case s.dataMap():
		ks.DataType = s.dataType
	}
	if s.hostOrderKey {
		ks.KeyByteOrder = binaryutil.NativeEndian
	}
	if s.dynamic() {
		ks.HasTimeout, ks.Dynamic, ks.Timeout = true, true, s.timeout
	}
	return ks
}

// kernelElements are the kernel's elements for elems of s: an interval
// set holds an interval as its first key and, flagged as the end of the
// interval, the first key after it (a prefix: its first address and the
// first address after it).
func kernelElements(s *set, elems []element) []nftables.SetElement {
	n := len(elems)
	if s.interval {
		n *= 2
	}
	out := make([]nftables.SetElement, 0, n)
	for _, e := range elems {
		ke := nftables.SetElement{Key: e.key, Val: e.data, Comment: e.comment}
		if e.verdict != nil {
			ke.VerdictData = &expr.Verdict{Kind: e.verdict.kind, Chain: e.verdict.chain}
		}
		out = append(out, ke)
		if s.interval && e.keyEnd != nil {
			out = append(out, nftables.SetElement{Key: e.keyEnd, IntervalEnd: true})
		}
	}
	return out
}

// maxElementBytes bounds the elements of one message: they travel in one
// netlink attribute, whose length field has 16 bits.
const maxElementBytes = 32 << 10

// chunks splits elems into runs that fit one message.
func chunks(elems []element) [][]element {
	var out [][]element
	start, size := 0, 0
	for i, e := range elems {
		n := 64 + len(e.key) + len(e.keyEnd) + len(e.data) + len(e.comment)
		if e.verdict != nil {
			n += len(e.verdict.chain)
		}
		if size+n > maxElementBytes && i > start {
			out = append(out, elems[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(elems) {
		out = append(out, elems[start:])
	}
	return out
}
