package nftables

import (
	"bytes"
	"testing"
	"unsafe"
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

// TestElementsAreSmall: a full sync keeps the elements of the shared
// maps and the counted sets (about 20 000 at 10 000 services); each is
// its struct, one allocation of bytes and one of text, and the struct
// stays within 72 bytes (it was 128 with a slice and a string per part).
func TestElementsAreSmall(t *testing.T) {
	if size := unsafe.Sizeof(element{}); size > 72 {
		t.Errorf("an element takes %d bytes, want at most 72", size)
	}
}

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
