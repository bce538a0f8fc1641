package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

func identity(e *Element) Element { return *e }

// batchMessages splits the messages a transaction has encoded so far,
// its begin message included.
func batchMessages(t *testing.T, txn *Txn) []netlink.Message {
	t.Helper()
	var out []netlink.Message
	for _, chunk := range txn.chunks {
		for p := 0; p < len(chunk); {
			n := int(binary.NativeEndian.Uint32(chunk[p:]))
			var m netlink.Message
			if err := m.UnmarshalBinary(chunk[p : p+n]); err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
			p += nlmsgAlign(n)
		}
	}
	return out
}

// elementLists returns, for each set-element message of msgs, the number
// of elements and the length of the attribute that holds them.
func elementLists(t *testing.T, msgs []netlink.Message) (counts, sizes []int) {
	t.Helper()
	for _, m := range msgs {
		if m.Header.Type&0xff != unix.NFT_MSG_NEWSETELEM {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for ad.Next() {
			if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			list := ad.Bytes()
			sizes = append(sizes, len(list))
			n := 0
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					n++
				}
				return nil
			})
			counts = append(counts, n)
		}
		if err := ad.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return counts, sizes
}

// TestElementsFitTheirMessages queues many large elements and checks that
// each message's elements fit one netlink attribute, and that none is
// lost.
func TestElementsFitTheirMessages(t *testing.T) {
	var elems []Element
	for i := range 5000 {
		elems = append(elems, Element{Key: make([]byte, 12), Comment: strings.Repeat("x", 60), Verdict: GotoChain(strings.Repeat("c", 200) + fmt.Sprint(i))})
	}
	txn := NewTxn(0)
	set := &nftables.Set{Name: "m", Table: &nftables.Table{Name: "t", Family: nftables.TableFamilyIPv4}}
	if err := AddElements(txn, set, identity, elems); err != nil {
		t.Fatal(err)
	}
	counts, sizes := elementLists(t, batchMessages(t, txn))
	total := 0
	for i, n := range counts {
		total += n
		if sizes[i] > maxElementBytes {
			t.Errorf("message %d holds %d bytes of elements", i+1, sizes[i])
		}
	}
	if total != len(elems) || len(counts) < 2 {
		t.Errorf("%d messages hold %d elements, want more than one holding %d", len(counts), total, len(elems))
	}
}

