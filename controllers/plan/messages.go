package plan

import (
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// The words of the conditions and events: each names the nodes, and the
// reasons they failed, that a person has to look at.

// firstFailure names the first node (by name) that failed other than in
// preflight, and how many more did.
func firstFailure(failed map[string]failedEntry) string {
	var ns []string
	for name, f := range failed {
		if !f.preflight {
			ns = append(ns, name)
		}
	}
	sort.Strings(ns)
	if len(ns) == 0 {
		return "a node failed"
	}
	s := fmt.Sprintf("node %s failed: %s", ns[0], failed[ns[0]].reason)
	if len(ns) > 1 {
		s += fmt.Sprintf(" (and %d more)", len(ns)-1)
	}
	return s
}

// failedSummary names up to three of ns with their reasons: the recorded
// one, else the node's own.
func failedSummary(ns []*nodeState, failed map[string]failedEntry) string {
	var parts []string
	for i, n := range ns {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(ns)-3))
			break
		}
		r := n.failReason
		if f, ok := failed[n.name]; ok {
			r = f.reason
		}
		parts = append(parts, n.name+": "+r)
	}
	return strings.Join(parts, "; ")
}

// conflictText says which nodes other ProxyConfigs select too (up to
// ten, with those configs) and what to do.
func conflictText(conflicts map[string][]string) string {
	var ns []string
	for n := range conflicts {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	var parts []string
	for i, n := range ns {
		if i == 10 {
			parts = append(parts, fmt.Sprintf("and %d more", len(ns)-10))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (also selected by %s)", n, strings.Join(conflicts[n], ", ")))
	}
	return fmt.Sprintf("%d nodes are selected by another ProxyConfig too and are left alone: %s; make the node selectors disjoint",
		len(ns), strings.Join(parts, ", "))
}

// strayText says which nodes the config answers for although it no
// longer selects them alone, and why they still matter.
func strayText(strays []*nodeState) string {
	return fmt.Sprintf("%d nodes this ProxyConfig moved are no longer selected by it alone and are still in transition (%s): "+
		"they count against maxUnavailable, and are watched and rolled back with this rollout, until they settle", len(strays), names(strays, 5))
}

// acknowledgementText says which Critical findings hold the rollout and
// how to let it go.
func acknowledgementText(fs []v1alpha1.Finding) string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, fmt.Sprintf("%s (%d: %s)", f.Code, f.Count, strings.Join(f.Objects[:min(len(f.Objects), 3)], ", ")))
	}
	return fmt.Sprintf("the rollout holds until spec.rollout.acknowledgedFindings lists the Critical findings %s; read status.findings for what changes and what to do",
		strings.Join(parts, ", "))
}

// names lists up to max of ns by name.
func names(ns []*nodeState, max int) string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.name
	}
	return nameList(out, max)
}

// nameList joins at most max names, saying how many more there are.
func nameList(ns []string, max int) string {
	if len(ns) > max {
		ns = append(ns[:max:max], fmt.Sprintf("and %d more", len(ns)-max))
	}
	return strings.Join(ns, ", ")
}

func equalTimes(a, b *metav1.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}
