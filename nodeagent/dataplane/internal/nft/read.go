package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Reading a table back. google/nftables lists the rules of one chain at a
// time, each a dump that walks the whole table; with tens of thousands of
// chains that is as many round trips. The dumps here ask for all the
// chains of a family, or all the rules of a table or of a chain, in one
// request, on sockets that take each dump in 32 KiB batches (widen):
// nf_tables resumes every batch of a dump of chains or of a table's rules
// by walking from the first object again, so the batch size divides the
// cost.

// Open returns a google/nftables connection for reading the network
// namespace netns.
func Open(netns nsexec.NS) (*nftables.Conn, error) {
	return nftables.New(nftables.WithNetNSFd(netns.FD()))
}

// OpenTable opens a connection for reading network namespace netns and
// finds proxyshift's table name of family f there (FindTable): a nil
// table when there is none, a *ForeignTableError when the table there is
// not proxyshift's.
func OpenTable(netns nsexec.NS, f *Family, name string) (*nftables.Conn, *nftables.Table, error) {
	t, err := FindTable(netns, f, name)
	if err != nil || t == nil {
		return nil, nil, err
	}
	conn, err := Open(netns)
	return conn, t, err
}

// eachChainOn calls fn with every chain of family fam, of every table,
// in the kernel's order, from one dump on the open socket c: its table's
// name (Table.Name), its name, and for a base chain its type, hook,
// priority and policy; and its use count (see Reader.EachChainUse). The
// kernel's dump of chains takes no table: it sends every chain of the
// family whatever table the request names.
func eachChainOn(c *netlink.Conn, fam nftables.TableFamily, fn func(*nftables.Chain, uint32)) error {
	err := dumpOn(c, fam, unix.NFT_MSG_GETCHAIN, netlink.NewAttributeEncoder(), func(a *attrs) {
		if ch, use := decodeChain(fam, a); ch.Name != "" {
			fn(ch, use)
		}
	})
	if err != nil {
		return fmt.Errorf("nft: list the chains: %w", err)
	}
	return nil
}

// decodeChain decodes one chain message of family fam: its table's name,
// its name, and for a base chain its type, hook, priority and policy;
// and its use count.
func decodeChain(fam nftables.TableFamily, a *attrs) (*nftables.Chain, uint32) {
	ch := &nftables.Chain{Table: &nftables.Table{Family: fam}}
	var use uint32
	for a.next() {
		switch a.typ {
		case unix.NFTA_CHAIN_TABLE:
			ch.Table.Name = a.str()
		case unix.NFTA_CHAIN_NAME:
			ch.Name = a.str()
		case unix.NFTA_CHAIN_TYPE:
			ch.Type = nftables.ChainType(a.str())
		case unix.NFTA_CHAIN_HOOK:
			decodeHook(ch, a)
		case unix.NFTA_CHAIN_POLICY:
			p := nftables.ChainPolicy(a.be32())
			ch.Policy = &p
		case unix.NFTA_CHAIN_USE:
			use = a.be32()
		}
	}
	return ch, use
}

// decodeHook decodes a chain's NFTA_CHAIN_HOOK, a's current attribute,
// into ch.
func decodeHook(ch *nftables.Chain, a *attrs) {
	h := a.nested()
	for h.next() {
		switch h.typ {
		case unix.NFTA_HOOK_HOOKNUM:
			ch.Hooknum = nftables.ChainHookRef(nftables.ChainHook(h.be32()))
		case unix.NFTA_HOOK_PRIORITY:
			ch.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(int32(h.be32())))
		}
	}
	a.nestedErr(&h)
}

