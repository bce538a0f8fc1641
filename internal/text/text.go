// Package text bounds what proxyshift writes into status fields and
// Events. The API server refuses a condition message longer than 32768
// bytes (and an Event note over 1 kB) with a 422, and a status write that
// is refused once is refused every time it is retried: the status would
// freeze at its last accepted state while the error that made it long
// lasts. So a list of problems is cut to its first few items and a count,
// and a message to a fixed length, before it is written.
package text

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxMessage is the length status messages are cut to: far below the API
// server's 32768 bytes, so that a ProxyConfig quoting a few nodes'
// messages stays below it too, and still a full paragraph.
const MaxMessage = 2048

// Cut returns s cut to at most n bytes, at a rune boundary, ending in
// "..." when it was cut.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	end := max(n-3, 0)
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + "..."
}

// List joins the first max items with sep and says how many more there
// are: "a; b; c; and 7 more".
func List(items []string, sep string, max int) string {
	if len(items) <= max {
		return strings.Join(items, sep)
	}
	return strings.Join(items[:max], sep) + fmt.Sprintf("%sand %d more", sep, len(items)-max)
}
