package nft

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

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
	err := bad.Commit()
	if err == nil {
		t.Fatal("deleting a missing chain was accepted")
	}
	if want := "nft: transaction rejected at message 2 of 2, delete chain ip proxyshift-txn-test missing: no such file or directory"; err.Error() != want || !errors.Is(err, unix.ENOENT) {
		t.Errorf("the rejection says %q, want %q (and ENOENT)", err, want)
	}
	if n := countChains(t, ns, table.Name); n != chains {
		t.Errorf("after a rejected transaction the kernel holds %d chains, want %d", n, chains)
	}
	if err := bad.Commit(); err == nil {
		t.Error("a transaction committed twice")
	}
}

// A rejected transaction's error names the message the kernel refused,
// whichever way the message was written: a rule (AddRule) to a chain
// that does not exist, elements (AddElements) of a set that does not
// exist, each after thousands of accepted messages; the kernel applies
// none of it.
func TestRejectionNamesTheMessage(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "txn")
	table := &nftables.Table{Name: "proxyshift-txn-test", Family: nftables.TableFamilyIPv4}
	const chains = 3000
	for _, c := range []struct {
		name  string
		queue func(*Txn) error
		want  string
	}{
		{"rule", func(txn *Txn) error {
			return AddRule(txn, table, "missing", []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}})
		}, "nft: transaction rejected at message 3002 of 3002, add rule to chain ip proxyshift-txn-test missing (expressions: counter, immediate): no such file or directory"},
		{"elements", func(txn *Txn) error {
			set := &nftables.Set{Name: "missing", Table: table, KeyType: nftables.TypeInteger}
			return AddElements(txn, set, identity, []Element{{Key: []byte{0, 0, 0, 1}}, {Key: []byte{0, 0, 0, 2}}})
		}, "nft: transaction rejected at message 3002 of 3002, add 2 elements to set ip proxyshift-txn-test missing: no such file or directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			txn := NewTxn(ns.NS())
			queueTableOfChains(t, txn, table, chains, txn.Queued)
			if err := c.queue(txn); err != nil {
				t.Fatal(err)
			}
			err := txn.Commit()
			var rej *RejectedError
			if !errors.As(err, &rej) || err.Error() != c.want {
				t.Fatalf("the rejection says %v, want %q", err, c.want)
			}
			if n := countChains(t, ns, table.Name); n != 0 {
				t.Errorf("after the rejected transaction the kernel holds %d chains, want none", n)
			}
		})
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
