package nft

import (
	"encoding/binary"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Set elements are most of a large transaction (a full sync of 10 000
// services writes 100 000 endpoint elements), so they are encoded here,
// straight into the transaction's batch: google/nftables builds each
// element as a tree of attributes, marshalled level by level, several
// times the bytes the kernel receives (about 80 MB of garbage per full
// sync at 10k). The messages are the ones the library sends, byte for
// byte (TestElementMessagesAreTheLibrarys).

// maxElementBytes bounds the elements of one message: they travel in one
// netlink attribute, whose length field has 16 bits.
const maxElementBytes = 32 << 10

// AddElements queues the addition of the elements of pieces to set s
// on t, in as many messages as they need. elem reads a backend's element
// as nft's (the backends keep more in theirs, such as its text). The
// pieces let a backend write a set gathered from many owners without
// copying it into one slice first.
func AddElements[E any](t *Txn, s *nftables.Set, elem func(*E) Element, pieces ...[]E) error {
	return queueElements(t, s, unix.NFT_MSG_NEWSETELEM, elem, pieces)
}

// DeleteElements queues the deletion of the elements of pieces from set
// s on t, in as many messages as they need.
func DeleteElements[E any](t *Txn, s *nftables.Set, elem func(*E) Element, pieces ...[]E) error {
	return queueElements(t, s, unix.NFT_MSG_DELSETELEM, elem, pieces)
}

// queueElements appends the elements of pieces to t's batch in messages
// of type msgType (flagged NLM_F_CREATE, as the library does, also for
// deletions, where the kernel ignores it) of at most maxElementBytes of
// elements each. A range of a concatenation carries its last key
// (NFTA_SET_ELEM_KEY_END); any other interval is its first key and,
// flagged as the end of the interval, the first key after it, none when
// it runs to the end of the key space (intervalEnd).
func queueElements[E any](t *Txn, s *nftables.Set, msgType uint16, elem func(*E) Element, pieces [][]E) error {
	size := 0
	for _, elems := range pieces {
		for i := range elems {
			size += elem(&elems[i]).size()
		}
	}
	if size == 0 {
		return nil
	}
	// The library's messages queued so far come first.
	if err := t.Encode(); err != nil {
		return err
	}
	var end []byte // the interval end being built
	w := t.writer(size)
	msg, list, n := -1, 0, 0
	open := func() {
		msg = w.beginMessage(unix.NFNL_SUBSYS_NFTABLES<<8|msgType, netlink.Create, byte(s.Table.Family))
		w.putString(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
		w.putUint32(unix.NFTA_SET_ELEM_LIST_SET_ID, s.ID)
		w.putString(unix.NFTA_SET_ELEM_LIST_TABLE, s.Table.Name)
		list, n = w.beginNested(unix.NFTA_SET_ELEM_LIST_ELEMENTS), 0
	}
	closeMsg := func() {
		w.endNested(list)
		w.endMessage(msg)
		msg = -1
	}
	for _, elems := range pieces {
		for i := range elems {
			e := elem(&elems[i])
			if msg >= 0 && w.len()-list+e.size() > maxElementBytes {
				closeMsg()
			}
			if msg < 0 {
				open()
			}
			n++
			w.element(n, e, carriesKeyEnd(s), false)
			var ok bool
			if end, ok = intervalEnd(s, e, end[:0]); ok {
				n++
				w.element(n, Element{Key: end}, false, true)
			}
		}
	}
	closeMsg()
	t.wrote()
	return nil
}

// element appends the n-th element of a list: its key, its range end
// when keyEnd, the interval-end flag when intervalEnd, its data or
// verdict, and its comment.
func (w *writer) element(n int, e Element, keyEnd, intervalEnd bool) {
	item := w.beginNested(uint16(n))
	if intervalEnd {
		// The library sends the flags attribute marked nested; the kernel
		// reads it by its type alone.
		w.putUint32(unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	w.putValue(unix.NFTA_SET_ELEM_KEY, e.Key)
	if keyEnd && len(e.KeyEnd) > 0 {
		w.putValue(nftaSetElemKeyEnd, e.KeyEnd)
	}
	switch {
	case e.Verdict != nil:
		data := w.beginNested(unix.NFTA_SET_ELEM_DATA)
		verdict := w.beginNested(unix.NFTA_DATA_VERDICT)
		w.putUint32(unix.NFTA_VERDICT_CODE, uint32(int32(e.Verdict.Kind)))
		if e.Verdict.Chain != "" {
			w.putString(unix.NFTA_VERDICT_CHAIN, e.Verdict.Chain)
		}
		w.endNested(verdict)
		w.endNested(data)
	case len(e.Data) > 0:
		w.putValue(unix.NFTA_SET_ELEM_DATA, e.Data)
	}
	if e.Comment != "" {
		// User data: the comment as a type-length-value, NUL-terminated.
		w.b = binary.NativeEndian.AppendUint16(w.b, uint16(4+2+len(e.Comment)+1))
		w.b = binary.NativeEndian.AppendUint16(w.b, unix.NFTA_SET_ELEM_USERDATA)
		w.b = append(w.b, byte(userdata.NFTNL_UDATA_SET_ELEM_COMMENT), byte(len(e.Comment)+1))
		w.b = append(w.b, e.Comment...)
		w.b = append(w.b, 0)
		w.pad()
	}
	w.endNested(item)
}

// size is about how many bytes the element takes in a message, at least
// as many as it does.
func (e Element) size() int {
	n := 64 + len(e.Key) + len(e.KeyEnd) + len(e.Data) + len(e.Comment)
	if e.Verdict != nil {
		n += len(e.Verdict.Chain)
	}
	return n
}

// writer appends netlink messages and attributes to a batch buffer,
// numbering the messages from *seq on.
type writer struct {
	b   []byte
	seq *uint32
	// next, called before each message, may move the writer on to a
	// new buffer.
	next func()
}

// len is the buffer's length so far.
func (w *writer) len() int { return len(w.b) }

// beginMessage starts a message of type typ with flags (a request) and
// struct nfgenmsg for family, and returns where it starts.
func (w *writer) beginMessage(typ uint16, flags netlink.HeaderFlags, family byte) int {
	if w.next != nil {
		w.next()
	}
	off := len(w.b)
	w.b = binary.NativeEndian.AppendUint32(w.b, 0) // length, set by endMessage
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(netlink.Request|flags))
	w.b = binary.NativeEndian.AppendUint32(w.b, 0) // sequence, set by the Txn
	w.b = binary.NativeEndian.AppendUint32(w.b, 0) // port id
	w.b = append(w.b, family, unix.NFNETLINK_V0, 0, 0)
	return off
}

// endMessage sets the length and the sequence number of the message
// started at off.
func (w *writer) endMessage(off int) {
	*w.seq++
	binary.NativeEndian.PutUint32(w.b[off:], uint32(len(w.b)-off))
	binary.NativeEndian.PutUint32(w.b[off+8:], *w.seq)
}

// put appends attribute typ holding data, padded to 4 bytes.
func (w *writer) put(typ uint16, data []byte) {
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(4+len(data)))
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = append(w.b, data...)
	w.pad()
}

// putString appends attribute typ holding s, NUL-terminated.
func (w *writer) putString(typ uint16, s string) {
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(4+len(s)+1))
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = append(w.b, s...)
	w.b = append(w.b, 0)
	w.pad()
}

// putUint32 appends attribute typ holding v, big-endian.
func (w *writer) putUint32(typ uint16, v uint32) {
	w.b = binary.NativeEndian.AppendUint16(w.b, 8)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = binary.BigEndian.AppendUint32(w.b, v)
}

// putValue appends attribute typ (nested) holding v as NFTA_DATA_VALUE.
func (w *writer) putValue(typ uint16, v []byte) {
	off := w.beginNested(typ)
	w.put(unix.NFTA_DATA_VALUE, v)
	w.endNested(off)
}

// beginNested starts attribute typ, nested, and returns where it starts.
func (w *writer) beginNested(typ uint16) int {
	off := len(w.b)
	w.b = binary.NativeEndian.AppendUint16(w.b, 0)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ|unix.NLA_F_NESTED)
	return off
}

// endNested sets the length of the attribute started at off.
func (w *writer) endNested(off int) {
	binary.NativeEndian.PutUint16(w.b[off:], uint16(len(w.b)-off))
}

// pad aligns the buffer to netlink's 4 bytes.
func (w *writer) pad() {
	for len(w.b)%4 != 0 {
		w.b = append(w.b, 0)
	}
}
