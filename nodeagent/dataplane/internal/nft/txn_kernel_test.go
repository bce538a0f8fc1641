package nft

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestEncodedTransaction commits, in a network namespace of its own, a
// transaction encoded in more pieces than one sendmsg takes (maxIOV), and
// checks that the kernel holds every chain of it; then a transaction
// whose last message fails, and checks that the kernel applied none of
// it, also the messages encoded before the failing one.
func TestEncodedTransaction(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "txn")
	table := &nftables.Table{Name: "proxyshift-txn-test", Family: nftables.TableFamilyIPv4}
	const chains = maxIOV + 200

	txn := NewTxn(ns.NS())
	queueTableOfChains(t, txn, table, chains, txn.Encode)
	if err := txn.Commit(); err != nil {
		t.Fatalf("commit of %d chains in %d pieces: %v", chains, chains+1, err)
	}
	if n := countChains(t, ns, table.Name); n != chains {
		t.Fatalf("the kernel holds %d chains, want %d", n, chains)
	}

	bad := NewTxn(ns.NS())
	bad.Conn().AddChain(&nftables.Chain{Name: "added", Table: table})
	if err := bad.Encode(); err != nil {
		t.Fatal(err)
	}
	bad.Conn().DelChain(&nftables.Chain{Name: "missing", Table: table})
	if err := bad.Commit(); err == nil {
		t.Fatal("deleting a missing chain was accepted")
	}
	if n := countChains(t, ns, table.Name); n != chains {
		t.Errorf("after a rejected transaction the kernel holds %d chains, want %d", n, chains)
	}
	if err := bad.Commit(); err == nil {
		t.Error("a transaction committed twice")
	}
}

func countChains(t *testing.T, ns *netlab.NetNS, table string) int {
	t.Helper()
	r, err := NewReader(context.Background(), ns.NS(), nftables.TableFamilyIPv4, table)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	if err := r.EachChain(func(c *nftables.Chain) {
		if c.Table.Name == table {
			n++
		}
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// queueTableOfChains queues table and n chains of it, c0, c1, ..., on
// txn, calling next after each chain (txn.Encode, txn.Queued: how the
// transaction is encoded).
func queueTableOfChains(t *testing.T, txn *Txn, table *nftables.Table, n int, next func() error) {
	t.Helper()
	txn.Conn().AddTable(table)
	for i := range n {
		txn.Conn().AddChain(&nftables.Chain{Name: fmt.Sprintf("c%d", i), Table: table})
		if err := next(); err != nil {
			t.Fatal(err)
		}
	}
}
