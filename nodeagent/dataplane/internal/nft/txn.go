package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
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
type Txn struct {
	conn  *nftables.Conn
	netns nsexec.NS
	// sent records that the batch went out and err what the kernel said.
	sent bool
	err  error
}

// NewTxn returns an empty transaction for the network namespace netns.
func NewTxn(netns nsexec.NS) *Txn {
	t := &Txn{netns: netns}
	// New only fails when dialing a lasting connection, which this is not.
	t.conn, _ = nftables.New(nftables.WithTestDial(t.exchange))
	return t
}

// Conn is the connection to queue the transaction's messages on.
func (t *Txn) Conn() *nftables.Conn { return t.conn }

// Commit sends the queued batch and reports the kernel's verdict on it:
// nil when it applied the whole batch, the first failing message's error
// when it applied none of it.
func (t *Txn) Commit() error {
	if err := t.conn.Flush(); err != nil {
		return err
	}
	return t.err
}

// exchange stands in for the kernel on the library's connection. The
// library sends the batch (req != nil) and then waits for one
// acknowledgement per message (req == nil), which it gets here; the
// kernel's real answer is kept in t.err for commit.
func (t *Txn) exchange(req []netlink.Message) ([]netlink.Message, error) {
	if req == nil {
		return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}, nil
	}
	if t.sent {
		t.err = errors.Join(t.err, errors.New("nft: second batch on one transaction"))
		return nil, nil
	}
	t.sent = true
	markTables(req)
	t.err = sendBatch(t.netns, req)
	return nil, nil
}

// batchTimeout bounds the wait for the kernel's answer. The kernel
// answers before sendmsg returns, so it only guards against surprises.
const batchTimeout = 30 * time.Second

// sendBatch sends a batch (begin, messages, end) on a socket of its own
// and waits for the acknowledgement of its last message, or an error.
func sendBatch(netns nsexec.NS, batch []netlink.Message) error {
	if len(batch) < 3 {
		return nil
	}
	c, err := dial(netns)
	if err != nil {
		return err
	}
	defer c.Close()

	// Only the last message before the batch end (which is never
	// acknowledged itself) asks for an acknowledgement. The library also
	// asks for every new rule to be echoed back (to learn its handle),
	// which we never need.
	last := len(batch) - 2
	buf := marshalBatch(batch, func(i int, f netlink.HeaderFlags) netlink.HeaderFlags {
		f &^= netlink.Acknowledge | netlink.Echo
		if i == last {
			f |= netlink.Acknowledge
		}
		return f
	})
	// The whole batch goes out in one sendmsg, which the socket's send
	// buffer must hold (SO_SNDBUFFORCE as root).
	if err := c.SetWriteBuffer(len(buf) + 1<<16); err != nil {
		return fmt.Errorf("nft: send buffer of %d bytes: %w", len(buf), err)
	}
	// Error reports carry the kernel's reason, and there is room for
	// many: if they overflowed the socket, the first one, which names the
	// cause, would be lost. (Capped reports would be smaller, but
	// netlink.Conn misreads them.)
	_ = c.SetOption(netlink.ExtendedAcknowledge, true)
	_ = c.SetReadBuffer(4 << 20)
	if err := send(c, buf); err != nil {
		return fmt.Errorf("nft: send batch of %d messages: %w", len(batch)-2, err)
	}
	if err := c.SetReadDeadline(time.Now().Add(batchTimeout)); err != nil {
		return err
	}
	want := uint32(last + 1) // marshalBatch numbers messages from 1
	for {
		// Receive returns the first error report as an error: the kernel
		// rejected the batch and applied none of it.
		msgs, err := c.Receive()
		if err != nil {
			return fmt.Errorf("nft: transaction rejected: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Sequence == want {
				return nil
			}
		}
	}
}

// marshalBatch encodes msgs into one buffer, numbering them from 1 and
// setting each one's flags with flags(index, flags). netlink.Conn's own
// encoding allocates per message and grows its buffer by appending,
// which for a batch of megabytes costs more than the kernel's work.
func marshalBatch(msgs []netlink.Message, flags func(int, netlink.HeaderFlags) netlink.HeaderFlags) []byte {
	const hdrLen = 16
	align := func(n int) int { return (n + 3) &^ 3 }
	size := 0
	for _, m := range msgs {
		size += align(hdrLen + len(m.Data))
	}
	buf := make([]byte, size)
	off := 0
	for i, m := range msgs {
		n := hdrLen + len(m.Data)
		// struct nlmsghdr, in host byte order.
		binary.NativeEndian.PutUint32(buf[off:], uint32(n))
		binary.NativeEndian.PutUint16(buf[off+4:], uint16(m.Header.Type))
		binary.NativeEndian.PutUint16(buf[off+6:], uint16(flags(i, m.Header.Flags)))
		binary.NativeEndian.PutUint32(buf[off+8:], uint32(i+1))
		binary.NativeEndian.PutUint32(buf[off+12:], 0)
		copy(buf[off+hdrLen:], m.Data)
		off += align(n)
	}
	return buf
}

// send writes buf to the kernel in one sendmsg on c's socket.
func send(c *netlink.Conn, buf []byte) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	err = rc.Write(func(fd uintptr) bool {
		sendErr = unix.Sendto(int(fd), buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return sendErr != unix.EAGAIN
	})
	return errors.Join(err, sendErr)
}

// dial opens a netfilter netlink socket in the namespace netns.
func dial(netns nsexec.NS) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns.FD()})
	if err != nil {
		return nil, fmt.Errorf("nft: netlink socket: %w", err)
	}
	return c, nil
}
