package bench

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"
)

// The operator benchmark's targets (issue 17).
const (
	maxWritesPerNode = 3
	maxOperatorRSS   = 150_000_000 // bytes: 150 MB
)

// The controllers the operator runs (controllers.ControllerName,
// NodeControllerName, HandoverControllerName), in the report's order.
var operatorControllers = []struct{ name, does string }{
	{"proxyshift-operator", "plans and writes the rollout"},
	{"proxyshift-nodes", "gives every Node its ProxyNode"},
	{"proxyshift-handover", "stops and restarts kube-proxy per node"},
}

// Markdown renders the run as the section docs/benchmarks.md keeps.
func (r *OperatorResult) Markdown() string {
	var b bytes.Buffer
	p := r.Plan
	n := p.Nodes
	fmt.Fprintf(&b, "Measured on %s by `make bench` (`-operator-nodes %d`, %s wall): %s; at the start %s.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), n, r.Elapsed.Round(time.Second), machine(), r.LoadStart)
	fmt.Fprintf(&b, "The operator is `bin/proxyshift-operator` with its defaults but for `%s` (its own API user, the Lease's namespace outside a cluster, local ports, metrics over plain HTTP). ", strings.Join(r.Args[2:], " "))
	fmt.Fprintf(&b, "The ProxyConfig: `mode: nftables`, `rollout: {maxUnavailable: %s}`, the rest defaulted (a 1-node canary with no pause, nodeTimeout 5m, autoRollback). ", p.MaxUnavailable.String())
	fmt.Fprintf(&b, "Each simulated agent switches in %s plus up to %s.\n\n", p.SwitchTime, p.SwitchJitter)

	total := r.Writes.Total(true)
	maxNode, most := r.Writes.MaxPerNode()
	mean := float64(total) / float64(n)
	b.WriteString("| figure | value | target |\n| --- | --- | --- |\n")
	fmt.Fprintf(&b, "| install: operator started until every ProxyNode exists and its agent reported | %s | |\n", fmtDuration(r.Install))
	fmt.Fprintf(&b, "| rollout: ProxyConfig created until phase Completed (%s) | %s | |\n", r.Status.Nodes.Summary, fmtDuration(r.Rollout))
	fmt.Fprintf(&b, "| operator API writes per node, mean (%d writes but the Lease's / %d nodes) | %.2f | <= %d: %s |\n", total, n, mean, maxWritesPerNode, metText(mean <= maxWritesPerNode))
	fmt.Fprintf(&b, "| operator API writes to one node's objects (Node, ProxyNode), max (%s) | %d | <= %d: %s |\n", maxNode, most, maxWritesPerNode, metText(most <= maxWritesPerNode))
	fmt.Fprintf(&b, "| operator API writes refused (conflicts) | %d | |\n", r.Writes.Failed)
	fmt.Fprintf(&b, "| operator peak RSS (VmHWM) | %s (%.0f MB) | <= 150 MB: %s |\n", fmtMiB(r.PeakRSS), float64(r.PeakRSS)/1e6, metText(r.PeakRSS <= maxOperatorRSS))
	fmt.Fprintf(&b, "| operator peak Go heap in use (sampled every 2 s; its profile: `-keep`, %s) | %s | |\n", HeapProfileName, fmtMiB(int64(r.PeakHeap)))
	for _, c := range operatorControllers {
		rc := r.Reconciles[c.name]
		if rc == nil {
			continue
		}
		bound, beyond := rc.MaxBound()
		maxText := "<= " + fmtDuration(bound)
		if beyond {
			maxText = "> " + fmtDuration(bound)
		}
		fmt.Fprintf(&b, "| %s (%s): reconciles (errors) | %d (%d) | |\n", c.name, c.does, rc.Total, rc.Errors)
		fmt.Fprintf(&b, "| %s: reconcile time p50 / p99 / max / mean | %s / %s / %s / %s | p99 reported |\n", c.name,
			fmtDuration(rc.Quantile(0.5)), fmtDuration(rc.Quantile(0.99)), maxText, fmtDuration(rc.Mean()))
	}
	fmt.Fprintf(&b, "| simulated agents' status writes | %d | |\n", r.AgentWrites)

	b.WriteString("\nThe operator's writes, as the API server's audit log recorded them, before and after the ProxyConfig was created:\n\n")
	b.WriteString("| verb resource | before | after |\n| --- | --- | --- |\n")
	for _, k := range r.Writes.Kinds() {
		fmt.Fprintf(&b, "| %s | %d | %d |\n", k, r.Writes.Before[k], r.Writes.After[k])
	}
	return b.String()
}

// Section markers of the operator's part of docs/benchmarks.md.
const (
	operatorBegin = "<!-- make bench: operator begin -->"
	operatorEnd   = "<!-- make bench: operator end -->"
)

// WriteInto replaces the operator section of the Markdown file at path
// (between its markers, appended with them when missing).
func (r *OperatorResult) WriteInto(path string) error {
	return replaceSection(path, operatorBegin, operatorEnd, r.Markdown())
}

// replaceSection puts body between the begin and end markers of the file
// at path, appending the markers at its end when they are missing.
func replaceSection(path, begin, end, body string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	section := begin + "\n" + body + end
	doc := string(old)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i >= 0 && j > i {
		doc = doc[:i] + section + doc[j+len(end):]
	} else {
		doc = strings.TrimRight(doc, "\n") + "\n\n" + section + "\n"
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}
