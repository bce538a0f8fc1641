// Command testsummary reads `go test -json` on stdin and prints what a person
// needs from a long test run: each package's result line, the full output of
// every failed test, every skip with its reason (a skip is never silent), and
// one closing line "N passed, N failed, N skipped". It exits non-zero when a
// test or a package failed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func main() {
	outputs := map[string]*strings.Builder{}
	var passed, failed, skipped int
	var failedNames, skips []string
	pkgFailed := false

	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Println(sc.Text()) // build errors and other plain lines
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if e.Test == "" {
				// Package-level lines: result lines and build failures.
				if strings.HasPrefix(e.Output, "ok ") || strings.HasPrefix(e.Output, "FAIL") ||
					strings.HasPrefix(e.Output, "---") || strings.Contains(e.Output, "[no test files]") ||
					strings.Contains(e.Output, "panic:") || strings.Contains(e.Output, ".go:") {
					fmt.Print(e.Output)
				}
				continue
			}
			b, ok := outputs[key]
			if !ok {
				b = &strings.Builder{}
				outputs[key] = b
			}
			b.WriteString(e.Output)
		case "pass":
			if e.Test != "" {
				passed++
				delete(outputs, key)
			}
		case "skip":
			if e.Test != "" {
				skipped++
				skips = append(skips, fmt.Sprintf("%s %s: %s", e.Package, e.Test, skipReason(outputs[key])))
				delete(outputs, key)
			}
		case "fail":
			if e.Test == "" {
				pkgFailed = true
				continue
			}
			failed++
			failedNames = append(failedNames, key)
			if b := outputs[key]; b != nil {
				fmt.Print(b.String())
			}
			delete(outputs, key)
		}
	}
	if len(skips) > 0 {
		fmt.Println("\nSkipped tests:")
		for _, s := range skips {
			fmt.Println("  " + s)
		}
	}
	if len(failedNames) > 0 {
		fmt.Println("\nFailed tests:")
		for _, n := range failedNames {
			fmt.Println("  " + n)
		}
	}
	fmt.Printf("\n%d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if failed > 0 || pkgFailed {
		os.Exit(1)
	}
}

// skipReason picks the t.Skip message out of a skipped test's output.
func skipReason(b *strings.Builder) string {
	if b == nil {
		return "(no reason given)"
	}
	var reason []string
	for _, line := range strings.Split(b.String(), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "=== ") || strings.HasPrefix(line, "--- SKIP") {
			continue
		}
		reason = append(reason, line)
	}
	if len(reason) == 0 {
		return "(no reason given)"
	}
	return strings.Join(reason, " ")
}
