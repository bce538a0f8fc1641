package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// A transaction is queued with google/nftables' calls on a Conn and sent
// as one netlink batch, which the kernel applies atomically or not at all.
//
// google/nftables v0.3.0 asks the kernel to acknowledge every message of
// a batch, and to echo back every rule it creates, and reads the answers
// one by one. A full sync of a large cluster is hundreds of thousands of
// messages: the answers overflow any default socket buffer (ENOBUFS after
// the kernel has committed the batch) and cost one recvmsg each
// (google/nftables issues #103 and #350; upstream stopped requesting
// acknowledgements after v0.3.0). So the batch is taken from the library
// through its dial hook and sent the way nft sends it: in one sendmsg,
// with only the last message asking for an acknowledgement. The kernel
// reports any failing message regardless, and it has processed the whole
// batch before sendmsg returns.

// Txn is one transaction in the making: queue its messages with
// google/nftables' calls on Conn, then Commit. Every table it creates
// carries proxyshift's mark (see OwnerComment).
//
// A large transaction is encoded as it is queued: Encode moves the
// messages queued so far out of the library into the batch's wire
// encoding, so that only their bytes stay, not the library's messages
// and the attribute trees they were built from (at 10k services those
// are several times the size of the batch itself). Commit encodes the
// rest and sends the whole batch at once: the kernel applies a batch only
// as one message buffer.
type Txn struct {
	conn  *nftables.Conn
	netns nsexec.NS
	// chunks are the batch's encoding so far: the batch's begin message,
	// then one chunk per encoding of the library's messages and one per
	// run of messages written directly (elements), numbered from 1
	// (begin) to seq. ownLast says the last chunk is one of the latter,
	// which more such messages extend; w writes them.
	chunks  [][]byte
	seq     uint32
	ownLast bool
	w       writer
	// sent records that the batch went out and err what the kernel said.
	sent bool
	err  error
	// queued counts the operations Queued was told of.
	queued int
	// setUserdata is the user data AddSet gives sets of numgen keys.
	setUserdata map[setRef][]byte
}

// encodeEvery is how many operations Queued lets pass between two
// encodings of the transaction: it bounds what the library holds at once
// to a few thousand messages.
const encodeEvery = 1024

// NewTxn returns an empty transaction for the network namespace netns.
func NewTxn(netns nsexec.NS) *Txn {
	t := &Txn{netns: netns, seq: 1, chunks: [][]byte{appendMessage(nil, batchMessage(unix.NFNL_MSG_BATCH_BEGIN), 1)}}
	// New only fails when dialing a lasting connection, which this is not.
	t.conn, _ = nftables.New(nftables.WithTestDial(t.exchange))
	return t
}

// Conn is the connection to queue the transaction's messages on.
func (t *Txn) Conn() *nftables.Conn { return t.conn }

// Encode moves the messages queued on Conn so far into the batch's
// encoding. Call it now and then while queueing a large transaction; it
// changes nothing of what Commit sends. It returns the library's error
// for a message it could not build.
func (t *Txn) Encode() error { return t.conn.Flush() }

// Queued tells t that one more operation was queued on Conn, and encodes
// the batch so far (Encode) after every encodeEvery of them: a caller
// queueing a large transaction calls it after each operation.
func (t *Txn) Queued() error {
	if t.queued++; t.queued%encodeEvery == 0 {
		return t.Encode()
	}
	return nil
}

// Commit sends the queued batch and reports the kernel's verdict on it:
// nil when it applied the whole batch, the first failing message's error
// when it applied none of it.
func (t *Txn) Commit() error {
	if t.sent {
		return errors.New("nft: transaction committed twice")
	}
	if err := t.conn.Flush(); err != nil {
		return err
	}
	t.sent = true
	if t.seq <= 1 { // nothing but begin
		return nil
	}
	t.err = sendBatch(t.netns, t.framed(), t.seq)
	t.chunks = nil
	return t.err
}

// exchange stands in for the kernel on the library's connection. The
// library sends its queued messages as a batch (req != nil) and then
// waits for one acknowledgement per message (req == nil), which it gets
// here; the messages are appended to the transaction's encoding.
func (t *Txn) exchange(req []netlink.Message) ([]netlink.Message, error) {
	if req == nil {
		return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}, nil
	}
	if t.sent || len(req) < 2 {
		return nil, errors.New("nft: messages queued on a committed transaction")
	}
	msgs := req[1 : len(req)-1] // the library's begin and end are t's own
	markTables(msgs)
	describeSets(msgs, t.setUserdata)
	size := 0
	for _, m := range msgs {
		size += nlmsgAlign(nlmsgHdrLen + len(m.Data))
	}
	buf := make([]byte, 0, size)
	for _, m := range msgs {
		t.seq++
		buf = appendMessage(buf, m, t.seq)
	}
	t.chunks = append(t.chunks, buf)
	t.ownLast = false
	return nil, nil
}

