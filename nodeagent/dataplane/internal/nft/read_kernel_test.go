package nft

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// firstDumpBatch sends a dump of the family's chains on c and returns the
// size of the first batch the kernel answers with, read whole.
func firstDumpBatch(t *testing.T, c *netlink.Conn) int {
	t.Helper()
	if _, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETCHAIN), Flags: netlink.Request | netlink.Dump},
		Data:   []byte{unix.NFPROTO_IPV4, unix.NFNETLINK_V0, 0, 0},
	}); err != nil {
		t.Fatal(err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4*dumpBuffer)
	n := 0
	var recvErr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, _, _, recvErr = unix.Recvmsg(int(fd), buf, nil, unix.MSG_DONTWAIT)
		return recvErr != unix.EAGAIN
	}); err != nil || recvErr != nil {
		t.Fatal(err, recvErr)
	}
	return n
}

// TestWidenedDumps: a socket from dialDumps takes a dump in batches of about
// dumpBuffer (a socket mdlayher/netlink reads a page at a time gets 3.7
// KiB), and the chains listed from it are every chain, with its table, hook
// and policy.
func TestWidenedDumps(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "dump")
	table := &nftables.Table{Name: "proxyshift-dump-test", Family: nftables.TableFamilyIPv4}
	const chains = 1000 // about 100 KB of chain messages
	txn := NewTxn(ns.NS())
	txn.Conn().AddTable(table)
	txn.Conn().AddChain(&nftables.Chain{Name: "base", Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-110)})
	for i := range chains - 1 {
		txn.Conn().AddChain(&nftables.Chain{Name: fmt.Sprintf("c%d", i), Table: table})
	}
	if err := txn.Commit(); err != nil {
		t.Fatal(err)
	}

	wide, err := dialDumps(ns.NS())
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	if n := firstDumpBatch(t, wide); n < dumpBuffer/2 {
		t.Errorf("a widened socket got a first batch of %d bytes; want about %d", n, dumpBuffer)
	}

	r, err := NewReader(context.Background(), ns.NS(), nftables.TableFamilyIPv4, table.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := map[string]*nftables.Chain{}
	if err := r.EachChain(func(c *nftables.Chain) { got[c.Name] = c }); err != nil {
		t.Fatal(err)
	}
	if len(got) != chains {
		t.Fatalf("listed %d chains, want %d", len(got), chains)
	}
	b := got["base"]
	if b.Table.Name != table.Name || b.Hooknum == nil || *b.Hooknum != *nftables.ChainHookPrerouting ||
		b.Priority == nil || *b.Priority != -110 || b.Type != nftables.ChainTypeNAT ||
		b.Policy == nil || *b.Policy != nftables.ChainPolicyAccept {
		t.Errorf("base chain listed as %+v", b)
	}
	if c := got["c1"]; c.Hooknum != nil || c.Table.Name != table.Name {
		t.Errorf("regular chain listed as %+v", c)
	}
}

