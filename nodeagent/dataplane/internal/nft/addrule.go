package nft

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Rules, after set elements, are the bulk of a full sync (20 000 at 10 000
// services), so they too are written straight into the batch: the
// library builds each rule's message by marshalling its expressions, then
// the list of them, then the message's attributes, and copies the result
// twice more before the transaction encodes it (about 40 MB of garbage
// per 10k full sync). Here each expression is marshalled once, by the
// library (expr.Marshal), into the message as it is written. The messages
// are the library's byte for byte (TestRuleMessagesAreTheLibrarys).

// AddRule queues the addition of a rule of exprs at the end of chain in
// table on t.
func AddRule(t *Txn, table *nftables.Table, chain string, exprs []expr.Any) error {
	// The library's messages queued so far come first.
	if err := t.Encode(); err != nil {
		return err
	}
	size := 64 + len(table.Name) + len(chain)
	for _, e := range exprs {
		switch e.(type) {
		case *expr.Match, *expr.Target:
			// The library adds a compatibility attribute for these
			// (iptables-nft's); no backend writes them.
			return fmt.Errorf("nft: a rule of chain %s has an x_tables %T, which AddRule does not write", chain, e)
		}
		size += 128
	}
	fam := byte(table.Family)
	w := t.writer(size)
	msg := w.beginMessage(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWRULE, netlink.Create|unix.NLM_F_APPEND, fam)
	w.putString(unix.NFTA_RULE_TABLE, table.Name)
	w.putString(unix.NFTA_RULE_CHAIN, chain)
	list := w.beginNested(unix.NFTA_RULE_EXPRESSIONS)
	for _, e := range exprs {
		b, err := expr.Marshal(fam, e)
		if err != nil {
			w.b = w.b[:msg] // no half-written message in the batch
			t.wrote()
			return fmt.Errorf("nft: a rule of chain %s: %w", chain, err)
		}
		item := w.beginNested(unix.NFTA_LIST_ELEM)
		w.b = append(w.b, b...)
		w.endNested(item)
	}
	w.endNested(list)
	w.endMessage(msg)
	t.wrote()
	return nil
}
