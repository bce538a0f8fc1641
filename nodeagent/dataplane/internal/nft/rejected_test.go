package nft

import (
	"encoding/binary"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// describeMessage names what each message of a transaction does, read
// from the encoding the kernel receives: the library's messages and the
// ones written straight into the batch (rules, elements); messageNumbered
// finds each by its sequence number and counts the batch's messages.
func TestDescribeMessages(t *testing.T) {
	table := &nftables.Table{Name: "proxyshift", Family: nftables.TableFamilyIPv6}
	set := &nftables.Set{Name: "service-endpoints-0", Table: table, KeyType: nftables.TypeInteger}
	txn := NewTxn(0)
	txn.Conn().AddTable(table)
	txn.Conn().AddChain(&nftables.Chain{Name: "services", Table: table})
	if err := AddRule(txn, table, "services", NewRule(IPv6).FibLocal("daddr").Drop().Rule().Exprs); err != nil {
		t.Fatal(err)
	}
	txn.Conn().AddRule(&nftables.Rule{Table: table, Chain: &nftables.Chain{Name: "c", Table: table}, Exprs: []expr.Any{&expr.Counter{}}})
	if err := AddElements(txn, set, identity, []Element{{Key: []byte{0, 0, 0, 1}}, {Key: []byte{0, 0, 0, 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := DeleteElements(txn, set, identity, []Element{{Key: []byte{0, 0, 0, 1}}}); err != nil {
		t.Fatal(err)
	}
	// Two ranges of an interval map: nft lists two elements, the batch
	// holds four (each range's end is an element flagged as one).
	ranges := &nftables.Set{Name: "service-endpoints-1", Table: table, KeyType: nftables.TypeInteger, Interval: true, IsMap: true}
	if err := AddElements(txn, ranges, identity, []Element{{Key: []byte{0, 0, 0, 0}, Data: []byte{1}}, {Key: []byte{0, 0, 0x80, 0}, Data: []byte{2}}}); err != nil {
		t.Fatal(err)
	}
	txn.Conn().DelChain(&nftables.Chain{Name: "old", Table: table})
	txn.Conn().DelSet(&nftables.Set{Name: "gone", Table: table})
	txn.Conn().DelTable(table)
	if err := txn.Encode(); err != nil { // as Commit does before it sends
		t.Fatal(err)
	}
	batch := txn.framed()
	want := []string{
		"add table ip6 proxyshift",
		"add chain ip6 proxyshift services",
		"add rule to chain ip6 proxyshift services (expressions: fib, cmp, immediate)",
		"add rule to chain ip6 proxyshift c (expressions: counter)",
		"add 2 elements to set ip6 proxyshift service-endpoints-0",
		"delete 1 element from set ip6 proxyshift service-endpoints-0",
		"add 2 elements to set ip6 proxyshift service-endpoints-1",
		"delete chain ip6 proxyshift old",
		"delete set ip6 proxyshift gone",
		"delete table ip6 proxyshift",
	}
	for i, w := range want {
		seq := uint32(i + 2) // the batch's begin message is 1
		msg, index, count := messageNumbered(batch, seq)
		if msg == nil || index != i+1 || count != len(want) {
			t.Fatalf("message %d: found %v at %d of %d, want at %d of %d", seq, msg != nil, index, count, i+1, len(want))
		}
		if got := describeMessage(msg); got != w {
			t.Errorf("message %d: %q, want %q", index, got, w)
		}
	}
	if msg, _, _ := messageNumbered(batch, 99); msg != nil {
		t.Error("a sequence number the batch does not hold was found")
	}
}

// rejection reads the kernel's error report: the refused message's
// number, the errno, and the text that follows the quoted message when
// the report has attributes; an acknowledgement is errno 0.
func TestRejection(t *testing.T) {
	report := func(code int32, quoted []byte, text string) []byte {
		b := binary.NativeEndian.AppendUint32(nil, uint32(code))
		b = append(b, quoted...)
		if text != "" {
			attr := binary.NativeEndian.AppendUint16(nil, uint16(4+len(text)+1))
			attr = binary.NativeEndian.AppendUint16(attr, unix.NLMSGERR_ATTR_MSG)
			attr = append(attr, text...)
			attr = append(attr, 0)
			for len(attr)%4 != 0 {
				attr = append(attr, 0)
			}
			b = append(b, attr...)
		}
		return b
	}
	quoted := appendMessage(nil, batchMessage(unix.NFNL_MSG_BATCH_BEGIN), 7)
	header := quoted[:nlmsgHdrLen]
	for _, c := range []struct {
		name     string
		flags    uint16
		body     []byte
		seq      uint32
		errno    unix.Errno
		wantText string
	}{
		{"acknowledgement", 0, report(0, header, ""), 7, 0, ""},
		{"errno only", 0, report(-int32(unix.ENOENT), quoted, ""), 7, unix.ENOENT, ""},
		{"quoted message and text", unix.NLM_F_ACK_TLVS, report(-int32(unix.EINVAL), quoted, "bad thing"), 7, unix.EINVAL, "bad thing"},
		{"capped and text", unix.NLM_F_ACK_TLVS | unix.NLM_F_CAPPED, report(-int32(unix.EOPNOTSUPP), header, "no such expression"), 7, unix.EOPNOTSUPP, "no such expression"},
		{"too short", 0, []byte{1, 2}, 0, 0, ""},
	} {
		seq, errno, text := rejection(c.flags, c.body)
		if seq != c.seq || errno != c.errno || text != c.wantText {
			t.Errorf("%s: %d, %v, %q; want %d, %v, %q", c.name, seq, errno, text, c.seq, c.errno, c.wantText)
		}
	}
}