// TestElementMessagesAreTheLibrarys encodes elements of every kind the
// backends write (verdicts with and without a chain, data, comments,
// ranges of concatenations, intervals with and without an end element),
// added and deleted, and checks that the messages are google/nftables'
// for the same elements, byte for byte but for the sequence numbers and
// the acknowledgement the library asks for. Ours are given in pieces, an
// element each and an empty one, as a backend gathers a set from its
// owners: the messages are the same as for one slice.
func TestElementMessagesAreTheLibrarys(t *testing.T) {
	table := &nftables.Table{Name: "proxyshift", Family: nftables.TableFamilyIPv6}
	cases := []struct {
		name  string
		set   *nftables.Set
		elems []Element
	}{
		{"verdict map", &nftables.Set{Name: "service-ips", ID: 7, IsMap: true}, []Element{
			{Key: []byte{198, 19, 0, 1, 6, 0, 0, 80}, Verdict: GotoChain("service-ABCDEFGH-default/web/tcp/http")},
			{Key: []byte{198, 19, 0, 2, 17, 0, 0, 53}, Verdict: Drop, Comment: "default/dns/udp/dns"},
		}},
		{"set", &nftables.Set{Name: "cluster-ips"}, []Element{{Key: []byte{1, 2, 3, 4}}, {Key: []byte{5, 6, 7, 8}}}},
		{"interval data map", &nftables.Set{Name: "service-endpoints-0", IsMap: true, Interval: true}, []Element{
			{Key: []byte{0, 0, 0, 0}, KeyEnd: []byte{0, 0, 0x7f, 0xff}, Data: []byte{198, 18, 128, 1, 0x1f, 0x90, 0, 0}},
			{Key: []byte{0, 0, 0x80, 0}, KeyEnd: []byte{0, 0, 0x80, 0}, Data: []byte{198, 18, 128, 2, 0x1f, 0x90, 0, 0}},
			{Key: []byte{0xff, 0xff, 0xff, 0}, KeyEnd: []byte{0xff, 0xff, 0xff, 0xff}, Data: []byte{198, 18, 128, 3, 0x1f, 0x90, 0, 0}},
		}},
		{"interval set without ends", &nftables.Set{Name: "cluster-cidrs", Interval: true}, []Element{{Key: []byte{10, 0, 0, 0}, KeyEnd: []byte{10, 255, 255, 255}}, {Key: []byte{12, 0, 0, 1}}}},
		{"ranges of a concatenation", &nftables.Set{Name: "ranges", Interval: true, Concatenation: true}, []Element{
			{Key: []byte{1, 0, 0, 0, 2, 0, 0, 0}, KeyEnd: []byte{1, 0, 0, 0, 2, 0, 0, 9}, Comment: "a range"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.set.Table = table
			for _, add := range []bool{true, false} {
				txn := NewTxn(0)
				var err error
				library := librarysMessages(t, func(conn *nftables.Conn) error {
					if add {
						err = AddElements(txn, c.set, identity, inPieces(c.elems)...)
						return conn.SetAddElements(c.set, kernelElements(c.set, c.elems, identity))
					}
					err = DeleteElements(txn, c.set, identity, inPieces(c.elems)...)
					return conn.SetDeleteElements(c.set, kernelElements(c.set, c.elems, identity))
				})
				if err != nil {
					t.Fatal(err)
				}
				requireLibrarysMessages(t, fmt.Sprintf("add %v", add), batchMessages(t, txn)[1:], library)
			}
		})
	}
}

// librarysMessages are the messages google/nftables sends for what
// queue queues on its connection (a batch's begin and end left out).
func librarysMessages(t *testing.T, queue func(*nftables.Conn) error) []netlink.Message {
	t.Helper()
	var library []netlink.Message
	conn, _ := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil {
			return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}, nil
		}
		library = append(library, req[1:len(req)-1]...)
		return nil, nil
	}))
	if err := errors.Join(queue(conn), conn.Flush()); err != nil {
		t.Fatal(err)
	}
	return library
}

// requireLibrarysMessages checks that ours are the library's messages,
// byte for byte, but for the acknowledgement and the echo the library
// asks for, which a transaction never does (see Txn).
func requireLibrarysMessages(t *testing.T, what string, ours, library []netlink.Message) {
	t.Helper()
	if len(ours) != len(library) {
		t.Fatalf("%s: %d messages, the library's %d", what, len(ours), len(library))
	}
	for i, m := range ours {
		lm := library[i]
		if m.Header.Type != lm.Header.Type || m.Header.Flags != lm.Header.Flags&^(netlink.Acknowledge|netlink.Echo) {
			t.Errorf("%s: message %d: type %#x flags %#x, the library's %#x %#x", what, i, uint16(m.Header.Type), uint16(m.Header.Flags), uint16(lm.Header.Type), uint16(lm.Header.Flags))
		}
		if !bytes.Equal(m.Data, lm.Data) {
			t.Errorf("%s: message %d:\n ours      %x\n library's %x", what, i, m.Data, lm.Data)
		}
	}
}

// inPieces is elems with an empty piece first, then a piece per element.
func inPieces(elems []Element) [][]Element {
	pieces := [][]Element{nil}
	for i := range elems {
		pieces = append(pieces, elems[i:i+1])
	}
	return pieces
}

