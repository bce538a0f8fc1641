package text

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCut(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"a longer message", 10, "a longe..."},
		{"ééééé", 6, "é..."}, // never half a rune
		{"abc", 2, "..."},
	} {
		got := Cut(tc.in, tc.n)
		if got != tc.want || !utf8.ValidString(got) {
			t.Errorf("Cut(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
	long := strings.Repeat("x", 100000)
	if got := Cut(long, MaxMessage); len(got) != MaxMessage {
		t.Errorf("Cut of 100000 bytes is %d bytes, want %d", len(got), MaxMessage)
	}
}

func TestList(t *testing.T) {
	items := []string{"a", "b", "c", "d", "e"}
	if got, want := List(items, "; ", 3), "a; b; c; and 2 more"; got != want {
		t.Errorf("List = %q, want %q", got, want)
	}
	if got, want := List(items[:3], ", ", 3), "a, b, c"; got != want {
		t.Errorf("List = %q, want %q", got, want)
	}
	if got := List(nil, ", ", 3); got != "" {
		t.Errorf("List(nil) = %q", got)
	}
}
