package cleanup

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// iptablesPlan is what to remove from one iptables-save dump: per table,
// the rules to delete from chains that stay (as -D lines) and the chains
// to flush and delete.
type iptablesPlan struct {
	tables []*tablePlan
}

type tablePlan struct {
	name   string
	delete []string // "-D CHAIN ..." lines
	chains []string // chains to flush, then delete
}

// empty says whether there is nothing to remove.
func (p *iptablesPlan) empty() bool {
	for _, t := range p.tables {
		if len(t.delete) > 0 || len(t.chains) > 0 {
			return false
		}
	}
	return true
}

// script renders the plan as iptables-restore --noflush input: in each
// table, first the rules that jump to the chains, then the chains are
// flushed (dropping their jumps to each other), then deleted.
func (p *iptablesPlan) script() []byte {
	var b bytes.Buffer
	for _, t := range p.tables {
		if len(t.delete) == 0 && len(t.chains) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", t.name)
		for _, d := range t.delete {
			b.WriteString(d + "\n")
		}
		for _, c := range t.chains {
			fmt.Fprintf(&b, "-F %s\n", c)
		}
		for _, c := range t.chains {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}

// describe lists the plan's objects, one line each, for the report.
func (p *iptablesPlan) describe(where string) []string {
	var out []string
	for _, t := range p.tables {
		for _, c := range t.chains {
			out = append(out, fmt.Sprintf("%s table %s chain %s", where, t.name, c))
		}
		for _, d := range t.delete {
			out = append(out, fmt.Sprintf("%s table %s rule %s", where, t.name, "-A"+strings.TrimPrefix(d, "-D")))
		}
	}
	return out
}

// planIPTables finds, in iptables-save output, the chains names owns and
// the rules of other chains that jump to them (or, with names.RuleComment,
// carry a comment it owns).
func planIPTables(save []byte, names *Names) *iptablesPlan {
	p := &iptablesPlan{}
	var cur *tablePlan
	owned := map[string]bool{}
	var rules [][2]string // chain, rule text after "-A "
	flush := func() {
		if cur == nil {
			return
		}
		for _, r := range rules {
			chain, spec := r[0], r[1]
			if owned[chain] {
				continue
			}
			if t := jumpTarget(spec); (t != "" && owned[t]) || (names.RuleComment != nil && names.RuleComment(commentOf(spec))) {
				cur.delete = append(cur.delete, "-D "+chain+" "+strings.TrimPrefix(strings.TrimPrefix(spec, chain), " "))
			}
		}
		p.tables = append(p.tables, cur)
	}
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "*"):
			flush()
			cur = &tablePlan{name: line[1:]}
			owned = map[string]bool{}
			rules = nil
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if names.Chain != nil && names.Chain(cur.name, name) {
				owned[name] = true
				cur.chains = append(cur.chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			rest := line[3:]
			chain, _, _ := strings.Cut(rest, " ")
			rules = append(rules, [2]string{chain, rest})
		}
	}
	flush()
	return p
}

// tokens splits an iptables-save rule into words, keeping quoted strings
// (with their quotes removed) as one word.
func tokens(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, escaped, has := false, false, false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && inQuote:
			escaped = true
		case r == '"':
			inQuote = !inQuote
			has = true
		case r == ' ' && !inQuote:
			if has || cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteRune(r)
		}
	}
	if has || cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// jumpTarget is the chain a rule jumps or goes to ("" if none).
func jumpTarget(spec string) string {
	t := tokens(spec)
	for i := 0; i+1 < len(t); i++ {
		if t[i] == "-j" || t[i] == "-g" || t[i] == "--jump" || t[i] == "--goto" {
			return t[i+1]
		}
	}
	return ""
}

// commentOf is a rule's -m comment text ("" if none).
func commentOf(spec string) string {
	t := tokens(spec)
	for i := 0; i+1 < len(t); i++ {
		if t[i] == "--comment" {
			return t[i+1]
		}
	}
	return ""
}
