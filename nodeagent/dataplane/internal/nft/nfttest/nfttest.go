// Package nfttest compares a table as the backends dump it (their golden
// files) with the table as `nft list table` shows it once programmed, so
// that a golden file is checked against what the kernel holds, not only
// against the code that wrote it. It is imported by tests only.
//
// The two texts say the same in a few different spellings, which
// Canonical rewrites to one:
//
//   - nft separates objects with blank lines, writes a set's elements on
//     one line (wrapping long lists) in the kernel's order, and puts an
//     element's comment between its key and its value; the dumps write
//     one element a line, sorted, comment last;
//   - nft names base-chain priorities after the standard ones ("dstnat -
//     10"), writes timeouts in the largest unit ("1h"), shows the default
//     size of sets the packet path fills ("size 65535"), writes "== 0" of
//     a masked mark as "== 0x00000000", and leaves out a match it treats
//     as implied ("meta l4proto tcp" before "reject with tcp reset").
//
// Everything else must be the same, word for word.
package nfttest

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// List returns `nft list table family name` run in network namespace ns.
// Without the nft tool (the test VM has none) it skips the test, naming
// what is missing.
func List(t testing.TB, ns nsexec.NS, family, name string) string {
	t.Helper()
	if _, err := nsexec.LookPath("nft"); err != nil {
		t.Skipf("needs nft (Debian package nftables): %v", err)
	}
	out, err := ns.Output(context.Background(), nil, "nft", "list", "table", family, name)
	if err != nil {
		t.Fatalf("nft list table %s %s: %v", family, name, err)
	}
	return string(out)
}

// Equal fails the test when the table nft listed and the dump say
// different things, showing the lines that differ.
func Equal(t testing.TB, what, listed, dumped string) {
	t.Helper()
	equal(t, what, Canonical(listed), Canonical(dumped))
}

// EqualChains is Equal for the chains only, for a dump that does not
// write the sets.
func EqualChains(t testing.TB, what, listed, dumped string) {
	t.Helper()
	equal(t, what, chainsOnly(Canonical(listed)), chainsOnly(Canonical(dumped)))
}

func equal(t testing.TB, what, listed, dumped string) {
	t.Helper()
	if listed != dumped {
		t.Errorf("%s: the kernel holds something else than the dump; in the dump only (-), in the kernel only (+):\n%s", what, dataplanetest.LineDiff(dumped, listed))
	}
}

// chainsOnly keeps the table line and the chains of a canonical text.
func chainsOnly(canonical string) string {
	var b strings.Builder
	keep := true
	for i, l := range strings.SplitAfter(canonical, "\n") {
		if i > 0 && !strings.HasPrefix(l, "\t") {
			keep = strings.HasPrefix(l, "chain ")
		}
		if keep {
			b.WriteString(l)
		}
	}
	return b.String()
}

// block is one set, map or chain: its header line and its body lines.
type block struct {
	head string
	body []string
}

// Canonical rewrites tables, as nft lists them or as a dump writes them,
// to one spelling: each table (in the order given) one object a block,
// blocks sorted by kind and name, a set's elements one a line and sorted.
func Canonical(text string) string {
	var b strings.Builder
	lines := strings.SplitAfter(text, "\n")
	start := 0
	for i := 1; i <= len(lines); i++ {
		if i == len(lines) || strings.HasPrefix(strings.TrimSpace(lines[i]), "table ") {
			b.WriteString(canonicalTable(strings.Join(lines[start:i], "")))
			start = i
		}
	}
	return b.String()
}

// canonicalTable is Canonical for one table.
func canonicalTable(text string) string {
	var blocks []block
	var cur *block
	var table string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case l == "" || l == "}":
			continue
		case strings.HasPrefix(l, "table "):
			table = l
		case strings.HasPrefix(l, "set ") || strings.HasPrefix(l, "map ") || strings.HasPrefix(l, "chain "):
			blocks = append(blocks, block{head: strings.TrimSuffix(l, " {")})
			cur = &blocks[len(blocks)-1]
		case strings.HasPrefix(l, "elements = {"):
			// Up to the closing brace, on this line or a later one.
			all := strings.TrimPrefix(l, "elements = {")
			for !strings.HasSuffix(strings.TrimSpace(all), "}") && i+1 < len(lines) {
				i++
				all += " " + strings.TrimSpace(lines[i])
			}
			all = strings.TrimSuffix(strings.TrimSpace(all), "}")
			var elems []string
			for _, e := range splitElements(all) {
				elems = append(elems, "element "+element(e))
			}
			slices.Sort(elems)
			cur.body = append(cur.body, elems...)
		case cur != nil:
			if l = statement(l); l != "" {
				cur.body = append(cur.body, l)
			}
		}
	}
	slices.SortFunc(blocks, func(a, b block) int { return strings.Compare(a.head, b.head) })
	var b strings.Builder
	b.WriteString(strings.TrimSuffix(table, " {") + "\n")
	for _, bl := range blocks {
		b.WriteString(bl.head + "\n")
		for _, l := range bl.body {
			b.WriteString("\t" + l + "\n")
		}
	}
	return b.String()
}

// splitElements splits an element list at the commas outside quotes.
func splitElements(s string) []string {
	var out []string
	start, quoted := 0, false
	for i, c := range s {
		switch {
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	out = append(out, s[start:])
	var elems []string
	for _, e := range out {
		if e = strings.TrimSpace(e); e != "" {
			elems = append(elems, e)
		}
	}
	return elems
}

var comment = regexp.MustCompile(` comment "[^"]*"`)

// element is one element, its comment last.
func element(e string) string {
	c := comment.FindString(e)
	return strings.TrimSpace(strings.Replace(e, c, "", 1)) + c
}

var (
	priority  = regexp.MustCompile(`priority (raw|mangle|dstnat|filter|security|srcnat)( ([+-]) (\d+))?;`)
	durations = regexp.MustCompile(`^timeout ((\d+[dhms])+)$`)
)

// standardPriorities are nft's names for the standard priorities of the
// ip and ip6 families.
var standardPriorities = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

// statement is one line of a set or chain other than its elements, in
// the dumps' spelling ("" to leave it out).
func statement(l string) string {
	if l == "size 65535" {
		return ""
	}
	if m := durations.FindStringSubmatch(l); m != nil {
		secs := 0
		for _, part := range regexp.MustCompile(`\d+[dhms]`).FindAllString(m[1], -1) {
			n, _ := strconv.Atoi(part[:len(part)-1])
			secs += n * map[byte]int{'d': 86400, 'h': 3600, 'm': 60, 's': 1}[part[len(part)-1]]
		}
		return fmt.Sprintf("timeout %ds", secs)
	}
	l = priority.ReplaceAllStringFunc(l, func(s string) string {
		m := priority.FindStringSubmatch(s)
		p := standardPriorities[m[1]]
		if m[2] != "" {
			n, _ := strconv.Atoi(m[4])
			if m[3] == "-" {
				n = -n
			}
			p += n
		}
		return fmt.Sprintf("priority %d;", p)
	})
	l = strings.ReplaceAll(l, "== 0x00000000", "== 0")
	if l == "reject with tcp reset" {
		l = "meta l4proto tcp reject with tcp reset"
	}
	return l
}
