package plan

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/internal/text"
)

// maxFailedReason bounds each status.failedNodes reason (an agent's
// message): twenty of them stay a small status.
const maxFailedReason = 512

// progressingTrue are the stages in which nodes are being moved.
var progressingTrue = map[string]bool{
	ReasonPreflight: true, ReasonCanary: true, ReasonRollingOut: true,
	ReasonWaitingForNodes: true, ReasonRollingBack: true,
}

// finish writes the status: counts, failed nodes, conditions; the events
// that follow from comparing it with the previous status; and the requeue.
func (p *planner) finish() {
	st := &p.res.Status
	st.Phase = p.phase
	mode := p.cfg.Spec.Mode

	updated := 0
	for _, n := range p.nodes {
		if n.atTarget && n.converged {
			updated++
			if n.member && !n.rolledBack {
				p.res.Updated = append(p.res.Updated, n.name)
			}
		}
	}
	st.Nodes = v1alpha1.NodeCounts{
		Selected: int32(p.selected),
		Updated:  int32(updated),
		Ready:    int32(p.ready),
		Failed:   int32(len(p.failed)),
		Summary:  fmt.Sprintf("%d/%d", updated, p.selected),
	}

	// Failed nodes, sorted by name, at most MaxFailedNodes.
	var failedNames []string
	for name := range p.failed {
		failedNames = append(failedNames, name)
	}
	sort.Strings(failedNames)
	st.FailedNodes = nil
	for i, name := range failedNames {
		if i == v1alpha1.MaxFailedNodes {
			break
		}
		st.FailedNodes = append(st.FailedNodes, v1alpha1.FailedNode{Name: name, Reason: text.Cut(p.failed[name].reason, maxFailedReason)})
	}
	p.nodeFailedEvents(failedNames)

	// Conditions.
	counts := fmt.Sprintf("%d/%d selected nodes run %s", updated, p.selected, mode)
	var ready metav1.Condition
	if p.selected > 0 && updated == p.selected && p.stage != ReasonInvalidSpec {
		ready = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonAllNodesUpdated,
			Message: fmt.Sprintf("all %d selected nodes run %s", p.selected, mode)}
	} else {
		reason := p.stage
		switch reason {
		case ReasonCanary, ReasonRollingOut, ReasonWaitingForNodes:
			reason = ReasonInProgress
		case ReasonCompleted:
			reason = p.degraded
			if reason == "" {
				reason = ReasonNodeUnhealthy
			}
		}
		msg := counts
		if p.stageMsg != "" {
			msg += "; " + p.stageMsg
		}
		ready = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg}
	}
	prog := metav1.Condition{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: p.stage, Message: p.stageMsg}
	if progressingTrue[p.stage] {
		prog.Status = metav1.ConditionTrue
	}
	deg := metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ReasonAsExpected, Message: "no failed or conflicting nodes"}
	if p.degraded != "" {
		deg = metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: p.degraded, Message: p.degMsg}
	}
	st.Conditions = nil
	for _, c := range []metav1.Condition{ready, prog, deg} {
		c.ObservedGeneration = p.cfg.Generation
		c.Message = text.Cut(c.Message, text.MaxMessage)
		c.LastTransitionTime = p.nowT
		if old := meta.FindStatusCondition(p.prev.Conditions, c.Type); old != nil && old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		st.Conditions = append(st.Conditions, c)
	}

	// Conflict events when the set of conflicting nodes changes.
	if len(p.conflicts) > 0 {
		txt := p.conflictText()
		old := meta.FindStatusCondition(p.prev.Conditions, v1alpha1.ConditionDegraded)
		if old == nil || !strings.Contains(old.Message, txt) {
			p.event(true, EventConflict, "", txt)
		}
	}

	// Look again when the earliest timeout or pause ends.
	var next = p.now
	for _, d := range p.deadlines {
		if d.After(p.now) && (next.Equal(p.now) || d.Before(next)) {
			next = d
		}
	}
	if next.After(p.now) {
		p.res.RequeueAfter = next.Sub(p.now) + 50*time.Millisecond // just past the deadline
	}
}

// nodeFailedEvents records NodeFailed for node failures not in the
// previous status. The previous list is sorted and cut at MaxFailedNodes,
// so a name after its last entry may simply have been cut: skip those.
func (p *planner) nodeFailedEvents(failedNames []string) {
	prev := map[string]bool{}
	last := ""
	for _, f := range p.prev.FailedNodes {
		prev[f.Name] = true
		if f.Name > last {
			last = f.Name
		}
	}
	full := len(p.prev.FailedNodes) >= v1alpha1.MaxFailedNodes
	for _, name := range failedNames {
		f := p.failed[name]
		if f.preflight || prev[name] || (full && name > last) {
			continue
		}
		p.event(true, EventNodeFailed, name, fmt.Sprintf("node %s failed: %s", name, f.reason))
	}
}