// TestIntervalElements checks how intervals reach the kernel: a range of
// a concatenation with its last key, any other interval with the first
// key after it as an end element, none at the end of the key space.
func TestIntervalElements(t *testing.T) {
	ranges := &nftables.Set{Interval: true, Concatenation: true}
	got := kernelElements(ranges, []Element{{Key: []byte{1, 0}, KeyEnd: []byte{1, 9}}}, identity)
	if len(got) != 1 || !bytes.Equal(got[0].KeyEnd, []byte{1, 9}) || got[0].IntervalEnd {
		t.Errorf("a range: %+v", got)
	}
	intervals := &nftables.Set{Interval: true}
	got = kernelElements(intervals, []Element{
		{Key: []byte{10, 0}, KeyEnd: []byte{10, 255}},
		{Key: []byte{12, 7}},
		{Key: []byte{255, 0}, KeyEnd: []byte{255, 255}},
	}, identity)
	want := []struct {
		key []byte
		end bool
	}{{[]byte{10, 0}, false}, {[]byte{11, 0}, true}, {[]byte{12, 7}, false}, {[]byte{12, 8}, true}, {[]byte{255, 0}, false}}
	if len(got) != len(want) {
		t.Fatalf("%d elements, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if !bytes.Equal(got[i].Key, w.key) || got[i].IntervalEnd != w.end {
			t.Errorf("element %d: key %v end %v, want %v %v", i, got[i].Key, got[i].IntervalEnd, w.key, w.end)
		}
	}
	plain := kernelElements(&nftables.Set{}, []Element{{Key: []byte{1}, Verdict: Drop}}, identity)
	if len(plain) != 1 || plain[0].VerdictData == nil || plain[0].VerdictData.Kind != Drop.Kind {
		t.Errorf("a verdict-map element: %+v", plain)
	}
}

// TestFewElementsTakeLittle checks that an endpoint change's few elements
// are written into a buffer of about their size, not into a chunk the
// size of a full sync's (1 MB of garbage for every change).
func TestFewElementsTakeLittle(t *testing.T) {
	txn := NewTxn(0)
	set := &nftables.Set{Name: "service-endpoints-3", Table: &nftables.Table{Name: "proxyshift", Family: nftables.TableFamilyIPv4}, IsMap: true, Interval: true}
	elems := []Element{{Key: []byte{0, 0, 0, 0}, KeyEnd: []byte{0, 0, 0xff, 0xff}, Data: []byte{198, 18, 128, 1, 0x1f, 0x90, 0, 0}}}
	if err := AddElements(txn, set, identity, elems); err != nil {
		t.Fatal(err)
	}
	if n := cap(txn.chunks[len(txn.chunks)-1]); n > 4096 {
		t.Errorf("one element took a buffer of %d bytes", n)
	}
}

// TestIntervalEndsShareOneAllocation checks that the kernel elements of
// an interval set (what a periodic resync compares, 100 000 endpoint
// elements at 10k services) cost a few allocations, not one per end key.
func TestIntervalEndsShareOneAllocation(t *testing.T) {
	intervals := &nftables.Set{Interval: true}
	var elems []Element
	for i := range 1000 {
		elems = append(elems, Element{Key: []byte{0, byte(i >> 8), byte(i), 0}, KeyEnd: []byte{0, byte(i >> 8), byte(i), 0xff}})
	}
	allocs := testing.AllocsPerRun(10, func() { kernelElements(intervals, elems, identity) })
	if allocs > 3 {
		t.Errorf("%v allocations for the kernel elements of %d intervals, want at most 3", allocs, len(elems))
	}
	got := kernelElements(intervals, elems, identity)
	if len(got) != 2*len(elems) || !bytes.Equal(got[1].Key, []byte{0, 0, 1, 0}) || !bytes.Equal(got[1999].Key, []byte{0, 3, 0xe8, 0}) || !got[1999].IntervalEnd {
		t.Errorf("%d elements; the first end %v, the last %v", len(got), got[1].Key, got[len(got)-1].Key)
	}
}
