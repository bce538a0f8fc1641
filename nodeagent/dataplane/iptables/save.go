package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// savedTable is one table as iptables-save prints it.
type savedTable struct {
	// chains lists every chain, in the order printed.
	chains []string
	// builtin holds the built-in chains (those with a policy).
	builtin map[string]bool
	// rules are each chain's rules, as the text after "-A <chain> ". A
	// table read over netlink has them only for some chains (see read).
	rules map[string][]string
	// counts are how many rules each chain has: in a table read over
	// netlink, only if the reader asked (see read).
	counts map[string]int
	// dnats are how many of each chain's rules DNAT (-j DNAT): each one
	// endpoint a chain chooses (Programmed's Endpoints). Like counts.
	dnats map[string]int
	// uses, in a table read over netlink (nft variant), are each chain's
	// use count: its rules plus the jumps to it (nft.Reader.EachChainUse).
	uses map[string]int
}

// savedTables are the tables of one iptables-save output, by name.
type savedTables map[string]*savedTable

// holdsOwned says whether the tables hold a chain of proxyshift's or a
// built-in chain's rule that leads into one.
func (ts savedTables) holdsOwned() bool {
	for _, t := range ts {
		for _, c := range t.chains {
			if owned(c) {
				return true
			}
			if !t.builtin[c] {
				continue
			}
			for _, spec := range t.rules[c] {
				if owned(target(spec)) {
					return true
				}
			}
		}
	}
	return false
}

// parseSave reads the output of iptables-save (or ip6tables-save).
func parseSave(out []byte) (savedTables, error) {
	tables := savedTables{}
	var t *savedTable
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case line == "" || line[0] == '#':
		case line[0] == '*':
			t = &savedTable{builtin: map[string]bool{}, rules: map[string][]string{}, counts: map[string]int{}, dnats: map[string]int{}}
			tables[line[1:]] = t
		case t == nil:
			return nil, fmt.Errorf("iptables-save line %d: %q outside a table", n, line)
		case line == "COMMIT":
			t = nil
		case line[0] == ':':
			name, policy, _ := strings.Cut(line[1:], " ")
			t.chains = append(t.chains, name)
			if !strings.HasPrefix(policy, "-") {
				t.builtin[name] = true
			}
		case strings.HasPrefix(line, "-A "):
			name, spec, _ := strings.Cut(line[3:], " ")
			t.rules[name] = append(t.rules[name], spec)
			t.counts[name]++
			if target(spec) == targetDNAT {
				t.dnats[name]++
			}
		default:
			return nil, fmt.Errorf("iptables-save line %d: unexpected %q", n, line)
		}
	}
	return tables, sc.Err()
}

// parseRules reads the output of iptables -S: each chain's rules, as the
// text after "-A <chain> ".
func parseRules(out []byte) (map[string][]string, error) {
	rules := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "-A "):
			name, spec, _ := strings.Cut(line[3:], " ")
			rules[name] = append(rules[name], spec)
		case line == "" || strings.HasPrefix(line, "-P ") || strings.HasPrefix(line, "-N ") || line[0] == '#':
		default:
			return nil, fmt.Errorf("line %d: unexpected %q", n, line)
		}
	}
	return rules, sc.Err()
}

// fields splits a rule's text into words as iptables-restore does:
// double quotes group, a backslash escapes the next character.
func fields(spec string) []string {
	var out []string
	var w strings.Builder
	inWord, quoted, escaped := false, false, false
	for _, r := range spec {
		switch {
		case escaped:
			w.WriteRune(r)
			escaped = false
		case r == '\\':
			escaped, inWord = true, true
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				out = append(out, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, w.String())
	}
	return out
}

// target returns the chain or target a rule jumps or goes to, "" if none.
func target(spec string) string {
	// Fast path: no quotes before the last -j, as in almost every rule.
	if i := strings.LastIndex(spec, " -j "); i >= 0 && !strings.Contains(spec[i:], `"`) {
		t, _, _ := strings.Cut(spec[i+4:], " ")
		return t
	}
	f := fields(spec)
	for i := len(f) - 2; i >= 0; i-- {
		if f[i] == "-j" || f[i] == "-g" {
			return f[i+1]
		}
	}
	return ""
}

// commentPort returns the service port a rule's comment names (its first
// word, if it has the namespace/name:port/PROTOCOL shape), "" if none.
func commentPort(spec string) string {
	i := strings.Index(spec, "--comment ")
	if i < 0 {
		return ""
	}
	f := fields(spec[i+len("--comment "):])
	if len(f) == 0 {
		return ""
	}
	id, _, _ := strings.Cut(f[0], " ")
	if !strings.Contains(id, "/") || !strings.Contains(id, ":") {
		return ""
	}
	return id
}
