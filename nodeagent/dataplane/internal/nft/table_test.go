package nft

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/google/nftables"
)

func identity(e *Element) Element { return *e }

// TestElementsFitTheirMessages queues many large elements and checks that
// each message's elements fit one netlink attribute, and that none is
// lost.
func TestElementsFitTheirMessages(t *testing.T) {
	var elems []Element
	for i := range 5000 {
		elems = append(elems, Element{Key: make([]byte, 12), Comment: strings.Repeat("x", 60), Verdict: GotoChain(strings.Repeat("c", 200) + fmt.Sprint(i))})
	}
	total, messages := 0, 0
	err := queueElements(&nftables.Set{Name: "m"}, elems, identity, func(_ *nftables.Set, kes []nftables.SetElement) error {
		size := 0
		for _, e := range kes {
			size += 64 + len(e.Key) + len(e.Comment) + len(e.VerdictData.Chain)
		}
		if size > maxElementBytes {
			t.Errorf("message of %d bytes of elements", size)
		}
		total += len(kes)
		messages++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total != len(elems) || messages < 2 {
		t.Errorf("%d messages hold %d elements, want more than one holding %d", messages, total, len(elems))
	}
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
