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

// finish turns the pass's outcome into the result: the status (counts,
// failed nodes, conditions), the writes, the events (those of the outcome,
// then those that follow from comparing the status with the previous
// one), and the requeue.
func (p *pass) finish(o outcome) Result {
	o = p.sideDegraded(o)
	if len(p.sel.strays) > 0 {
		o.stageMsg = strings.TrimPrefix(o.stageMsg+"; "+strayText(p.sel.strays), "; ")
	}
	res := Result{Create: o.create, Delete: o.delete, Update: o.update, Events: o.events, KubeProxyConfig: p.kubeProxyWrite}
	st := &res.Status
	st.ObservedGeneration = p.cfg.Generation
	st.TargetMode = p.cfg.Spec.Mode
	if p.pol.selector != nil {
		st.Selector = p.pol.selector.String()
	}
	st.Phase = o.phase
	st.StartTime, st.CompletionTime, st.CanaryPassedTime = o.start, o.completion, o.canaryPassed
	st.Plan = o.plan
	if st.Plan == nil && p.pol.dryRun && o.phase == v1alpha1.RolloutCompleted {
		st.Plan = &v1alpha1.RolloutPlan{Mode: p.cfg.Spec.Mode, MaxUnavailable: int32(p.maxUnav)} // nothing left to move
	}
	st.Findings = p.findings
	if p.br != nil {
		b := p.br.st
		st.KubeProxyBridge = &b
	}
	mode := p.cfg.Spec.Mode

	updated := 0
	for _, n := range p.sel.nodes {
		if n.atTarget && n.converged {
			updated++
			if n.member && !n.rolledBack {
				res.Updated = append(res.Updated, n.name)
			}
		}
	}
	st.Nodes = v1alpha1.NodeCounts{
		Selected: int32(p.sel.selected),
		Updated:  int32(updated),
		Ready:    int32(p.sel.ready),
		Failed:   int32(len(o.failed)),
		Summary:  fmt.Sprintf("%d/%d", updated, p.sel.selected),
	}

	// Failed nodes, sorted by name, at most MaxFailedNodes.
	var failedNames []string
	for name := range o.failed {
		failedNames = append(failedNames, name)
	}
	sort.Strings(failedNames)
	for i, name := range failedNames {
		if i == v1alpha1.MaxFailedNodes {
			break
		}
		st.FailedNodes = append(st.FailedNodes, v1alpha1.FailedNode{Name: name, Reason: text.Cut(o.failed[name].reason, maxFailedReason)})
	}
	res.Events = append(res.Events, p.nodeFailedEvents(failedNames, o.failed)...)

	// Conditions.
	counts := fmt.Sprintf("%d/%d selected nodes run %s", updated, p.sel.selected, mode)
	var ready metav1.Condition
	if p.sel.selected > 0 && updated == p.sel.selected && o.stage != ReasonInvalidSpec {
		ready = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonAllNodesUpdated,
			Message: fmt.Sprintf("all %d selected nodes run %s", p.sel.selected, mode)}
	} else {
		reason := o.stage
		switch reason {
		case ReasonCanary, ReasonRollingOut, ReasonWaitingForNodes:
			reason = ReasonInProgress
		case ReasonCompleted:
			reason = o.degraded
			if reason == "" {
				reason = ReasonNodeUnhealthy
			}
		}
		msg := counts
		if o.stageMsg != "" {
			msg += "; " + o.stageMsg
		}
		ready = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg}
	}
	if p.br != nil {
		ready = p.bridgeReady(ready)
	}
	prog := metav1.Condition{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: o.stage, Message: o.stageMsg}
	if progressingTrue[o.stage] {
		prog.Status = metav1.ConditionTrue
	}
	deg := metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ReasonAsExpected, Message: "no failed or conflicting nodes"}
	if o.degraded != "" {
		deg = metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: o.degraded, Message: o.degMsg}
	}
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
	if len(p.sel.conflicts) > 0 {
		txt := conflictText(p.sel.conflicts)
		old := meta.FindStatusCondition(p.prev.Conditions, v1alpha1.ConditionDegraded)
		if old == nil || !strings.Contains(old.Message, txt) {
			res.Events = append(res.Events, Event{Warning: true, Reason: EventConflict, Message: txt})
		}
	}

	// Look again when the earliest timeout or pause ends.
	var next = p.now
	for _, d := range o.deadlines {
		if d.After(p.now) && (next.Equal(p.now) || d.Before(next)) {
			next = d
		}
	}
	if next.After(p.now) {
		res.RequeueAfter = next.Sub(p.now) + 50*time.Millisecond // just past the deadline
	}
	return res
}

// sideDegraded fills in the Degraded condition from conflicts and failing
// nodes when the outcome did not set a stronger reason.
func (p *pass) sideDegraded(o outcome) outcome {
	if o.degraded == "" {
		if failing := p.failing(); len(failing) > 0 {
			o.degraded = ReasonNodeUnhealthy
			o.degMsg = fmt.Sprintf("%d nodes are failing (%s)", len(failing), failedSummary(failing, o.failed))
		}
	}
	if len(p.sel.conflicts) > 0 {
		txt := conflictText(p.sel.conflicts)
		if o.degraded == "" {
			o.degraded = ReasonConflict
			o.degMsg = txt
		} else {
			o.degMsg += "; " + txt
		}
	}
	return o
}

// nodeFailedEvents are NodeFailed events for node failures not in the
// previous status. The previous list is sorted and cut at MaxFailedNodes,
// so a name after its last entry may simply have been cut: skip those.
func (p *pass) nodeFailedEvents(failedNames []string, failed map[string]failedEntry) []Event {
	prev := map[string]bool{}
	last := ""
	for _, f := range p.prev.FailedNodes {
		prev[f.Name] = true
		if f.Name > last {
			last = f.Name
		}
	}
	full := len(p.prev.FailedNodes) >= v1alpha1.MaxFailedNodes
	var events []Event
	for _, name := range failedNames {
		f := failed[name]
		if f.preflight || prev[name] || (full && name > last) {
			continue
		}
		events = append(events, Event{Warning: true, Reason: EventNodeFailed, Node: name, Message: fmt.Sprintf("node %s failed: %s", name, f.reason)})
	}
	return events
}