// TestInterruptedDumpsAreTakenAgain: while another program deletes and
// adds chains in a table listed before ours, every listing of the
// family's chains still holds every chain of ours. The kernel resumes a
// chain dump by counting chains, so a dump that a commit interrupts skips
// or repeats as many of ours as were deleted or added before its
// position; dumpOn sees the ruleset's generation move under the dump and
// takes it again. A few wrong listings are tolerated: a dump that ends
// while the other program's batch is being applied, before its commit,
// can count its new chains and is not caught (see dumpOn).
func TestInterruptedDumpsAreTakenAgain(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "dumpintr")
	other := &nftables.Table{Name: "other", Family: nftables.TableFamilyIPv4}
	ours := &nftables.Table{Name: "proxyshift-dump-test", Family: nftables.TableFamilyIPv4}
	const otherChains, ourChains, churn = 3000, 1000, 500
	txn := NewTxn(ns.NS())
	txn.Conn().AddTable(other)
	for i := range otherChains {
		txn.Conn().AddChain(&nftables.Chain{Name: fmt.Sprintf("o%d", i), Table: other})
	}
	txn.Conn().AddTable(ours)
	for i := range ourChains {
		txn.Conn().AddChain(&nftables.Chain{Name: fmt.Sprintf("c%d", i), Table: ours})
	}
	if err := txn.Commit(); err != nil {
		t.Fatal(err)
	}

	// The other program: at each listing, after a random pause of up to
	// commitWithin (about as long as a listing takes), delete the first
	// churn of its chains, or add them back (at the end of its table,
	// still before ours). One commit per listing: it lands before, during
	// or after the dump, and a dump taken again after it meets none,
	// however slow the machine.
	const commitWithin = 4 * time.Millisecond
	listing := make(chan struct{})
	done := make(chan int)
	go func() {
		commits := 0
		defer func() { done <- commits }()
		for range listing {
			time.Sleep(rand.N(commitWithin))
			txn := NewTxn(ns.NS())
			for i := range churn {
				c := &nftables.Chain{Name: fmt.Sprintf("o%d", i), Table: other}
				if commits%2 == 1 {
					txn.Conn().AddChain(c)
				} else {
					txn.Conn().DelChain(c)
				}
			}
			if err := txn.Commit(); err != nil {
				t.Error(err)
				continue // the listings go on: each waits for this loop
			}
			commits++
		}
	}()

	c, err := dialDumps(ns.NS())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Without the generation reads 63 to 73 of the 200 listings were
	// wrong; with them but without the wait for a commit under way after
	// the dump, 0 to 3 (see dumpOn); with both, none in 35 runs.
	const listings = 200
	var wrong []string
	for i := range listings {
		listing <- struct{}{}
		n := 0
		err := eachChainOn(c, nftables.TableFamilyIPv4, func(ch *nftables.Chain, _ uint32) {
			if ch.Table.Name == ours.Name {
				n++
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if n != ourChains {
			wrong = append(wrong, fmt.Sprintf("listing %d: %d of our %d chains", i+1, n, ourChains))
		}
	}
	t.Logf("%d of %d listings wrong: %v", len(wrong), listings, wrong)
	if len(wrong) > 0 {
		t.Errorf("%d of %d listings wrong: %v", len(wrong), listings, wrong)
	}
	close(listing)
	if commits := <-done; commits < 10 {
		t.Fatalf("the other program committed only %d times during the listings: nothing was tested", commits)
	}
}

// TestAwaitCommitWaitsForTheCommitUnderWay checks what closes dumpOn's
// last window: awaitCommitOn, called while another program's long
// commit is under way, returns only once that commit is in place (the
// generation moved), and itself moves nothing and leaves no answer on
// the socket.
func TestAwaitCommitWaitsForTheCommitUnderWay(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "awaitcommit")
	c, err := dialDumps(ns.NS())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	generation := func() uint32 {
		t.Helper()
		g, err := generationOn(c)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}

	g0 := generation()
	if err := awaitCommitOn(c); err != nil {
		t.Fatal(err)
	}
	if g := generation(); g != g0 {
		t.Fatalf("an empty wait moved the generation from %d to %d", g0, g)
	}

	// A commit of 200 000 chains keeps the kernel busy for a few hundred
	// milliseconds (about 80 ms for 50 000 on the test machine); the wait
	// starts 50 ms into it. When the machine was so fast it had finished
	// by then, or so slow it had not begun (the committing goroutine had
	// not reached the kernel's lock yet: under load, with other tests
	// beside, it did not, and awaitCommitOn rightly returned at once),
	// the attempt proves nothing and is made again. The two cannot be
	// told apart from the generation alone, so an awaitCommitOn that
	// never waits fails every attempt.
	const chains, into, attempts = 200000, 50 * time.Millisecond, 5
	for attempt := range attempts {
		table := &nftables.Table{Name: fmt.Sprintf("busy%d", attempt), Family: nftables.TableFamilyIPv4}
		txn := NewTxn(ns.NS())
		queueTableOfChains(t, txn, table, chains, txn.Queued)
		if err := txn.Encode(); err != nil {
			t.Fatal(err)
		}
		before := generation()
		committed := make(chan error, 1)
		go func() { committed <- txn.Commit() }()
		time.Sleep(into)
		if g := generation(); g != before {
			t.Logf("attempt %d: the commit was done within %s", attempt+1, into)
			if err := <-committed; err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := awaitCommitOn(c); err != nil {
			t.Fatal(err)
		}
		after := generation()
		if err := <-committed; err != nil {
			t.Fatal(err)
		}
		if after == before {
			t.Logf("attempt %d: awaitCommitOn returned before the commit was in place (generation still %d): it had not begun, or the wait does not wait", attempt+1, after)
			continue
		}
		return
	}
	t.Fatalf("no attempt of %d caught the commit under way and saw awaitCommitOn wait for it (each is logged)", attempts)
}

// commitAndRead commits txn and returns a Reader of table in ns, closed
// when the test ends.
func commitAndRead(t *testing.T, txn *Txn, ns *netlab.NetNS, table *nftables.Table) *Reader {
	t.Helper()
	if err := txn.Commit(); err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(context.Background(), ns.NS(), table.Family, table.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// TestRuleCountsOf counts the rules of many chains, more than one socket
// reads (RuleCountsOf shares them out), some of them empty, and a chain
// that does not exist, and among them the rules with an xtables MARK
// target (iptables-nft's `-j MARK`).
func TestRuleCountsOf(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "rulecounts")
	table := &nftables.Table{Name: "counted", Family: nftables.TableFamilyIPv4}
	const chains = 3*ruleCountMinChains + 17
	txn := NewTxn(ns.NS())
	txn.Conn().AddTable(table)
	var names []string
	want, wantMarks := map[string]int{}, map[string]int{}
	// xt_mark_tginfo2: the mark, then the mask (host order).
	markInfo := xt.Unknown(binaryutil.NativeEndian.PutUint32(0x4000))
	markInfo = append(markInfo, binaryutil.NativeEndian.PutUint32(0x4000)...)
	for i := range chains {
		c := txn.Conn().AddChain(&nftables.Chain{Name: fmt.Sprintf("c%d", i), Table: table})
		names = append(names, c.Name)
		for j := range i % 4 {
			exprs := []expr.Any{&expr.Counter{}}
			if j == 1 {
				exprs = append(exprs, &expr.Target{Name: "MARK", Rev: 2, Info: &markInfo})
				wantMarks[c.Name]++
			}
			txn.Conn().AddRule(&nftables.Rule{Table: table, Chain: c, Exprs: exprs})
		}
		if i%4 > 0 {
			want[c.Name] = i % 4
		}
		if err := txn.Queued(); err != nil {
			t.Fatal(err)
		}
	}
	r := commitAndRead(t, txn, ns, table)
	got, marks, err := r.RuleCountsOf(table.Name, append(names, "missing"), "MARK")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("%d chains counted, want %d; chain c1: %d, c2: %d, c3: %d, c%d: %d", len(got), len(want), got["c1"], got["c2"], got["c3"], chains-1, got[fmt.Sprintf("c%d", chains-1)])
	}
	if !maps.Equal(marks, wantMarks) || len(marks) == 0 {
		t.Errorf("rules with a MARK target in %d chains, want %d; chain c2: %d, c3: %d", len(marks), len(wantMarks), marks["c2"], marks["c3"])
	}
}

// TestEachChainUse: a chain's use count is its rules plus the jumps and
// gotos that name it, whichever chain they are in, and a base chain's is
// its rules only.
func TestEachChainUse(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "chainuse")
	table := &nftables.Table{Name: "used", Family: nftables.TableFamilyIPv4}
	txn := NewTxn(ns.NS())
	c := txn.Conn()
	c.AddTable(table)
	a := c.AddChain(&nftables.Chain{Name: "a", Table: table})
	c.AddChain(&nftables.Chain{Name: "e", Table: table})
	b := c.AddChain(&nftables.Chain{Name: "b", Table: table})
	base := c.AddChain(&nftables.Chain{Name: "base", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	verdict := func(from *nftables.Chain, kind expr.VerdictKind, to string) {
		c.AddRule(&nftables.Rule{Table: table, Chain: from, Exprs: []expr.Any{&expr.Verdict{Kind: kind, Chain: to}}})
	}
	for range 3 {
		c.AddRule(&nftables.Rule{Table: table, Chain: a, Exprs: []expr.Any{&expr.Counter{}}})
	}
	verdict(b, expr.VerdictJump, "a")
	verdict(b, expr.VerdictJump, "a")
	verdict(b, expr.VerdictGoto, "e")
	verdict(base, expr.VerdictJump, "b")
	r := commitAndRead(t, txn, ns, table)
	got := map[string]uint32{}
	if err := r.EachChainUse(func(ch *nftables.Chain, use uint32) { got[ch.Name] = use }); err != nil {
		t.Fatal(err)
	}
	// a: 3 rules, 2 jumps; e: 1 goto; b: 3 rules, 1 jump; base: 1 rule.
	if want := map[string]uint32{"a": 5, "e": 1, "b": 4, "base": 1}; !maps.Equal(got, want) {
		t.Errorf("use counts %v, want %v", got, want)
	}
}

// TestEachElementReadsWhatWasWritten: EachElement reads back every
// element of a verdict map with comments and of an interval data map,
// over many dump batches (about 200 KB of elements), with its key, range
// end, data, verdict and comment; a set that does not exist has no
// elements and is no error; and the Reader's socket takes the next
// request after each dump.
func TestEachElementReadsWhatWasWritten(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "elements")
	table := &nftables.Table{Name: "elements", Family: nftables.TableFamilyIPv4}
	txn := NewTxn(ns.NS())
	txn.Conn().AddTable(table)
	target := txn.Conn().AddChain(&nftables.Chain{Name: "target", Table: table})
	const n = 3000
	vmapDef := &Set{Name: "vmap", KeyType: nftables.TypeIPAddr, VerdictMap: true}
	rangesDef := &Set{Name: "ranges", KeyType: nftables.TypeInetService, Interval: true, DataType: nftables.TypeIPAddr}
	vmap, ranges := vmapDef.Kernel(table), rangesDef.Kernel(table)
	var verdicts, intervals []Element
	for i := range n {
		verdicts = append(verdicts, Element{
			Key:     []byte{198, 18, byte(i >> 8), byte(i)},
			Verdict: &Verdict{Kind: expr.VerdictGoto, Chain: target.Name},
			Comment: fmt.Sprintf("default/svc-%05d/tcp/http", i),
		})
		// Ranges of one key with a gap after each: every range has an
		// end element.
		intervals = append(intervals, Element{Key: binaryutil.BigEndian.PutUint16(uint16(2 * i)), Data: []byte{198, 19, byte(i >> 8), byte(i)}})
	}
	same := func(e *Element) Element { return *e }
	for _, s := range []struct {
		set   *nftables.Set
		elems []Element
	}{{vmap, verdicts}, {ranges, intervals}} {
		if err := txn.Conn().AddSet(s.set, nil); err != nil {
			t.Fatal(err)
		}
		if err := AddElements(txn, s.set, same, s.elems); err != nil {
			t.Fatal(err)
		}
	}
	r := commitAndRead(t, txn, ns, table)

	seen := map[string]bool{}
	err := r.EachElement(vmap.Name, func(e nftables.SetElement) {
		i := int(e.Key[2])<<8 | int(e.Key[3])
		v := e.VerdictData
		if v == nil || v.Kind != expr.VerdictGoto || v.Chain != target.Name || e.Comment != fmt.Sprintf("default/svc-%05d/tcp/http", i) {
			t.Errorf("element %v: verdict %+v, comment %q", e.Key, e.VerdictData, e.Comment)
		}
		seen[string(e.Key)] = true
	})
	if err != nil || len(seen) != n {
		t.Fatalf("read %d verdict elements, %v; want %d", len(seen), err, n)
	}

	starts, ends := 0, 0
	err = r.EachElement(ranges.Name, func(e nftables.SetElement) {
		k := int(binaryutil.BigEndian.Uint16(e.Key))
		if e.IntervalEnd {
			ends++
			return
		}
		starts++
		i := k / 2
		if k%2 != 0 || string(e.Val) != string([]byte{198, 19, byte(i >> 8), byte(i)}) {
			t.Errorf("range from %d maps to %v", k, e.Val)
		}
	})
	if err != nil || starts != n || ends != n {
		t.Fatalf("read %d ranges and %d ends, %v; want %d of each", starts, ends, err, n)
	}

	called := false
	if err := r.EachElement("missing", func(nftables.SetElement) { called = true }); err != nil || called {
		t.Errorf("a set that does not exist: err %v, elements read %v; want neither", err, called)
	}
	if counts, err := r.RuleCounts(); err != nil || len(counts) != 0 {
		t.Errorf("rule counts after the element dumps: %v, %v; want none", counts, err)
	}
}
