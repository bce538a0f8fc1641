package plan

import (
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// start: no rollout is under way for the current target. Check every
// node that must move (preflight) and start one when all can.
func (p *pass) start() outcome {
	var o outcome
	pending := p.pending()
	if len(pending) == 0 {
		return p.settle(false, nil)
	}
	pf := p.preflightCheck(pending, &o)
	p.recordFailing(&o)
	switch {
	case p.pol.dryRun:
		return p.dryRun(pf, min(p.pol.canary, len(pf.eligible)), o)
	case len(pf.blocked) > 0:
		o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonPreflightFailed, ReasonPreflightFailed
		o.stageMsg = fmt.Sprintf("%d of %d nodes cannot run %s (%s); no node was changed", len(pf.blocked), len(pending), p.cfg.Spec.Mode, failedSummary(pf.blocked, o.failed))
		o.degMsg = o.stageMsg + "; fix the nodes or change spec.mode or spec.nodeSelector"
		if p.prevReason(v1alpha1.ConditionProgressing) != ReasonPreflightFailed {
			o.event(true, EventPreflightFailed, "", o.stageMsg)
		}
	case len(pf.waiting) > 0:
		o.phase, o.stage = v1alpha1.RolloutPreflight, ReasonPreflight
		o.stageMsg = fmt.Sprintf("waiting for the agents of %d nodes to report kernel facts (%s)", len(pf.waiting), names(pf.waiting, 5))
	case len(p.unacknowledged()) > 0:
		o.phase, o.stage = v1alpha1.RolloutPreflight, ReasonAcknowledgementRequired
		o.stageMsg = acknowledgementText(p.unacknowledged())
		if p.prevReason(v1alpha1.ConditionProgressing) != ReasonAcknowledgementRequired {
			o.event(true, EventAcknowledgementRequired, "", o.stageMsg)
		}
	case p.pol.paused:
		o.phase, o.stage = v1alpha1.RolloutPaused, ReasonPaused
		o.stageMsg = fmt.Sprintf("spec.rollout.paused is set; %d nodes are waiting to move to %s", len(pending), p.cfg.Spec.Mode)
	default:
		// The rollout's name must differ from every earlier one still
		// written on a node, or their nodes would count as its members.
		start := p.nowT
		if latest := p.latestRollout(); !start.After(latest) {
			start = metav1.NewTime(latest.Add(time.Second))
		}
		p.setMembership(RolloutID(p.cfg.Name, start.Time))
		o.event(false, EventRolloutStarted, "", fmt.Sprintf("moving %d nodes to %s (maxUnavailable %d, canary %d)",
			len(pf.eligible), p.cfg.Spec.Mode, p.maxUnav, p.pol.canary))
		next := p.proceed(&start)
		next.effects = o.effects.then(next.effects)
		return next
	}
	return o
}

// proceed moves the rollout that started at start on: canary, pause,
// batches.
func (p *pass) proceed(start *metav1.Time) outcome {
	o := outcome{start: start}
	pending := p.pending()
	pf := p.preflightCheck(pending, &o)
	p.recordFailing(&o)

	members, membersUpdated := 0, true
	for _, n := range p.sel.tracked {
		if n.member {
			members++
			if !(n.atTarget && n.converged) {
				membersUpdated = false
			}
		}
	}
	k := p.pol.canary
	kEff := min(k, members+len(pf.eligible))
	canaryPassed := k == 0 || members > k || (members >= kEff && membersUpdated)
	prevSame := p.prev.StartTime != nil && start != nil && p.prev.StartTime.Equal(start)
	prevProg := meta.FindStatusCondition(p.prev.Conditions, v1alpha1.ConditionProgressing)
	prevReason := ""
	if prevSame && prevProg != nil {
		prevReason = prevProg.Reason
	}
	if canaryPassed && members > 0 && prevReason == ReasonCanary {
		o.event(false, EventCanaryPassed, "", fmt.Sprintf("the canary (%d nodes) runs %s", members, p.cfg.Spec.Mode))
	}
	if canaryPassed && members > 0 && k > 0 {
		o.canaryPassed = p.canaryPassedTime(prevSame)
	}

	canaryLeft := 0
	if !canaryPassed {
		canaryLeft = kEff - members
	}
	limit := -1
	switch {
	case p.pol.dryRun:
		o.stage, limit = ReasonDryRun, 0
	case p.pol.paused:
		o.stage, limit = ReasonPaused, 0
		o.stageMsg = "spec.rollout.paused is set; no new node starts"
	case !canaryPassed:
		o.stage, limit = ReasonCanary, canaryLeft
		o.stageMsg = fmt.Sprintf("canary: %d of %d nodes moving to %s", members, kEff, p.cfg.Spec.Mode)
	case p.pol.pause > 0 && o.canaryPassed != nil && len(pf.eligible) > 0 && members <= kEff && prevReason != ReasonRollingOut:
		end := o.canaryPassed.Add(p.pol.pause)
		if p.now.Before(end) {
			o.stage, limit = ReasonCanaryPause, 0
			o.stageMsg = fmt.Sprintf("the canary passed; next batch at %s (canary pause %s)", end.UTC().Format(time.RFC3339), p.pol.pause)
			o.deadlines = append(o.deadlines, end)
		} else {
			o.stage = ReasonRollingOut
		}
	default:
		o.stage = ReasonRollingOut
	}
	left := p.startNodes(pf.eligible, limit, &o)

	inFlight, updated := p.inFlight(), p.updated()
	if left == 0 && len(pf.waiting) == 0 && inFlight == 0 {
		if updated != len(p.sel.nodes) && len(pf.blocked) > 0 {
			o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonPreflightFailed, ReasonPreflightFailed
			o.stageMsg = fmt.Sprintf("%d nodes cannot run %s (%s); every other node was moved", len(pf.blocked), p.cfg.Spec.Mode, failedSummary(pf.blocked, o.failed))
			o.degMsg = o.stageMsg + "; fix the nodes or change spec.nodeSelector"
			if p.prevReason(v1alpha1.ConditionProgressing) != ReasonPreflightFailed {
				o.event(true, EventPreflightFailed, "", o.stageMsg)
			}
			return o
		}
		return p.settle(true, &o)
	}
	switch o.stage {
	case ReasonDryRun:
		return p.dryRun(pf, canaryLeft, o)
	case ReasonPaused, ReasonCanaryPause:
		o.phase = v1alpha1.RolloutPaused
	default:
		o.phase = v1alpha1.RolloutProgressing
		if o.stage == ReasonRollingOut {
			o.stageMsg = fmt.Sprintf("moving nodes to %s: %d in transition (maxUnavailable %d), %d waiting", p.cfg.Spec.Mode, inFlight, p.maxUnav, left+len(pf.waiting))
		}
	}
	if len(pf.waiting) > 0 {
		o.stageMsg += fmt.Sprintf("; %d nodes wait for their agent to report (%s)", len(pf.waiting), names(pf.waiting, 5))
	}
	return o
}

// canaryPassedTime is when the canary of the rollout being moved on
// passed: as the previous status recorded it for the same rollout
// (prevSame), else now. Kept in the status, the canary pause survives a
// restart of the operator and counts from the canary's success, not from
// a pause a person set while the canary was still moving.
func (p *pass) canaryPassedTime(prevSame bool) *metav1.Time {
	if prevSame && p.prev.CanaryPassedTime != nil {
		return p.prev.CanaryPassedTime.DeepCopy()
	}
	t := p.nowT
	return &t
}

// startNodes writes the target into eligible nodes, within the canary
// limit (-1: none) and the maxUnavailable budget. It returns how many
// eligible nodes were left waiting.
func (p *pass) startNodes(eligible []*nodeState, limit int, o *outcome) int {
	started := batchSize(eligible, limit, p.maxUnav-p.unavailable())
	for _, n := range eligible[:started] {
		o.update = append(o.update, p.moveForward(n))
		o.deadlines = append(o.deadlines, p.now.Add(p.pol.timeout))
	}
	return len(eligible) - started
}

// batchSize is how many eligible nodes start now: at most limit (-1: no
// limit), and of those not in transition yet only as many as budget
// allows. Eligible nodes in transition come first (preflightCheck sorts
// them so), so the nodes that start are always the first ones. Both the
// rollout and its dry-run plan cut batches with it.
func batchSize(eligible []*nodeState, limit, budget int) int {
	n := 0
	for _, e := range eligible {
		if limit >= 0 && n >= limit {
			break
		}
		if !e.inTransition {
			if budget <= 0 {
				break
			}
			budget--
		}
		n++
	}
	return n
}

// moveForward returns the node's ProxyNode asking for the target, with
// what it ran recorded, and marks the node moving.
func (p *pass) moveForward(n *nodeState) *v1alpha1.ProxyNode {
	pn := n.pn.DeepCopy()
	if pn.Annotations == nil {
		pn.Annotations = map[string]string{}
	}
	recordPrevious(pn, n.inTransition)
	pn.Annotations[AnnotationRollout] = p.rid
	delete(pn.Annotations, AnnotationRolledBack)
	pn.Annotations[AnnotationRequestedAt] = p.now.UTC().Format(time.RFC3339Nano)
	// Only the rollout's fields: spec.kubeProxyStopped is the handover
	// controller's.
	pn.Spec.DesiredMode = p.cfg.Spec.Mode
	pn.Spec.ConfigRef = &v1alpha1.ConfigReference{Name: p.cfg.Name, Generation: p.cfg.Generation, Step: p.step}
	pn.Spec.Settings = *p.cfg.Spec.ProxySettings.DeepCopy()
	if !hasOwnerRef(pn, n.node) {
		pn.OwnerReferences = append(pn.OwnerReferences, nodeOwnerRef(n.node))
	}
	n.member, n.atTarget, n.converged, n.failed = true, true, false, false
	n.inTransition = true
	return pn
}

// recordPrevious records in pn's annotations what serves traffic on the
// node, for a rollback: status.activeMode, with the settings and configRef
// of the spec that asked for it when the spec still does. A node in
// transition (failed ones included) reports the mode it is leaving as
// active while its spec asks for the move under way; when the annotations
// already name that mode, the move that started the transition recorded
// it from the spec that ran it, so they are kept: recorded again from the
// in-flight spec they would lose its settings and configRef.
func recordPrevious(pn *v1alpha1.ProxyNode, inTransition bool) {
	active := pn.Status.ActiveMode
	if active == "" || inTransition && pn.Annotations[AnnotationPreviousMode] == string(active) {
		return
	}
	pn.Annotations[AnnotationPreviousMode] = string(active)
	delete(pn.Annotations, AnnotationPreviousSettings)
	delete(pn.Annotations, AnnotationPreviousConfig)
	if pn.Spec.DesiredMode == active {
		if b, err := json.Marshal(pn.Spec.Settings); err == nil && string(b) != "{}" {
			pn.Annotations[AnnotationPreviousSettings] = string(b)
		}
		if ref := pn.Spec.ConfigRef; ref != nil {
			pn.Annotations[AnnotationPreviousConfig] = fmt.Sprintf("%s/%d", ref.Name, ref.Generation)
		}
	}
}

// settle ends a pass where nothing is left to start: Completed when every
// node runs the target, otherwise waiting for, or reporting, the rest.
// inRollout says a rollout brought it here, with what it decided so far
// in o (nil: none).
func (p *pass) settle(inRollout bool, o *outcome) outcome {
	var out outcome
	if o != nil {
		out.start, out.effects = o.start, o.effects
	}
	updated, inFlight, failing := p.updated(), p.inFlight(), p.failing()
	p.recordFailing(&out)
	switch {
	case inFlight > 0:
		out.phase, out.stage = v1alpha1.RolloutProgressing, ReasonWaitingForNodes
		out.stageMsg = fmt.Sprintf("waiting for %d nodes to settle", inFlight)
	case len(failing) > 0 && !(inRollout && p.prev.Phase == v1alpha1.RolloutCompleted):
		out.phase, out.stage, out.degraded = v1alpha1.RolloutFailed, ReasonNodeUnhealthy, ReasonNodeUnhealthy
		out.stageMsg = fmt.Sprintf("%d nodes are failing (%s)", len(failing), failedSummary(failing, out.failed))
		out.degMsg = out.stageMsg + "; fix the nodes, then change the spec to retry them"
	default:
		out.phase, out.stage = v1alpha1.RolloutCompleted, ReasonCompleted
		out.stageMsg = fmt.Sprintf("every selected node asks for %s", p.cfg.Spec.Mode)
		if len(failing) > 0 {
			out.degraded = ReasonNodeUnhealthy
			out.degMsg = fmt.Sprintf("%d nodes are failing after the rollout completed (%s)", len(failing), failedSummary(failing, out.failed))
		}
		if p.prev.Phase == v1alpha1.RolloutCompleted && p.prev.CompletionTime != nil && equalTimes(p.prev.StartTime, out.start) {
			out.completion = p.prev.CompletionTime.DeepCopy()
		} else {
			t := p.nowT
			out.completion = &t
			if out.start != nil || p.prev.Phase != v1alpha1.RolloutCompleted {
				out.event(false, EventRolloutCompleted, "", fmt.Sprintf("%d/%d selected nodes run %s", updated, p.sel.selected, p.cfg.Spec.Mode))
			}
		}
	}
	return out
}

// updated counts the selected nodes that run the target.
func (p *pass) updated() int {
	c := 0
	for _, n := range p.sel.nodes {
		if n.atTarget && n.converged {
			c++
		}
	}
	return c
}

// inFlight counts the tracked nodes in transition that have not failed.
func (p *pass) inFlight() int {
	c := 0
	for _, n := range p.sel.tracked {
		if n.inTransition && !n.failed {
			c++
		}
	}
	return c
}

// prevReason is the reason of the previous status's condition condType.
func (p *pass) prevReason(condType string) string {
	if c := meta.FindStatusCondition(p.prev.Conditions, condType); c != nil {
		return c.Reason
	}
	return ""
}
