package nftables

import (
	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
)

// tablePlan is a plan for one table of a family: one transaction.
type tablePlan struct {
	table string
	ops   []op
}

// queue turns a plan into google/nftables calls on t's connection, for
// its table of family f. Nothing reaches the kernel before the
// transaction commits.
func queue(t *nft.Txn, f *family, p tablePlan) error {
	conn := t.Conn()
	table := &nftables.Table{Name: p.table, Family: f.Table}
	chainRef := func(name string) *nftables.Chain { return &nftables.Chain{Name: name, Table: table} }
	// Our own set IDs: the library's counter is a global without a lock.
	var setID uint32
	for _, o := range p.ops {
		switch o.kind {
		case opAddTable:
			conn.AddTable(table)
		case opDelTable:
			conn.DelTable(table)
		case opAddChain:
			conn.AddChain(o.chain.Kernel(table))
		case opFlushChain:
			conn.FlushChain(chainRef(o.name))
		case opDelChain:
			conn.DelChain(chainRef(o.name))
		case opAddRule:
			if o.rule.Anon != nil {
				setID++
			}
			if err := nft.AddRuleOf(t, table, o.name, o.rule, setID); err != nil {
				return err
			}
		case opAddSet:
			setID++
			def := o.set.def()
			if err := t.AddSet(table, &def, setID); err != nil {
				return err
			}
		case opFlushSet:
			conn.FlushSet(&nftables.Set{Table: table, Name: o.name})
		case opDelSet:
			conn.DelSet(&nftables.Set{Table: table, Name: o.name})
		case opAddElems:
			if err := nft.AddElements(t, o.set.kernel(table), (*element).kernel, o.elems...); err != nil {
				return err
			}
		case opDelElems:
			if err := nft.DeleteElements(t, o.set.kernel(table), (*element).kernel, o.elems...); err != nil {
				return err
			}
		}
		if err := t.Queued(); err != nil {
			return err
		}
	}
	return nil
}

// def is s as the nft package describes a set.
func (s *set) def() nft.Set {
	d := nft.Set{
		Name:       s.name,
		KeyType:    s.keyType,
		Concat:     s.concat(),
		Interval:   s.interval,
		VerdictMap: s.verdictMap,
		NumgenKey:  s.numgenKey,
		Timeout:    s.timeout,
	}
	if s.dataMap() {
		d.DataType = s.dataType
	}
	return d
}

// kernel is the google/nftables description of s.
func (s *set) kernel(table *nftables.Table) *nftables.Set {
	d := s.def()
	return d.Kernel(table)
}

// kernel is the element as nft writes it to the kernel.
func (e *element) kernel() nft.Element {
	return nft.Element{Key: e.key(), KeyEnd: e.rangeEnd(), Verdict: e.verdict, Data: e.data(), Comment: e.comment}
}