// RuleCounts returns the number of rules in each chain of table (family
// fam) in network namespace netns, from one dump of the whole table; nil
// when there is no such table. (A rule dump resumes each netlink message
// by skipping as many rules as it already sent, so it costs more than the
// table's size: syncs should not ask.)
func RuleCounts(netns nsexec.NS, fam nftables.TableFamily, table string) (map[string]int, error) {
	counts := map[string]int{}
	err := dump(netns, fam, unix.NFT_MSG_GETRULE, unix.NFTA_RULE_TABLE, table, func(a *attrs) {
		for a.next() {
			if a.typ == unix.NFTA_RULE_CHAIN {
				counts[a.str()]++
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("nft: list the rules of %s: %w", table, err)
	}
	if len(counts) == 0 {
		return nil, nil
	}
	return counts, nil
}

// dump runs one dump request of type msgType (family fam) filtered by
// table (attribute tableAttr), calling fn with each answer's attributes.
// A table that does not exist is no error: fn is not called.
func dump(netns nsexec.NS, fam nftables.TableFamily, msgType, tableAttr uint16, table string, fn func(*attrs)) error {
	ae := netlink.NewAttributeEncoder()
	ae.String(tableAttr, table)
	return dumpWith(netns, fam, msgType, ae, fn)
}

// dumpWith runs one dump request of type msgType (family fam) with the
// attributes ae holds, calling fn with each answer's attributes. An
// object that does not exist is no error: fn is not called.
func dumpWith(netns nsexec.NS, fam nftables.TableFamily, msgType uint16, ae *netlink.AttributeEncoder, fn func(*attrs)) (err error) {
	s, err := takeSocket(netns)
	if err != nil {
		return err
	}
	defer func() { s.done(err) }()
	return dumpOn(s.Conn, fam, msgType, ae, fn)
}

// dumpOn is dumpWith on the open socket c. The dump is taken between
// two reads of the ruleset's generation, and taken again when they
// differ, up to dumpAttempts times in all; fn sees only the answer of a
// dump no commit interrupted.
//
// The kernel sends a dump in batches and resumes each by counting the
// objects it walks up to where the last one ended: the chains of every
// table of the family, the tables, or a table's rules. A commit between
// two batches that adds or deletes objects before that point shifts the
// count (iptables-nft deleting its 110 000 chains during a switch's
// cleanup, for a dump of chains; kube-proxy's sync, for a dump of the nat
// table it shares with proxyshift's iptables mode), and the dump skips
// or repeats as many objects, ours among them. The kernel
// flags such a dump (NLM_F_DUMP_INTR), but when the commit lands during
// the last batch the flag is on the dump's closing message alone, which
// mdlayher/netlink drops: hence the generation reads.
//
// A commit moves the generation a moment before its objects change
// (nf_tables_commit bumps base_seq, then flips the generation cursor),
// so a dump whose first read lands in between would see the same
// generation twice yet the change under way. awaitCommitOn closes that
// window: between the first read and the dump it waits for any commit
// under way to end.
//
// The kernel's chain dump also counts, when it resumes, the chains
// another program's batch has added but not yet committed, which it did
// not count when it stopped (nf_tables_dump_chains skips inactive chains
// after the skip, not before). A dump that ends while such a batch is
// still being applied, before its commit moves the generation, would
// then repeat or skip as many chains unseen; so dumpOn waits for any
// commit under way once more after the dump, before the second read.
// With that wait no listing of TestInterruptedDumpsAreTakenAgain was
// wrong in 7 000; without it, 0 to 3 in every 200. What stays open is a
// batch the kernel aborts after the dump counted its chains: an abort
// does not move the generation.
func dumpOn(c *netlink.Conn, fam nftables.TableFamily, msgType uint16, ae *netlink.AttributeEncoder, fn func(*attrs)) error {
	for range dumpAttempts {
		g0, err := generationOn(c)
		if err != nil {
			return err
		}
		if err := awaitCommitOn(c); err != nil {
			return err
		}
		// The batches are kept as they came and read once the dump is
		// known whole.
		var batches [][]byte
		var seq uint32
		err = exchange(c, fam, msgType, netlink.Request|netlink.Dump, ae, func(batch []byte, s uint32) {
			batches, seq = append(batches, bytes.Clone(batch)), s
		}, nil)
		if err != nil {
			return err
		}
		if err := awaitCommitOn(c); err != nil {
			return err
		}
		g1, err := generationOn(c)
		if err != nil {
			return err
		}
		if g0 == g1 {
			for _, b := range batches {
				if _, err := eachAnswer(b, seq, fn); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return fmt.Errorf("nft: every one of %d dumps in a row was interrupted by a commit", dumpAttempts)
}

// awaitCommitOn returns once no commit is under way on the socket c's
// namespace: it sends an empty batch, which the kernel handles before
// sendmsg returns, under the lock every commit holds to its end. An
// empty batch commits nothing, so it neither moves the generation nor
// answers (no acknowledgement is asked for); it needs CAP_NET_ADMIN,
// like every write, and a refusal is a message the dump after it
// reports.
func awaitCommitOn(c *netlink.Conn) error {
	buf := appendMessage(nil, batchMessage(unix.NFNL_MSG_BATCH_BEGIN), 0)
	buf = appendMessage(buf, batchMessage(unix.NFNL_MSG_BATCH_END), 0)
	if err := send(c, [][]byte{buf}); err != nil {
		return fmt.Errorf("nft: wait for a commit under way: %w", err)
	}
	return nil
}

// dumpAttempts bounds how often dumpOn takes a dump that commits keep
// interrupting: only a stream of commits (another program syncing many
// times a second) exhausts it.
const dumpAttempts = 10

// dumpObjectOn is one dump of the contents of one object (one chain's
// rules, one set's elements) on c, read as it arrives (exchange). The
// kernel resumes it within that object, so other objects' commits cannot
// shift it, and only the object's owner changes the object: no
// generation reads, which would triple the round trips of reading
// 110 000 chains one by one.
func dumpObjectOn(c *netlink.Conn, fam nftables.TableFamily, msgType uint16, ae *netlink.AttributeEncoder, fn func(*attrs)) error {
	return exchange(c, fam, msgType, netlink.Request|netlink.Dump, ae, nil, fn)
}

// requestOn sends one request of type msgType (family fam) with flags and
// the attributes ae holds on socket c, calling fn with each answer's
// attributes as it arrives. An object that does not exist is no error:
// fn is not called.
func requestOn(c *netlink.Conn, fam nftables.TableFamily, msgType uint16, flags netlink.HeaderFlags, ae *netlink.AttributeEncoder, fn func(*attrs)) error {
	return exchange(c, fam, msgType, flags, ae, nil, fn)
}

// exchange sends one request of type msgType (family fam) with flags and
// the attributes ae holds on socket c and reads the answer batch by
// batch, as the kernel sends it, into a pooled buffer: each batch goes
// to batch if it is not nil (with the request's sequence number), and
// the attributes of each answer in it to fn if it is not nil, valid
// during the call only. Nothing of the answer is copied or decoded into
// objects (mdlayher/netlink's Execute holds a whole dump, each message
// and attribute copied, before it returns). It returns when the answer
// ends: a dump's closing message, a single answer, or an error report.
// An object that does not exist (ENOENT) is no error: the answer is
// empty.
func exchange(c *netlink.Conn, fam nftables.TableFamily, msgType uint16, flags netlink.HeaderFlags, ae *netlink.AttributeEncoder, batch func(b []byte, seq uint32), fn func(*attrs)) error {
	request, err := ae.Encode()
	if err != nil {
		return err
	}
	sent, err := c.Send(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType),
			Flags: flags,
		},
		// struct nfgenmsg: family, version, resource id.
		Data: append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, request...),
	})
	if err != nil {
		return err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	buf := receiveBuffers.Get().(*[]byte)
	defer receiveBuffers.Put(buf)
	seq := sent.Header.Sequence
	// After an error in the answer the rest is still read, so that the
	// socket's dump ends and the socket can take the next request.
	var first error
	for {
		n, err := receive(rc, buf)
		if err != nil {
			return err
		}
		b := (*buf)[:n]
		if batch != nil && first == nil {
			batch(b, seq)
		}
		done, err := eachAnswer(b, seq, fn)
		if first == nil && err != nil {
			first, fn, batch = err, nil, nil
		}
		if done {
			if errors.Is(first, unix.ENOENT) {
				return nil
			}
			return first
		}
	}
}

// receiveBuffers holds buffers of dumpBuffer bytes for exchange: the
// kernel fills no dump batch beyond that (see widen), and a larger
// message gets a buffer of its own (receive).
var receiveBuffers = sync.Pool{New: func() any {
	b := make([]byte, dumpBuffer)
	return &b
}}

// receive reads one datagram of the netlink socket rc into *buf, made
// larger first if the datagram is (a peek gives its size), and returns
// its length.
func receive(rc syscall.RawConn, buf *[]byte) (int, error) {
	read := func(flags int) (int, error) {
		var n int
		var recvErr error
		err := rc.Read(func(fd uintptr) bool {
			n, _, _, _, recvErr = unix.Recvmsg(int(fd), *buf, nil, flags|unix.MSG_DONTWAIT)
			return recvErr != unix.EAGAIN
		})
		return n, errors.Join(err, recvErr)
	}
	n, err := read(unix.MSG_PEEK | unix.MSG_TRUNC)
	if err != nil {
		return 0, err
	}
	if n > len(*buf) {
		*buf = make([]byte, n)
	}
	return read(0)
}

// eachAnswer calls fn (if not nil) with the attributes of each message
// of the batch b that answers the request of sequence number seq, after
// its struct nfgenmsg, and says whether b ends the answer: a dump's closing
// message, a message not part of a dump, or an error report, which it
// returns as the error it reports. A malformed message or attribute is
// an error too.
func eachAnswer(b []byte, seq uint32, fn func(*attrs)) (done bool, err error) {
	for len(b) > 0 {
		n := 0
		if len(b) >= unix.NLMSG_HDRLEN {
			n = int(binary.NativeEndian.Uint32(b))
		}
		if n < unix.NLMSG_HDRLEN || n > len(b) {
			return true, fmt.Errorf("nft: malformed netlink message (length %d of %d bytes left)", n, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:])
		flags := binary.NativeEndian.Uint16(b[6:])
		msgSeq := binary.NativeEndian.Uint32(b[8:])
		body := b[unix.NLMSG_HDRLEN:n]
		b = b[min(nlmsgAlign(n), len(b)):]
		if msgSeq != seq {
			continue // a late answer to an earlier request
		}
		switch typ {
		case unix.NLMSG_DONE, unix.NLMSG_ERROR:
			if len(body) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(body)); code < 0 {
					return true, unix.Errno(-code)
				}
			}
			return true, nil
		}
		if fn != nil && len(body) >= 4 {
			a := newAttrs(body[4:])
			fn(&a)
			if a.err != nil {
				return true, a.err
			}
		}
		if flags&unix.NLM_F_MULTI == 0 {
			return true, nil
		}
	}
	return false, nil
}

// DeleteTable deletes proxyshift's table name of family f in network
// namespace netns, with everything in it, in one transaction. It returns
// the line that says what it removed, "" when there was no such table; a
// table of that name that is not proxyshift's is left, and is a
// *ForeignTableError.
func DeleteTable(netns nsexec.NS, f *Family, name string) (string, error) {
	t, err := FindTable(netns, f, name)
	if err != nil || t == nil {
		return "", err
	}
	txn := NewTxn(netns)
	txn.Conn().DelTable(t)
	if err := txn.Commit(); err != nil {
		return "", fmt.Errorf("nft: delete table %s %s: %w", f.Name, name, err)
	}
	return fmt.Sprintf("nftables table %s %s", f.Name, name), nil
}

// TableExists says whether proxyshift's table name exists in either
// family (ip, ip6) in network namespace netns. A table of that name that
// is not proxyshift's does not count: it is no mode of proxyshift's that
// the node runs (the syncs that would write it report it).
func TableExists(netns nsexec.NS, name string) (bool, error) {
	for _, f := range Families {
		t, err := FindTable(netns, f, name)
		var foreign *ForeignTableError
		if errors.As(err, &foreign) {
			continue
		}
		if err != nil || t != nil {
			return t != nil, err
		}
	}
	return false, nil
}

// ChainExists says whether table of family fam in network namespace
// netns has a chain named chain (false when the table does not exist);
// see LookupChain.
func ChainExists(netns nsexec.NS, fam nftables.TableFamily, table, chain string) (bool, error) {
	c, err := LookupChain(netns, fam, table, chain)
	return c != nil, err
}

// LookupChain returns table's chain named chain in family fam in network
// namespace netns, as eachChainOn decodes it, or nil when there is no
// such chain (or table). It asks for that one chain, which the kernel
// finds by name in a hash table: unlike a dump of the family's chains,
// its cost does not grow with the tables.
func LookupChain(netns nsexec.NS, fam nftables.TableFamily, table, chain string) (*nftables.Chain, error) {
	c, _, err := LookupChainUse(netns, fam, table, chain)
	return c, err
}

// LookupChainUse is LookupChain with the chain's use count (see
// Reader.EachChainUse): for a base chain, which no verdict may name, the
// number of its rules.
func LookupChainUse(netns nsexec.NS, fam nftables.TableFamily, table, chain string) (_ *nftables.Chain, use uint32, err error) {
	s, err := takeSocket(netns)
	if err != nil {
		return nil, 0, err
	}
	defer func() { s.done(err) }()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_CHAIN_TABLE, table)
	ae.String(unix.NFTA_CHAIN_NAME, chain)
	var found *nftables.Chain
	if err := requestOn(s.Conn, fam, unix.NFT_MSG_GETCHAIN, netlink.Request, ae, func(a *attrs) { found, use = decodeChain(fam, a) }); err != nil {
		return nil, 0, fmt.Errorf("nft: look up chain %s of table %s: %w", chain, table, err)
	}
	return found, use, nil
}

// TableUses returns, for each table of family fam in network namespace
// netns, the table's use count: how many chains, sets and other objects
// it holds (google/nftables decodes it in the wrong byte order).
func TableUses(netns nsexec.NS, fam nftables.TableFamily) (map[string]uint32, error) {
	uses := map[string]uint32{}
	err := dumpWith(netns, fam, unix.NFT_MSG_GETTABLE, netlink.NewAttributeEncoder(), func(a *attrs) {
		var name string
		var use uint32
		for a.next() {
			switch a.typ {
			case unix.NFTA_TABLE_NAME:
				name = a.str()
			case unix.NFTA_TABLE_USE:
				use = a.be32()
			}
		}
		uses[name] = use
	})
	if err != nil {
		return nil, fmt.Errorf("nft: list the tables: %w", err)
	}
	return uses, nil
}
