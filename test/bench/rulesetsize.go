package bench

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// RulesetSize is what `nft list ruleset` shows in a node namespace once a
// program has synced: the length of the listing, and where the bytes go.
// It compares the two programs' tables as a user sees them; what the
// kernel holds for the same objects is measured apart, at the end of a
// run (rulesetKernelMemory).
type RulesetSize struct {
	// Bytes is the length of the whole listing (every table of every
	// family: in nftables mode, the program's own tables).
	Bytes int
	// Chains, Rules, Sets (named sets and maps) and Elements (of named
	// sets and maps) count the objects listed; AnonElements counts the
	// elements of anonymous sets and maps written inside rules
	// ("{ 0 : 10.0.0.1 . 80, ... }").
	Chains, Rules, Sets, Elements, AnonElements int
	// RuleBytes, ElementBytes and OtherBytes split Bytes: the rule lines
	// (anonymous sets included), the element lists of named sets and
	// maps, and the rest (table, chain and set headers, blank lines).
	RuleBytes, ElementBytes, OtherBytes int
}

// MeasureRuleset runs `nft list ruleset` in ns, writes the listing to
// the file save (kept with the run's logs), and sizes it.
func MeasureRuleset(ctx context.Context, ns nsexec.NS, save string) (RulesetSize, error) {
	out, err := ns.Output(ctx, nil, "nft", "list", "ruleset")
	if err != nil {
		return RulesetSize{}, fmt.Errorf("nft list ruleset: %w", err)
	}
	if err := os.WriteFile(save, out, 0o644); err != nil {
		return RulesetSize{}, err
	}
	return SizeRuleset(string(out)), nil
}

// SizeRuleset sizes a listing in nft's syntax (`nft list ruleset`).
func SizeRuleset(listing string) RulesetSize {
	rs := RulesetSize{Bytes: len(listing)}
	var block string    // "chain", "set", "map" or "" (table level)
	inElements := false // inside a named set's "elements = { ... }"
	for _, line := range strings.SplitAfter(listing, "\n") {
		s := strings.TrimSpace(line)
		switch {
		case inElements:
			rs.ElementBytes += len(line)
			rs.Elements += countElements(s)
			inElements = !strings.HasSuffix(s, "}")
		case strings.HasPrefix(s, "elements = {"):
			rs.ElementBytes += len(line)
			rs.Elements += countElements(strings.TrimPrefix(s, "elements = {"))
			inElements = !strings.HasSuffix(s, "}")
		case strings.HasSuffix(s, "{") && (strings.HasPrefix(s, "chain ") || strings.HasPrefix(s, "set ") || strings.HasPrefix(s, "map ")):
			block = s[:strings.IndexByte(s, ' ')]
			if block == "chain" {
				rs.Chains++
			} else {
				rs.Sets++
			}
			rs.OtherBytes += len(line)
		case s == "}":
			block = ""
			rs.OtherBytes += len(line)
		case block == "chain" && s != "" && !strings.HasPrefix(s, "type ") && !strings.HasPrefix(s, "comment "):
			rs.Rules++
			rs.RuleBytes += len(line)
			if i := strings.IndexByte(s, '{'); i >= 0 {
				rs.AnonElements += countElements(s[i+1:])
			}
		default:
			rs.OtherBytes += len(line)
		}
	}
	return rs
}

// countElements counts the elements in the part of an element list on
// one line: its commas, plus one for the list's last element when the
// line closes the list. nft ends every line but the last with a comma.
func countElements(s string) int {
	if end := strings.IndexByte(s, '}'); end >= 0 {
		s = s[:end]
		if strings.TrimSpace(s) == "" {
			return 0
		}
		return strings.Count(s, ",") + 1
	}
	return strings.Count(s, ",")
}

// String is the size in MB with the objects behind it.
func (r RulesetSize) String() string {
	return fmt.Sprintf("%.2f MB (rules %.2f MB, elements %.2f MB; %d chains, %d rules, %d sets and maps with %d elements, %d elements in rules)",
		mb(r.Bytes), mb(r.RuleBytes), mb(r.ElementBytes), r.Chains, r.Rules, r.Sets, r.Elements, r.AnonElements)
}

func mb(b int) float64 { return float64(b) / 1e6 }