// ownChunkBytes is the size at which the messages written directly go on
// in a new chunk: a chunk grown by appending is copied as it grows, a
// full sync's 16 MB of elements about twice over in one chunk.
const ownChunkBytes = 1 << 20

// writer returns the writer of messages appended directly to the batch,
// after everything encoded so far (call Encode first for the library's
// messages queued since), for about size bytes; call wrote once done
// with it.
func (t *Txn) writer(size int) *writer {
	if !t.ownLast {
		// An endpoint change writes a few hundred bytes, a full sync
		// megabytes: a chunk of the size asked for, up to ownChunkBytes.
		t.chunks = append(t.chunks, make([]byte, 0, min(size, ownChunkBytes+2*maxElementBytes)))
		t.ownLast = true
	}
	t.w = writer{b: t.chunks[len(t.chunks)-1], seq: &t.seq, next: t.nextChunk}
	return &t.w
}

// nextChunk keeps the writer's chunk and gives it a new one, when the one
// it has holds ownChunkBytes: between two messages only.
func (t *Txn) nextChunk() {
	if len(t.w.b) < ownChunkBytes {
		return
	}
	t.chunks[len(t.chunks)-1] = t.w.b
	t.w.b = make([]byte, 0, ownChunkBytes+2*maxElementBytes)
	t.chunks = append(t.chunks, nil)
}

// wrote keeps what the writer appended.
func (t *Txn) wrote() {
	t.chunks[len(t.chunks)-1] = t.w.b
	t.w = writer{}
}

// batchMessage is the message of type typ (NFNL_MSG_BATCH_BEGIN or
// _END) that opens or closes a batch of nf_tables messages.
func batchMessage(typ uint16) netlink.Message {
	// struct nfgenmsg: family, version, resource id (the subsystem).
	return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}}
}

// framed is the whole batch, its end message added, with only the last
// message before the end asking for an acknowledgement (see sendBatch).
func (t *Txn) framed() [][]byte {
	last := t.chunks[len(t.chunks)-1]
	for p := 0; p < len(last); {
		n := nlmsgAlign(int(binary.NativeEndian.Uint32(last[p:])))
		if p+n == len(last) {
			flags := last[p+6:]
			binary.NativeEndian.PutUint16(flags, binary.NativeEndian.Uint16(flags)|uint16(netlink.Acknowledge))
		}
		p += n
	}
	return append(t.chunks, appendMessage(nil, batchMessage(unix.NFNL_MSG_BATCH_END), t.seq+1))
}

// batchTimeout bounds the wait for the kernel's answer. The kernel
// answers before sendmsg returns, so it only guards against surprises.
const batchTimeout = 30 * time.Second

