package plan

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// rollback: a node this rollout moved failed. Stop, and with autoRollback
// send the moved nodes back, in batches. sticky says the rollout failed
// in an earlier pass (its failed nodes are in the previous status).
func (p *pass) rollback(sticky bool) outcome {
	o := outcome{effects: effects{failed: map[string]failedEntry{}}}
	if sticky {
		for _, f := range p.prev.FailedNodes {
			if p.reportsFailure(f.Name) {
				o.fail(f.Name, f.Reason, false)
			}
		}
	}
	for _, n := range p.sel.tracked {
		if n.member && !n.rolledBack && n.failed {
			o.fail(n.name, n.failReason, false)
		}
	}
	first := firstFailure(o.failed)
	if !p.pol.autoRollback {
		p.recordFailing(&o)
		o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonNodeFailed, ReasonNodeFailed
		o.stageMsg = "the rollout stopped: " + first
		o.degMsg = o.stageMsg + "; autoRollback is off: fix the node, then change the spec to retry, or set a new mode"
		return o
	}
	var toReturn []*nodeState
	var returning []*nodeState
	for _, n := range p.sel.tracked {
		switch {
		case n.member && n.rolledBack:
			returning = append(returning, n)
		case n.member && n.atTarget:
			toReturn = append(toReturn, n)
		}
	}
	sort.SliceStable(toReturn, func(i, j int) bool { return toReturn[i].inTransition && !toReturn[j].inTransition })
	budget := p.maxUnav - p.unavailable()
	left, started := 0, 0
	for _, n := range toReturn {
		if n.pn.Annotations[AnnotationPreviousMode] == "" {
			o.fail(n.name, "cannot roll back: no previous mode was recorded (the node ran no mode before)", false)
			continue
		}
		if !n.inTransition {
			if budget <= 0 {
				left++
				continue
			}
			budget--
		}
		o.update = append(o.update, p.moveBack(n))
		o.deadlines = append(o.deadlines, p.now.Add(p.pol.timeout))
		started++
	}
	var rollbackFailed []*nodeState
	inFlight := 0
	for _, n := range returning {
		switch {
		case n.failed:
			rollbackFailed = append(rollbackFailed, n)
			// This reason wins over the one the move forward failed with.
			o.failed[n.name] = failedEntry{reason: fmt.Sprintf("rollback to %s failed: %s", n.pn.Spec.DesiredMode, n.failReason)}
		case n.inTransition:
			inFlight++
		}
	}
	p.recordFailing(&o)
	prevMode := previousModes(append(returning, toReturn...))
	switch {
	case left > 0 && started == 0 && inFlight == 0:
		// Failed nodes hold the whole maxUnavailable budget: the rollback
		// cannot go on without a person.
		stuck := p.failing()
		o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonRollbackFailed, ReasonRollbackFailed
		o.stageMsg = fmt.Sprintf("the rollback is stuck: %d nodes still run %s while failed nodes use the whole maxUnavailable budget of %d (%s)",
			left, p.cfg.Spec.Mode, p.maxUnav, failedSummary(stuck, o.failed))
		o.degMsg = o.stageMsg + "; the rollout failed first: " + first + "; fix or remove the failed nodes and the rollback goes on"
	case left > 0 || started > 0 || inFlight > 0:
		o.phase, o.stage, o.degraded = v1alpha1.RolloutRollingBack, ReasonRollingBack, ReasonNodeFailed
		o.stageMsg = fmt.Sprintf("rolling back %d nodes to %s: %s", left+started+inFlight, prevMode, first)
		o.degMsg = "the rollout stopped: " + first + "; moved nodes are returning to their previous mode"
		if p.prev.Phase != v1alpha1.RolloutRollingBack {
			o.event(true, EventRollbackStarted, "", fmt.Sprintf("returning %d nodes to %s: %s", len(toReturn)+len(returning), prevMode, first))
		}
	case len(rollbackFailed) > 0:
		o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonRollbackFailed, ReasonRollbackFailed
		o.stageMsg = fmt.Sprintf("%d nodes failed to return to their previous mode (%s)", len(rollbackFailed), failedSummary(rollbackFailed, o.failed))
		o.degMsg = o.stageMsg + "; the rollout failed first: " + first + "; these nodes need a person"
	default:
		o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonRolledBack, ReasonRolledBack
		o.stageMsg = fmt.Sprintf("the rollout failed and %d nodes were returned to %s", len(returning)+started, prevMode)
		o.degMsg = "the rollout failed: " + first + "; moved nodes run their previous mode again; change the spec to retry"
	}
	return o
}

// reportsFailure says whether a failed rollout keeps reporting a node's
// failure: the node is selected, or this rollout moved it (a stray that
// was sent back and settled is still why the rollout failed).
func (p *pass) reportsFailure(name string) bool {
	if _, ok := p.sel.byName[name]; ok {
		return true
	}
	pn := p.in.ProxyNodes[name]
	return pn != nil && pn.Annotations[AnnotationRollout] == p.rid
}

// moveBack returns the node's ProxyNode asking for the mode recorded when
// this rollout moved it, and marks the node returning.
func (p *pass) moveBack(n *nodeState) *v1alpha1.ProxyNode {
	pn := n.pn.DeepCopy()
	var settings v1alpha1.ProxySettings
	if s := pn.Annotations[AnnotationPreviousSettings]; s != "" {
		_ = json.Unmarshal([]byte(s), &settings) // unreadable: run the mode with defaults
	}
	pn.Annotations[AnnotationRolledBack] = p.rid
	pn.Annotations[AnnotationRequestedAt] = p.now.UTC().Format(time.RFC3339Nano)
	// Only the rollout's fields: spec.kubeProxyStopped is the handover
	// controller's.
	pn.Spec.DesiredMode = v1alpha1.ProxyMode(pn.Annotations[AnnotationPreviousMode])
	pn.Spec.ConfigRef = previousConfig(pn.Annotations[AnnotationPreviousConfig], p.cfg.Name)
	pn.Spec.Settings = settings
	n.rolledBack, n.atTarget, n.converged, n.failed, n.inTransition = true, false, false, false, true
	return pn
}

// previousModes names the modes the nodes return to.
func previousModes(ns []*nodeState) string {
	set := map[string]bool{}
	for _, n := range ns {
		if m := n.pn.Annotations[AnnotationPreviousMode]; m != "" {
			set[m] = true
		}
	}
	if len(set) == 0 {
		return "their previous mode"
	}
	var ms []string
	for m := range set {
		ms = append(ms, m)
	}
	sort.Strings(ms)
	return strings.Join(ms, "/")
}

// previousConfig parses AnnotationPreviousConfig; absent or unreadable, it
// is the config's generation 0: "what ran before any spec asked".
func previousConfig(v, config string) *v1alpha1.ConfigReference {
	if i := strings.LastIndexByte(v, '/'); i > 0 {
		if g, err := strconv.ParseInt(v[i+1:], 10, 64); err == nil {
			return &v1alpha1.ConfigReference{Name: v[:i], Generation: g}
		}
	}
	return &v1alpha1.ConfigReference{Name: config, Generation: 0}
}
