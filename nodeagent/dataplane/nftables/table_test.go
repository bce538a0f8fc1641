package nftables

import (
	"bytes"
	"net/netip"
	"testing"
	"unsafe"

	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// TestElementParts: an element's key, range end, data and texts come
// back as they went in, whichever parts it has.
func TestElementParts(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		key, end, data       []byte
		keyText, dataText    string
		wantText, wantString string
	}{
		{name: "key", key: []byte{10, 0, 0, 1}, keyText: "10.0.0.1", wantString: "10.0.0.1"},
		{name: "range", key: []byte{10, 0, 0, 0}, end: []byte{10, 0, 0, 255}, keyText: "10.0.0.0/24", wantString: "10.0.0.0/24"},
		{name: "range and data", key: []byte{0, 0, 0, 1}, end: []byte{0, 0, 0, 9}, data: []byte{10, 0, 0, 1, 0, 80, 0, 0},
			keyText: "1-9", dataText: "10.0.0.1 . 80", wantString: "1-9 : 10.0.0.1 . 80"},
		{name: "data", key: []byte{0, 0, 0, 1}, data: []byte{10, 0, 0, 1, 0, 80, 0, 0},
			keyText: "1", dataText: "10.0.0.1 . 80", wantString: "1 : 10.0.0.1 . 80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newElement(tc.key, tc.end, tc.data, tc.keyText, tc.dataText)
			if !bytes.Equal(e.key(), tc.key) || !bytes.Equal(e.rangeEnd(), tc.end) || !bytes.Equal(e.data(), tc.data) {
				t.Errorf("parts %x / %x / %x, want %x / %x / %x", e.key(), e.rangeEnd(), e.data(), tc.key, tc.end, tc.data)
			}
			if (e.rangeEnd() == nil) != (tc.end == nil) || (e.data() == nil) != (tc.data == nil) {
				t.Errorf("range end %v and data %v: nil exactly when absent", e.rangeEnd(), e.data())
			}
			if e.keyText() != tc.keyText || e.String() != tc.wantString {
				t.Errorf("texts %q and %q, want %q and %q", e.keyText(), e.String(), tc.keyText, tc.wantString)
			}
			// A part's slice cannot grow into the next part.
			if k := e.key(); cap(k) != len(k) {
				t.Errorf("key has capacity %d beyond its %d bytes", cap(k), len(k))
			}
		})
	}
}

// TestEndpointElementsAreSmall: a full sync keeps 100 000 endpoint
// elements at 10 000 services; each is its struct, one allocation of
// bytes and one of text, and the struct stays within 72 bytes (it was
// 128 with a slice and a string per part).
func TestEndpointElementsAreSmall(t *testing.T) {
	if size := unsafe.Sizeof(element{}); size > 72 {
		t.Errorf("an element takes %d bytes, want at most 72", size)
	}
	eps := []model.Endpoint{
		{IP: netip.MustParseAddr("198.18.128.1"), Port: 8080, Ready: true},
		{IP: netip.MustParseAddr("198.18.128.2"), Port: 8080, Ready: true},
		{IP: netip.MustParseAddr("198.18.128.3"), Port: 8080, Ready: true},
	}
	var elems []element
	allocs := testing.AllocsPerRun(10, func() { elems = numgenRanges(ipv4, 5, eps) })
	if want := float64(1 + 2*len(eps)); allocs > want {
		t.Errorf("numgenRanges made %.0f allocations for %d endpoints, want at most %.0f", allocs, len(eps), want)
	}
	first := choiceKey(5)
	want := []string{
		itoaU(first) + "-" + itoaU(first+21844) + " : 198.18.128.1 . 8080",
		itoaU(first+21845) + "-" + itoaU(first+43689) + " : 198.18.128.2 . 8080",
		itoaU(first+43690) + "-" + itoaU(first+65535) + " : 198.18.128.3 . 8080",
	}
	for i, e := range elems {
		if e.String() != want[i] {
			t.Errorf("element %d is %q, want %q", i, e.String(), want[i])
		}
		if len(e.key()) != 4 || len(e.rangeEnd()) != 4 || len(e.data()) != 8 {
			t.Errorf("element %d: key, range end and data of %d, %d and %d bytes, want 4, 4 and 8", i, len(e.key()), len(e.rangeEnd()), len(e.data()))
		}
	}
}

func itoaU(u uint32) string { return itoa(int32(u)) }

// TestDistinctElements: an element listed twice by a read-back (a hash
// set's dump during the kernel's rehash) counts once; the same key in
// another set counts apart.
func TestDistinctElements(t *testing.T) {
	d := newDistinctElements()
	d.add(0, []byte{1, 2, 3, 4})
	d.add(0, []byte{1, 2, 3, 4})
	d.add(0, []byte{1, 2, 3, 5})
	d.add(1, []byte{1, 2, 3, 4})
	if got := d.count(); got != 3 {
		t.Errorf("count = %d, want 3", got)
	}
}

// TestPortKeepsTheModelsEndpoints: a rendered port keeps the model's
// endpoint array for its service-endpoints map, not elements made of it
// (12 MB at 10 000 services of 10 endpoints), and makes the same
// elements as numgenRanges when asked.
func TestPortKeepsTheModelsEndpoints(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	for _, sp := range dt.ManyPorts(3, 4) {
		objs := renderPort(ipv4, sp, np, 7)
		if len(objs.endpointChoices) != 1 {
			t.Fatalf("%s: %d endpoint choices, want the cluster one", sp.Name, len(objs.endpointChoices))
		}
		c := objs.endpointChoices[0]
		if len(c.eps) != 4 || &c.eps[0] != &sp.Endpoints[0] {
			t.Errorf("%s: the choice's endpoints are not the model's array", sp.Name)
		}
		want := numgenRanges(ipv4, 7<<1, sp.Endpoints)
		got := objs.endpointElems()
		if !elementsEqual(got, want) || objs.endpointElemCount() != len(want) {
			t.Errorf("%s: elements %v (count %d), want %v", sp.Name, got, objs.endpointElemCount(), want)
		}
	}
}