// sendBatch sends an encoded batch (begin, messages, end), in pieces
// that one sendmsg gathers, on the namespace's kept socket (takeSocket),
// and waits for the acknowledgement of its last message before end,
// numbered last, or an error.
func sendBatch(netns nsexec.NS, batch [][]byte, last uint32) (err error) {
	s, err := takeSocket(netns)
	if err != nil {
		return err
	}
	defer func() { s.done(err) }()
	c := s.Conn
	size := 0
	for _, b := range batch {
		size += len(b)
	}
	// The whole batch goes out in one sendmsg, which the socket's send
	// buffer must hold (SO_SNDBUFFORCE as root).
	if err := c.SetWriteBuffer(size + 1<<16); err != nil {
		return fmt.Errorf("nft: send buffer of %d bytes: %w", size, err)
	}
	// Error reports carry the kernel's reason, and there is room for
	// many: if they overflowed the socket, the first one, which names the
	// cause, would be lost. (Capped reports would be smaller, but
	// netlink.Conn misreads them.)
	_ = c.SetOption(netlink.ExtendedAcknowledge, true)
	_ = c.SetReadBuffer(4 << 20)
	if err := send(c, batch); err != nil {
		return fmt.Errorf("nft: send batch of %d messages: %w", last-1, err)
	}
	if err := c.SetReadDeadline(time.Now().Add(batchTimeout)); err != nil {
		return err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	buf := receiveBuffers.Get().(*[]byte)
	defer receiveBuffers.Put(buf)
	for {
		n, err := receive(rc, buf)
		if err != nil {
			return fmt.Errorf("nft: the kernel's answer to a batch of %d messages: %w", last-1, err)
		}
		if done, err := batchAnswer((*buf)[:n], batch, last); done {
			return err
		}
	}
}

// batchAnswer reads one datagram b of the kernel's answer to batch and
// says whether it ends the answer: the acknowledgement of the message
// numbered last, or the first error report, which means the kernel
// rejected the batch and applied none of it, returned as a
// *RejectedError naming the refused message.
func batchAnswer(b []byte, batch [][]byte, last uint32) (done bool, err error) {
	for len(b) >= nlmsgHdrLen {
		n := int(binary.NativeEndian.Uint32(b))
		if n < nlmsgHdrLen || n > len(b) {
			return true, fmt.Errorf("nft: malformed netlink message (length %d of %d bytes left)", n, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:])
		flags := binary.NativeEndian.Uint16(b[6:])
		seq := binary.NativeEndian.Uint32(b[8:])
		body := b[nlmsgHdrLen:n]
		b = b[min(nlmsgAlign(n), len(b)):]
		if typ == unix.NLMSG_ERROR {
			refused, errno, text := rejection(flags, body)
			if errno != 0 {
				rej := &RejectedError{Errno: errno, Text: text}
				if msg, index, count := messageNumbered(batch, refused); msg != nil {
					rej.Op, rej.Index, rej.Count = describeMessage(msg), index, count
				}
				return true, rej
			}
		}
		if seq == last {
			return true, nil
		}
	}
	return false, nil
}

// nlmsgHdrLen is the length of struct nlmsghdr.
const nlmsgHdrLen = 16

// nlmsgAlign rounds n up to netlink's 4-byte alignment.
func nlmsgAlign(n int) int { return (n + 3) &^ 3 }

// appendMessage appends m's encoding, numbered seq, to buf, with the echo
// and acknowledgement flags cleared: the library asks for every message
// to be acknowledged and every new rule to be echoed back (to learn its
// handle), which we never need (framed asks for one acknowledgement).
func appendMessage(buf []byte, m netlink.Message, seq uint32) []byte {
	n := nlmsgHdrLen + len(m.Data)
	off := len(buf)
	buf = slices.Grow(buf, nlmsgAlign(n))[:off+nlmsgAlign(n)]
	// struct nlmsghdr, in host byte order.
	binary.NativeEndian.PutUint32(buf[off:], uint32(n))
	binary.NativeEndian.PutUint16(buf[off+4:], uint16(m.Header.Type))
	binary.NativeEndian.PutUint16(buf[off+6:], uint16(m.Header.Flags&^(netlink.Acknowledge|netlink.Echo)))
	binary.NativeEndian.PutUint32(buf[off+8:], seq)
	binary.NativeEndian.PutUint32(buf[off+12:], 0)
	copy(buf[off+nlmsgHdrLen:], m.Data)
	clear(buf[off+n:])
	return buf
}

// maxIOV is how many pieces one sendmsg takes (the kernel's UIO_MAXIOV).
const maxIOV = 1024

// send writes the batch to the kernel in one sendmsg on c's socket.
func send(c *netlink.Conn, batch [][]byte) error {
	if len(batch) > maxIOV {
		batch = [][]byte{slices.Concat(batch...)}
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	err = rc.Write(func(fd uintptr) bool {
		_, sendErr = unix.SendmsgBuffers(int(fd), batch, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return sendErr != unix.EAGAIN
	})
	return errors.Join(err, sendErr)
}

// dialDumps opens a netfilter netlink socket in the namespace netns,
// widened for dumps (widen: one round trip). Every socket is: the kept
// ones (takeSocket) serve dumps and transactions alike.
func dialDumps(netns nsexec.NS) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns.FD()})
	if err != nil {
		return nil, fmt.Errorf("nft: netlink socket: %w", err)
	}
	if err := widen(c); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("nft: netlink socket: %w", err)
	}
	return c, nil
}

// dumpBuffer is the receive buffer the kernel fills a socket's dumps
// for: it fills each batch of a dump up to the largest buffer a read of
// the socket has offered, at most 32 KiB. mdlayher/netlink reads with a
// page, so a dump came in batches of 4 KiB; and nf_tables resumes each
// batch of a dump of chains, or of a table's rules, by walking the table
// again from its first object, so the number of batches multiplies the
// cost (listing the 110 000 chains of iptables-nft's nat table at 10 000
// services took 10 s in 4 KiB batches).
const dumpBuffer = 32 << 10

// widen makes the kernel fill the dumps of socket c in batches of
// dumpBuffer: it reads the ruleset's generation, and exchange reads the
// answer with a buffer of that size, which the kernel remembers.
func widen(c *netlink.Conn) error {
	_, err := generationOn(c)
	return err
}
