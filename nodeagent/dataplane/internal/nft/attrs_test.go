package nft

import (
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// attr encodes one netlink attribute, padded to 4 bytes.
func attr(typ uint16, val []byte) []byte {
	b := binary.NativeEndian.AppendUint16(nil, uint16(unix.NLA_HDRLEN+len(val)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// message encodes one netlink message of type typ, flags and sequence
// number seq around payload.
func message(typ, flags uint16, seq uint32, payload []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(unix.NLMSG_HDRLEN+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// TestAttrsWalk: the walker gives each attribute's type without the
// nested flag, its value without padding, nested lists, NUL-terminated
// strings and big-endian numbers, in place.
func TestAttrsWalk(t *testing.T) {
	inner := append(attr(1, []byte("ab\x00")), attr(2, []byte{0, 0, 1, 2})...)
	b := append(attr(unix.NLA_F_NESTED|7, inner), attr(3, []byte{9})...)
	a := newAttrs(b)
	if !a.next() || a.typ != 7 {
		t.Fatalf("first attribute: type %d, err %v; want 7", a.typ, a.err)
	}
	n := a.nested()
	var s string
	var v uint32
	for n.next() {
		switch n.typ {
		case 1:
			s = n.str()
		case 2:
			v = n.be32()
		}
	}
	if s != "ab" || v != 0x0102 || n.err != nil {
		t.Errorf("nested: string %q, number %#x, err %v; want \"ab\", 0x102", s, v, n.err)
	}
	if !a.next() || a.typ != 3 || len(a.val) != 1 || a.val[0] != 9 {
		t.Errorf("second attribute: type %d, value %v; want 3, [9]", a.typ, a.val)
	}
	if a.next() || a.err != nil {
		t.Errorf("walk past the end: err %v", a.err)
	}
	if got := (&attrs{val: []byte{1}}).be32(); got != 0 {
		t.Errorf("be32 of one byte = %d, want 0", got)
	}
}

// TestAttrsMalformed: an attribute longer than what is left, or shorter
// than its header, ends the walk with an error, and a nested walk's
// error becomes its parent's.
func TestAttrsMalformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"longer than the rest":  attr(1, []byte{1, 2, 3, 4})[:6],
		"shorter than a header": {2, 0, 1, 0},
		"a stray byte":          append(attr(1, nil), 0),
	} {
		a := newAttrs(b)
		for a.next() {
		}
		if a.err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	a := newAttrs(attr(unix.NLA_F_NESTED|1, []byte{9, 0, 1, 0}))
	a.next()
	n := a.nested()
	for n.next() {
	}
	a.nestedErr(&n)
	if a.err == nil || a.next() {
		t.Errorf("a malformed nested list left its parent without error (%v)", a.err)
	}
}

// TestEachAnswer: eachAnswer reads the messages of its request only,
// gives fn the attributes after struct nfgenmsg, and ends the answer at
// a dump's closing message, at a message outside a dump, and at an error
// report, which it returns as the errno it carries.
func TestEachAnswer(t *testing.T) {
	body := func(v byte) []byte { return append([]byte{2, 0, 0, 0}, attr(1, []byte{v})...) }
	var got []byte
	fn := func(a *attrs) {
		for a.next() {
			got = append(got, a.val[0])
		}
	}

	batch := append(message(16, unix.NLM_F_MULTI, 7, body(1)), message(16, unix.NLM_F_MULTI, 6, body(9))...)
	batch = append(batch, message(16, unix.NLM_F_MULTI, 7, body(2))...)
	if done, err := eachAnswer(batch, 7, fn); done || err != nil || string(got) != "\x01\x02" {
		t.Errorf("dump batch: done %v, err %v, values %v; want not done, [1 2] (sequence 6 skipped)", done, err, got)
	}

	got = nil
	batch = append(message(16, unix.NLM_F_MULTI, 7, body(3)), message(unix.NLMSG_DONE, unix.NLM_F_MULTI, 7, []byte{0, 0, 0, 0})...)
	if done, err := eachAnswer(batch, 7, fn); !done || err != nil || string(got) != "\x03" {
		t.Errorf("last batch: done %v, err %v, values %v; want done, [3]", done, err, got)
	}

	got = nil
	if done, err := eachAnswer(message(16, 0, 7, body(4)), 7, fn); !done || err != nil || string(got) != "\x04" {
		t.Errorf("single answer: done %v, err %v, values %v; want done, [4]", done, err, got)
	}

	enoent := -int32(unix.ENOENT)
	report := binary.NativeEndian.AppendUint32(nil, uint32(enoent))
	if done, err := eachAnswer(message(unix.NLMSG_ERROR, 0, 7, report), 7, fn); !done || !errors.Is(err, unix.ENOENT) {
		t.Errorf("error report: done %v, err %v; want done, ENOENT", done, err)
	}

	if done, err := eachAnswer(message(16, 0, 7, body(5))[:10], 7, fn); !done || err == nil {
		t.Errorf("truncated message: done %v, err %v; want done and an error", done, err)
	}
	bad := append([]byte{2, 0, 0, 0}, 9, 0, 1, 0)
	if done, err := eachAnswer(message(16, unix.NLM_F_MULTI, 7, bad), 7, fn); !done || err == nil {
		t.Errorf("malformed attribute: done %v, err %v; want done and an error", done, err)
	}
}
