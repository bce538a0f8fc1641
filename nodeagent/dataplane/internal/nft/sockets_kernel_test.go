package nft

import (
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// keptFor is the socket kept for the namespace id, nil when none is.
func keptFor(id netnsID) *netlink.Conn {
	kept.Lock()
	defer kept.Unlock()
	return kept.idle[id].c
}

// TestSocketsKeptBetweenUses checks, in a network namespace of its own,
// that the socket of a commit is kept and serves the next use (the
// generation read after it, the next commit), that a socket whose use
// failed is not kept, that one namespace keeps one socket when two were
// in use at once, and that a socket idle for idleClose is closed.
func TestSocketsKeptBetweenUses(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "sockets")
	id, err := namespaceOf(ns.NS())
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Name: "proxyshift-socket-test", Family: nftables.TableFamilyIPv4}

	txn := NewTxn(ns.NS())
	txn.Conn().AddTable(table)
	txn.Conn().AddChain(&nftables.Chain{Name: "a", Table: table})
	if err := txn.Commit(); err != nil {
		t.Fatal(err)
	}
	first := keptFor(id)
	if first == nil {
		t.Fatal("no socket kept after a commit")
	}
	if _, err := Generation(ns.NS()); err != nil {
		t.Fatal(err)
	}
	if got := keptFor(id); got != first {
		t.Errorf("the generation read after the commit used another socket (%p, kept %p)", got, first)
	}

	bad := NewTxn(ns.NS())
	bad.Conn().DelChain(&nftables.Chain{Name: "missing", Table: table})
	if err := bad.Commit(); err == nil {
		t.Fatal("deleting a missing chain was accepted")
	}
	if got := keptFor(id); got != nil {
		t.Errorf("the socket of a rejected transaction was kept (%p)", got)
	}

	s1, err := takeSocket(ns.NS())
	if err != nil {
		t.Fatal(err)
	}
	s2, err := takeSocket(ns.NS())
	if err != nil {
		t.Fatal(err)
	}
	if s1.Conn == s2.Conn {
		t.Fatal("two uses at once were given one socket")
	}
	s1.done(nil)
	s2.done(nil)
	if got := keptFor(id); got != s1.Conn {
		t.Errorf("kept %p, want the first socket handed back (%p)", got, s1.Conn)
	}
	// s2 was closed: a use of it fails.
	if _, err := generationOn(s2.Conn); err == nil {
		t.Error("the second socket handed back is still open")
	}

	kept.Lock()
	k := kept.idle[id]
	k.used = time.Now().Add(-idleClose)
	kept.idle[id] = k
	kept.Unlock()
	sweepSockets()
	if got := keptFor(id); got != nil {
		t.Errorf("a socket idle for %v is still kept", idleClose)
	}
	if _, err := generationOn(s1.Conn); err == nil {
		t.Error("the socket swept is still open")
	}
}
