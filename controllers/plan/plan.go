package plan

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/preflight"
)

// Plan decides, from what the API says now, what to write next for one
// ProxyConfig. It is a pure function of its input: the same input gives the
// same result, and nothing is read from anywhere else (time included).
func Plan(in Input) Result {
	p := &planner{
		in:      in,
		cfg:     in.Config,
		prev:    &in.Config.Status,
		now:     in.Now,
		nowT:    metav1.NewTime(in.Now.UTC().Truncate(time.Second)),
		byName:  map[string]*nodeState{},
		failed:  map[string]failedEntry{},
		nodeMsg: map[string]string{},
	}
	p.run()
	return p.res
}

// Selector returns a ProxyConfig's node selector; nil or empty selects
// every node.
func Selector(cfg *v1alpha1.ProxyConfig) (labels.Selector, error) {
	if cfg.Spec.NodeSelector == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(cfg.Spec.NodeSelector)
}

// RolloutID names a rollout on the ProxyNodes it moves.
func RolloutID(config string, start time.Time) string {
	return config + "@" + start.UTC().Format(time.RFC3339)
}

// MaxUnavailable resolves spec.rollout.maxUnavailable against the number
// of selected nodes: a percentage rounds down, and the result is at least 1.
func MaxUnavailable(v *intstr.IntOrString, selected int) (int, error) {
	if v == nil {
		return DefaultMaxUnavailable, nil
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(v, selected, false)
	if err != nil {
		return 0, err
	}
	if n < 1 {
		n = 1
	}
	return n, nil
}

type policy struct {
	selector     labels.Selector
	timeout      time.Duration
	pause        time.Duration
	canary       int
	autoRollback bool
	paused       bool
	maxUnav      int
}

type failedEntry struct {
	reason    string
	preflight bool
}

type planner struct {
	in   Input
	cfg  *v1alpha1.ProxyConfig
	prev *v1alpha1.ProxyConfigStatus
	now  time.Time
	nowT metav1.Time
	pol  policy
	res  Result

	nodes     []*nodeState // selected, not conflicting, sorted by name
	byName    map[string]*nodeState
	conflicts map[string][]string
	selected  int
	ready     int

	rid       string
	failed    map[string]failedEntry
	deadlines []time.Time

	phase    v1alpha1.RolloutPhase
	stage    string // the Progressing reason
	stageMsg string
	degraded string // the Degraded reason; "" when not degraded
	degMsg   string
	nodeMsg  map[string]string
}

func (p *planner) run() {
	st := &p.res.Status
	st.ObservedGeneration = p.cfg.Generation
	st.TargetMode = p.cfg.Spec.Mode
	if err := p.parsePolicy(); err != nil {
		p.phase, p.stage, p.degraded = v1alpha1.RolloutFailed, ReasonInvalidSpec, ReasonInvalidSpec
		p.stageMsg = err.Error()
		p.degMsg = err.Error() + "; nothing is changed until the spec is fixed"
		st.Selector = ""
		p.finish()
		return
	}
	st.Selector = p.pol.selector.String()
	p.selectNodes()
	if p.selected == 0 {
		p.phase, p.stage = v1alpha1.RolloutPending, ReasonNoNodesSelected
		p.stageMsg = "no node matches the node selector"
		p.finish()
		return
	}
	mu, err := MaxUnavailable(p.cfg.Spec.Rollout.MaxUnavailable, p.selected)
	if err != nil { // unreachable after parsePolicy, kept for safety
		mu = 1
	}
	p.pol.maxUnav = mu
	if len(p.nodes) == 0 {
		p.phase, p.stage = v1alpha1.RolloutPending, ReasonConflict
		p.stageMsg = "every selected node is selected by another ProxyConfig too"
		p.sideDegraded()
		p.finish()
		return
	}
	p.classify()
	p.decide()
	p.finish()
}

func (p *planner) parsePolicy() error {
	spec := &p.cfg.Spec
	switch spec.Mode {
	case v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS:
	default:
		return fmt.Errorf("spec.mode %q is not one of iptables, nftables, ipvs", spec.Mode)
	}
	sel, err := Selector(p.cfg)
	if err != nil {
		return fmt.Errorf("spec.nodeSelector is invalid: %v", err)
	}
	p.pol.selector = sel
	r := &spec.Rollout
	if p.pol.timeout, err = r.NodeTimeout.Parse(DefaultNodeTimeout); err != nil || p.pol.timeout <= 0 {
		return fmt.Errorf("spec.rollout.nodeTimeout %q is not a positive duration", r.NodeTimeout)
	}
	if p.pol.pause, err = r.Canary.Pause.Parse(0); err != nil || p.pol.pause < 0 {
		return fmt.Errorf("spec.rollout.canary.pause %q is not a duration", r.Canary.Pause)
	}
	p.pol.canary = DefaultCanaryNodes
	if r.Canary.Nodes != nil {
		if *r.Canary.Nodes < 0 {
			return fmt.Errorf("spec.rollout.canary.nodes %d is negative", *r.Canary.Nodes)
		}
		p.pol.canary = int(*r.Canary.Nodes)
	}
	if r.MaxUnavailable != nil {
		n, err := intstr.GetScaledValueFromIntOrPercent(r.MaxUnavailable, 100, false)
		if err != nil || n < 0 || (r.MaxUnavailable.Type == intstr.Int && n < 1) {
			return fmt.Errorf("spec.rollout.maxUnavailable %q must be a number of at least 1 or a percentage", r.MaxUnavailable.String())
		}
	}
	p.pol.autoRollback = r.AutoRollback == nil || *r.AutoRollback
	p.pol.paused = r.Paused
	return nil
}

// selectNodes picks the nodes the selector matches, and sets apart those
// another ProxyConfig selects too.
func (p *planner) selectNodes() {
	type other struct {
		name string
		sel  labels.Selector
	}
	var others []other
	for i := range p.in.Others {
		o := &p.in.Others[i]
		if o.Name == p.cfg.Name || o.DeletionTimestamp != nil {
			continue
		}
		if sel, err := Selector(o); err == nil {
			others = append(others, other{o.Name, sel})
		}
	}
	sort.Slice(others, func(i, j int) bool { return others[i].name < others[j].name })
	p.conflicts = map[string][]string{}
	states := make([]nodeState, 0, len(p.in.Nodes)) // one allocation; never grows
	for _, n := range p.in.Nodes {
		if n.Deleting || !p.pol.selector.Matches(labels.Set(n.Labels)) {
			continue
		}
		p.selected++
		if pn := p.in.ProxyNodes[n.Name]; pn != nil && pn.Status.Phase == v1alpha1.NodeActive && pn.Status.ActiveMode != "" {
			if ok, _ := contract.Healthy(&pn.Status); ok {
				p.ready++
			}
		}
		for _, o := range others {
			if o.sel.Matches(labels.Set(n.Labels)) {
				p.conflicts[n.Name] = append(p.conflicts[n.Name], o.name)
			}
		}
		if len(p.conflicts[n.Name]) > 0 {
			continue
		}
		states = append(states, nodeState{name: n.Name, node: n})
		ns := &states[len(states)-1]
		p.nodes = append(p.nodes, ns)
		p.byName[n.Name] = ns
	}
	sort.Slice(p.nodes, func(i, j int) bool { return p.nodes[i].name < p.nodes[j].name })
}

// classify looks at each selected node's ProxyNode; missing ones are
// created, ones left by a replaced Node are deleted.
func (p *planner) classify() {
	mode, settings := p.cfg.Spec.Mode, &p.cfg.Spec.ProxySettings
	for _, n := range p.nodes {
		pn := p.in.ProxyNodes[n.name]
		if pn != nil && ownedByOtherNode(pn, n.node) {
			p.res.Delete = append(p.res.Delete, pn)
			pn = nil
			n.reportDeadline = p.now.Add(p.pol.timeout)
			continue // created again once the deletion is seen
		}
		if pn == nil {
			p.res.Create = append(p.res.Create, &v1alpha1.ProxyNode{
				ObjectMeta: metav1.ObjectMeta{Name: n.name, OwnerReferences: []metav1.OwnerReference{nodeOwnerRef(n.node)}},
			})
			n.reportDeadline = p.now.Add(p.pol.timeout)
			continue
		}
		n.pn = pn
		n.reported = pn.Status.Kernel != nil
		n.reportDeadline = pn.CreationTimestamp.Add(p.pol.timeout)
		n.atTarget = sameContent(&pn.Spec, mode, settings)
		n.converged = Converged(pn)
		n.inTransition = InTransition(pn)
		if n.inTransition {
			n.failed, n.failReason, n.deadline = failure(pn, p.pol.timeout, p.now)
			if !n.failed {
				p.deadlines = append(p.deadlines, n.deadline)
			}
		}
	}
}

func (p *planner) setMembership(rid string) {
	p.rid = rid
	for _, n := range p.nodes {
		n.member, n.rolledBack = false, false
		if rid == "" || n.pn == nil {
			continue
		}
		n.member = n.pn.Annotations[AnnotationRollout] == rid
		n.rolledBack = n.member && n.pn.Annotations[AnnotationRolledBack] == rid
	}
}

var rolloutFailureReasons = map[string]bool{ReasonNodeFailed: true, ReasonRolledBack: true, ReasonRollbackFailed: true}

// decide works out which rollout is current and runs the matching branch.
func (p *planner) decide() {
	prev := p.prev
	oldRID := ""
	if prev.StartTime != nil {
		oldRID = RolloutID(p.cfg.Name, prev.StartTime.Time)
	}
	p.setMembership(oldRID)
	targetChanged := prev.TargetMode != "" && prev.TargetMode != p.cfg.Spec.Mode
	anyFailedMember := false
	for _, n := range p.nodes {
		if n.member && !n.rolledBack && !n.atTarget {
			targetChanged = true
		}
		if n.member && !n.rolledBack && n.failed {
			anyFailedMember = true
		}
	}
	deg := meta.FindStatusCondition(prev.Conditions, v1alpha1.ConditionDegraded)
	prevRolloutFailed := (prev.Phase == v1alpha1.RolloutFailed || prev.Phase == v1alpha1.RolloutRollingBack) &&
		deg != nil && deg.Status == metav1.ConditionTrue && rolloutFailureReasons[deg.Reason]
	// A failed rollout holds until the spec changes (a new generation), and
	// a rollback in progress always finishes.
	sticky := prevRolloutFailed && (prev.Phase == v1alpha1.RolloutRollingBack || prev.ObservedGeneration == p.cfg.Generation)
	prevCompleted := prev.Phase == v1alpha1.RolloutCompleted

	active := oldRID != "" && !targetChanged
	if active && prevRolloutFailed && !sticky {
		active = false // a person changed the spec after a failure: try again
	}
	if active && prevCompleted && len(p.pending()) > 0 {
		active = false // new work after completion (a node joined): a new rollout
	}
	switch {
	case active && (sticky || (!prevCompleted && anyFailedMember)):
		p.res.Status.StartTime = prev.StartTime.DeepCopy()
		p.failureBranch(sticky)
	case active:
		p.res.Status.StartTime = prev.StartTime.DeepCopy()
		p.continueBranch()
	default:
		p.setMembership("")
		p.startBranch()
	}
}

// pending are the nodes the rollout still has to write: those not asking
// for the target yet, and failed ones a previous generation left at the
// target (they are retried once per generation).
func (p *planner) pending() []*nodeState {
	var out []*nodeState
	for _, n := range p.nodes {
		if n.pn == nil || !n.atTarget {
			out = append(out, n)
			continue
		}
		if n.failed && !n.member {
			ref := n.pn.Spec.ConfigRef
			if ref == nil || ref.Name != p.cfg.Name || ref.Generation < p.cfg.Generation {
				out = append(out, n)
			}
		}
	}
	return out
}

// preflightCheck splits pending nodes into those that may move, those whose
// agent has not reported yet, and those that cannot run the target.
func (p *planner) preflightCheck(pending []*nodeState) (eligible, waiting, blocked []*nodeState) {
	for _, n := range pending {
		if !n.reported {
			if p.now.Before(n.reportDeadline) {
				waiting = append(waiting, n)
				p.deadlines = append(p.deadlines, n.reportDeadline)
			} else {
				blocked = append(blocked, n)
				p.fail(n.name, fmt.Sprintf("agent has not reported kernel facts within the node timeout (%s)", p.pol.timeout), true)
			}
			continue
		}
		if probs := preflight.Problems(p.cfg.Spec.Mode, &p.cfg.Spec.ProxySettings, n.pn.Status.Kernel); len(probs) > 0 {
			blocked = append(blocked, n)
			p.fail(n.name, fmt.Sprintf("cannot run %s: %s", p.cfg.Spec.Mode, strings.Join(probs, "; ")), true)
			continue
		}
		eligible = append(eligible, n)
	}
	// Nodes already in transition first: redirecting them adds nothing to
	// the number of unavailable nodes.
	sort.SliceStable(eligible, func(i, j int) bool {
		return eligible[i].inTransition && !eligible[j].inTransition
	})
	return eligible, waiting, blocked
}

func (p *planner) fail(name, reason string, pre bool) {
	if _, ok := p.failed[name]; !ok {
		p.failed[name] = failedEntry{reason: reason, preflight: pre}
	}
}

func (p *planner) unavailable() int {
	c := 0
	for _, n := range p.nodes {
		if n.inTransition {
			c++
		}
	}
	return c
}

// startBranch: no rollout is under way for the current target. Check every
// node that must move (preflight) and start one when all can.
func (p *planner) startBranch() {
	st := &p.res.Status
	pending := p.pending()
	if len(pending) == 0 {
		p.settle(false)
		return
	}
	eligible, waiting, blocked := p.preflightCheck(pending)
	p.recordFailures(false)
	switch {
	case len(blocked) > 0:
		p.phase, p.stage, p.degraded = v1alpha1.RolloutFailed, ReasonPreflightFailed, ReasonPreflightFailed
		p.stageMsg = fmt.Sprintf("%d of %d nodes cannot run %s (%s); no node was changed", len(blocked), len(pending), p.cfg.Spec.Mode, p.failedSummary(blocked))
		p.degMsg = p.stageMsg + "; fix the nodes or change spec.mode or spec.nodeSelector"
		if p.prevReason(v1alpha1.ConditionProgressing) != ReasonPreflightFailed {
			p.event(true, EventPreflightFailed, "", p.stageMsg)
		}
	case len(waiting) > 0:
		p.phase, p.stage = v1alpha1.RolloutPreflight, ReasonPreflight
		p.stageMsg = fmt.Sprintf("waiting for the agents of %d nodes to report kernel facts (%s)", len(waiting), names(waiting, 5))
	case p.pol.paused:
		p.phase, p.stage = v1alpha1.RolloutPaused, ReasonPaused
		p.stageMsg = fmt.Sprintf("spec.rollout.paused is set; %d nodes are waiting to move to %s", len(pending), p.cfg.Spec.Mode)
	default:
		// The rollout's name must differ from every earlier one still
		// written on a node, or their nodes would count as its members.
		start := p.nowT
		if latest := p.latestRollout(); !start.After(latest) {
			start = metav1.NewTime(latest.Add(time.Second))
		}
		st.StartTime = &start
		p.setMembership(RolloutID(p.cfg.Name, start.Time))
		p.event(false, EventRolloutStarted, "", fmt.Sprintf("moving %d nodes to %s (maxUnavailable %d, canary %d)",
			len(eligible), p.cfg.Spec.Mode, p.pol.maxUnav, p.pol.canary))
		p.continueBranch()
		return
	}
	p.sideDegraded()
}

// continueBranch moves the current rollout on: canary, pause, batches.
func (p *planner) continueBranch() {
	st := &p.res.Status
	pending := p.pending()
	eligible, waiting, blocked := p.preflightCheck(pending)
	p.recordFailures(false)

	members, membersUpdated := 0, true
	for _, n := range p.nodes {
		if n.member {
			members++
			if !(n.atTarget && n.converged) {
				membersUpdated = false
			}
		}
	}
	k := p.pol.canary
	kEff := min(k, members+len(eligible))
	canaryPassed := k == 0 || members > k || (members >= kEff && membersUpdated)
	prevSame := p.prev.StartTime != nil && st.StartTime != nil && p.prev.StartTime.Equal(st.StartTime)
	prevProg := meta.FindStatusCondition(p.prev.Conditions, v1alpha1.ConditionProgressing)
	prevReason := ""
	if prevSame && prevProg != nil {
		prevReason = prevProg.Reason
	}
	if canaryPassed && members > 0 && prevReason == ReasonCanary {
		p.event(false, EventCanaryPassed, "", fmt.Sprintf("the canary (%d nodes) runs %s", members, p.cfg.Spec.Mode))
	}

	limit := -1
	switch {
	case p.pol.paused:
		p.stage, limit = ReasonPaused, 0
		p.stageMsg = "spec.rollout.paused is set; no new node starts"
	case !canaryPassed:
		p.stage, limit = ReasonCanary, kEff-members
		p.stageMsg = fmt.Sprintf("canary: %d of %d nodes moving to %s", members, kEff, p.cfg.Spec.Mode)
	case p.pol.pause > 0 && k > 0 && len(eligible) > 0 && members <= kEff && prevReason != ReasonRollingOut:
		pauseStart := p.nowT.Time
		if prevSame && prevProg.Status == metav1.ConditionFalse && (prevProg.Reason == ReasonCanaryPause || prevProg.Reason == ReasonPaused) {
			pauseStart = prevProg.LastTransitionTime.Time
		}
		end := pauseStart.Add(p.pol.pause)
		if p.now.Before(end) {
			p.stage, limit = ReasonCanaryPause, 0
			p.stageMsg = fmt.Sprintf("the canary passed; next batch at %s (canary pause %s)", end.UTC().Format(time.RFC3339), p.pol.pause)
			p.deadlines = append(p.deadlines, end)
		} else {
			p.stage = ReasonRollingOut
		}
	default:
		p.stage = ReasonRollingOut
	}
	left := p.startNodes(eligible, limit)

	inFlight := 0
	updated := 0
	for _, n := range p.nodes {
		if n.inTransition && !n.failed {
			inFlight++
		}
		if n.atTarget && n.converged {
			updated++
		}
	}
	if left == 0 && len(waiting) == 0 && inFlight == 0 {
		switch {
		case updated == len(p.nodes):
			p.settle(true)
			return
		case len(blocked) > 0:
			p.phase, p.stage, p.degraded = v1alpha1.RolloutFailed, ReasonPreflightFailed, ReasonPreflightFailed
			p.stageMsg = fmt.Sprintf("%d nodes cannot run %s (%s); every other node was moved", len(blocked), p.cfg.Spec.Mode, p.failedSummary(blocked))
			p.degMsg = p.stageMsg + "; fix the nodes or change spec.nodeSelector"
			if p.prevReason(v1alpha1.ConditionProgressing) != ReasonPreflightFailed {
				p.event(true, EventPreflightFailed, "", p.stageMsg)
			}
			p.sideDegraded()
			return
		default:
			p.settle(true)
			return
		}
	}
	switch p.stage {
	case ReasonPaused, ReasonCanaryPause:
		p.phase = v1alpha1.RolloutPaused
	default:
		p.phase = v1alpha1.RolloutProgressing
		if p.stage == ReasonRollingOut {
			p.stageMsg = fmt.Sprintf("moving nodes to %s: %d in transition (maxUnavailable %d), %d waiting", p.cfg.Spec.Mode, inFlight, p.pol.maxUnav, left+len(waiting))
		}
	}
	if len(waiting) > 0 {
		p.stageMsg += fmt.Sprintf("; %d nodes wait for their agent to report (%s)", len(waiting), names(waiting, 5))
	}
	p.sideDegraded()
}

// startNodes writes the target into eligible nodes, within the canary
// limit (-1: none) and the maxUnavailable budget. It returns how many
// eligible nodes were left waiting.
func (p *planner) startNodes(eligible []*nodeState, limit int) int {
	budget := p.pol.maxUnav - p.unavailable()
	started := 0
	for _, n := range eligible {
		if limit >= 0 && started >= limit {
			break
		}
		if !n.inTransition {
			if budget <= 0 {
				continue
			}
			budget--
		}
		p.moveForward(n)
		started++
	}
	return len(eligible) - started
}

// settle ends a pass where nothing is left to start: Completed when every
// node runs the target, otherwise waiting for, or reporting, the rest.
func (p *planner) settle(inRollout bool) {
	st := &p.res.Status
	updated, inFlight := 0, 0
	var failing []*nodeState
	for _, n := range p.nodes {
		switch {
		case n.atTarget && n.converged:
			updated++
		case n.inTransition && n.failed:
			failing = append(failing, n)
		case n.inTransition:
			inFlight++
		}
	}
	p.recordFailures(false)
	switch {
	case inFlight > 0:
		p.phase, p.stage = v1alpha1.RolloutProgressing, ReasonWaitingForNodes
		p.stageMsg = fmt.Sprintf("waiting for %d nodes to settle", inFlight)
	case len(failing) > 0 && !(inRollout && p.prev.Phase == v1alpha1.RolloutCompleted):
		p.phase, p.stage, p.degraded = v1alpha1.RolloutFailed, ReasonNodeUnhealthy, ReasonNodeUnhealthy
		p.stageMsg = fmt.Sprintf("%d nodes are failing (%s)", len(failing), p.failedSummary(failing))
		p.degMsg = p.stageMsg + "; fix the nodes, then change the spec to retry them"
	default:
		p.phase, p.stage = v1alpha1.RolloutCompleted, ReasonCompleted
		p.stageMsg = fmt.Sprintf("every selected node asks for %s", p.cfg.Spec.Mode)
		if len(failing) > 0 {
			p.degraded = ReasonNodeUnhealthy
			p.degMsg = fmt.Sprintf("%d nodes are failing after the rollout completed (%s)", len(failing), p.failedSummary(failing))
		}
		if p.prev.Phase == v1alpha1.RolloutCompleted && p.prev.CompletionTime != nil && equalTimes(p.prev.StartTime, st.StartTime) {
			st.CompletionTime = p.prev.CompletionTime.DeepCopy()
		} else {
			t := p.nowT
			st.CompletionTime = &t
			if st.StartTime != nil || p.prev.Phase != v1alpha1.RolloutCompleted {
				p.event(false, EventRolloutCompleted, "", fmt.Sprintf("%d/%d selected nodes run %s", updated, p.selected, p.cfg.Spec.Mode))
			}
		}
	}
	p.sideDegraded()
}

// failureBranch: a node this rollout moved failed. Stop, and with
// autoRollback send the moved nodes back, in batches.
func (p *planner) failureBranch(sticky bool) {
	if sticky {
		for _, f := range p.prev.FailedNodes {
			if _, ok := p.byName[f.Name]; ok {
				p.fail(f.Name, f.Reason, false)
			}
		}
	}
	for _, n := range p.nodes {
		if n.member && !n.rolledBack && n.failed {
			p.fail(n.name, n.failReason, false)
		}
	}
	first := p.firstFailure()
	if !p.pol.autoRollback {
		p.recordFailures(false)
		p.phase, p.stage, p.degraded = v1alpha1.RolloutFailed, ReasonNodeFailed, ReasonNodeFailed
		p.stageMsg = "the rollout stopped: " + first
		p.degMsg = p.stageMsg + "; autoRollback is off: fix the node, then change the spec to retry, or set a new mode"
		p.sideDegraded()
		return
	}
	var toReturn []*nodeState
	var returning []*nodeState
	for _, n := range p.nodes {
		switch {
		case n.member && n.rolledBack:
			returning = append(returning, n)
		case n.member && n.atTarget:
			toReturn = append(toReturn, n)
		}
	}
	sort.SliceStable(toReturn, func(i, j int) bool { return toReturn[i].inTransition && !toReturn[j].inTransition })
	budget := p.pol.maxUnav - p.unavailable()
	left, started := 0, 0
	for _, n := range toReturn {
		if n.pn.Annotations[AnnotationPreviousMode] == "" {
			p.fail(n.name, "cannot roll back: no previous mode was recorded (the node ran no mode before)", false)
			continue
		}
		if !n.inTransition {
			if budget <= 0 {
				left++
				continue
			}
			budget--
		}
		p.moveBack(n)
		started++
	}
	var rollbackFailed []*nodeState
	inFlight := 0
	for _, n := range returning {
		switch {
		case n.failed:
			rollbackFailed = append(rollbackFailed, n)
			p.failed[n.name] = failedEntry{reason: fmt.Sprintf("rollback to %s failed: %s", n.pn.Spec.DesiredMode, n.failReason)}
		case n.inTransition:
			inFlight++
		}
	}
	p.recordFailures(false)
	prevMode := p.previousModes(append(returning, toReturn...))
	switch {
	case left > 0 && started == 0 && inFlight == 0:
		// Failed nodes hold the whole maxUnavailable budget: the rollback
		// cannot go on without a person.
		var stuck []*nodeState
		for _, n := range p.nodes {
			if n.inTransition && n.failed {
				stuck = append(stuck, n)
			}
		}
		p.phase, p.stage, p.degraded = v1alpha1.RolloutFailed, ReasonRollbackFailed, ReasonRollbackFailed
		p.stageMsg = fmt.Sprintf("the rollback is stuck: %d nodes still run %s while failed nodes use the whole maxUnavailable budget of %d (%s)",
			left, p.cfg.Spec.Mode, p.pol.maxUnav, p.failedSummary(stuck))
		p.degMsg = p.stageMsg + "; the rollout failed first: " + first + "; fix or remove the failed nodes and the rollback goes on"
	case left > 0 || started > 0 || inFlight > 0:
		p.phase, p.stage, p.degraded = v1alpha1.RolloutRollingBack, ReasonRollingBack, ReasonNodeFailed
		p.stageMsg = fmt.Sprintf("rolling back %d nodes to %s: %s", left+started+inFlight, prevMode, first)
		p.degMsg = "the rollout stopped: " + first + "; moved nodes are returning to their previous mode"
		if p.prev.Phase != v1alpha1.RolloutRollingBack {
			p.event(true, EventRollbackStarted, "", fmt.Sprintf("returning %d nodes to %s: %s", len(toReturn)+len(returning), prevMode, first))
		}
	case len(rollbackFailed) > 0:
		p.phase, p.stage, p.degraded = v1alpha1.RolloutFailed, ReasonRollbackFailed, ReasonRollbackFailed
		p.stageMsg = fmt.Sprintf("%d nodes failed to return to their previous mode (%s)", len(rollbackFailed), p.failedSummary(rollbackFailed))
		p.degMsg = p.stageMsg + "; the rollout failed first: " + first + "; these nodes need a person"
	default:
		p.phase, p.stage, p.degraded = v1alpha1.RolloutFailed, ReasonRolledBack, ReasonRolledBack
		p.stageMsg = fmt.Sprintf("the rollout failed and %d nodes were returned to %s", len(returning)+started, prevMode)
		p.degMsg = "the rollout failed: " + first + "; moved nodes run their previous mode again; change the spec to retry"
	}
	p.sideDegraded()
}

// sideDegraded fills in the Degraded condition from conflicts and failing
// nodes when the branch did not set a stronger reason.
func (p *planner) sideDegraded() {
	if p.degraded == "" {
		var failing []*nodeState
		for _, n := range p.nodes {
			if n.inTransition && n.failed {
				failing = append(failing, n)
			}
		}
		if len(failing) > 0 {
			p.degraded = ReasonNodeUnhealthy
			p.degMsg = fmt.Sprintf("%d nodes are failing (%s)", len(failing), p.failedSummary(failing))
		}
	}
	if len(p.conflicts) > 0 {
		txt := p.conflictText()
		if p.degraded == "" {
			p.degraded = ReasonConflict
			p.degMsg = txt
		} else {
			p.degMsg += "; " + txt
		}
	}
}

// recordFailures adds every failing node to the failed list.
func (p *planner) recordFailures(bool) {
	for _, n := range p.nodes {
		if n.inTransition && n.failed {
			p.fail(n.name, n.failReason, false)
		}
	}
}

func (p *planner) firstFailure() string {
	var ns []string
	for name, f := range p.failed {
		if !f.preflight {
			ns = append(ns, name)
		}
	}
	sort.Strings(ns)
	if len(ns) == 0 {
		return "a node failed"
	}
	s := fmt.Sprintf("node %s failed: %s", ns[0], p.failed[ns[0]].reason)
	if len(ns) > 1 {
		s += fmt.Sprintf(" (and %d more)", len(ns)-1)
	}
	return s
}

func (p *planner) previousModes(ns []*nodeState) string {
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

// moveForward writes the target into a node, recording what it ran.
func (p *planner) moveForward(n *nodeState) {
	pn := n.pn.DeepCopy()
	if pn.Annotations == nil {
		pn.Annotations = map[string]string{}
	}
	if active := pn.Status.ActiveMode; active != "" {
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
	pn.Annotations[AnnotationRollout] = p.rid
	delete(pn.Annotations, AnnotationRolledBack)
	pn.Annotations[AnnotationRequestedAt] = p.now.UTC().Format(time.RFC3339Nano)
	pn.Spec = v1alpha1.ProxyNodeSpec{
		DesiredMode: p.cfg.Spec.Mode,
		ConfigRef:   &v1alpha1.ConfigReference{Name: p.cfg.Name, Generation: p.cfg.Generation},
		Settings:    *p.cfg.Spec.ProxySettings.DeepCopy(),
	}
	if !hasOwnerRef(pn, n.node) {
		pn.OwnerReferences = append(pn.OwnerReferences, nodeOwnerRef(n.node))
	}
	p.res.Update = append(p.res.Update, pn)
	n.member, n.atTarget, n.converged, n.failed = true, true, false, false
	n.inTransition = true
	p.deadlines = append(p.deadlines, p.now.Add(p.pol.timeout))
}

// moveBack returns a node to the mode recorded when this rollout moved it.
func (p *planner) moveBack(n *nodeState) {
	pn := n.pn.DeepCopy()
	var settings v1alpha1.ProxySettings
	if s := pn.Annotations[AnnotationPreviousSettings]; s != "" {
		_ = json.Unmarshal([]byte(s), &settings) // unreadable: run the mode with defaults
	}
	pn.Annotations[AnnotationRolledBack] = p.rid
	pn.Annotations[AnnotationRequestedAt] = p.now.UTC().Format(time.RFC3339Nano)
	pn.Spec = v1alpha1.ProxyNodeSpec{
		DesiredMode: v1alpha1.ProxyMode(pn.Annotations[AnnotationPreviousMode]),
		ConfigRef:   previousConfig(pn.Annotations[AnnotationPreviousConfig], p.cfg.Name),
		Settings:    settings,
	}
	p.res.Update = append(p.res.Update, pn)
	n.rolledBack, n.atTarget, n.converged, n.failed, n.inTransition = true, false, false, false, true
	p.deadlines = append(p.deadlines, p.now.Add(p.pol.timeout))
}

func (p *planner) prevReason(condType string) string {
	if c := meta.FindStatusCondition(p.prev.Conditions, condType); c != nil {
		return c.Reason
	}
	return ""
}

func (p *planner) event(warning bool, reason, node, msg string) {
	p.res.Events = append(p.res.Events, Event{Warning: warning, Reason: reason, Node: node, Message: msg})
}

func (p *planner) failedSummary(ns []*nodeState) string {
	var parts []string
	for i, n := range ns {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(ns)-3))
			break
		}
		r := n.failReason
		if f, ok := p.failed[n.name]; ok {
			r = f.reason
		}
		parts = append(parts, n.name+": "+r)
	}
	return strings.Join(parts, "; ")
}

func (p *planner) conflictText() string {
	var ns []string
	for n := range p.conflicts {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	var parts []string
	for i, n := range ns {
		if i == 10 {
			parts = append(parts, fmt.Sprintf("and %d more", len(ns)-10))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (also selected by %s)", n, strings.Join(p.conflicts[n], ", ")))
	}
	return fmt.Sprintf("%d nodes are selected by another ProxyConfig too and are left alone: %s; make the node selectors disjoint",
		len(ns), strings.Join(parts, ", "))
}

func names(ns []*nodeState, max int) string {
	var out []string
	for i, n := range ns {
		if i == max {
			out = append(out, fmt.Sprintf("and %d more", len(ns)-max))
			break
		}
		out = append(out, n.name)
	}
	return strings.Join(out, ", ")
}

func equalTimes(a, b *metav1.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
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

// latestRollout is the latest start time among this config's rollout
// names on the nodes and in the previous status.
func (p *planner) latestRollout() time.Time {
	var latest time.Time
	if p.prev.StartTime != nil {
		latest = p.prev.StartTime.Time
	}
	prefix := p.cfg.Name + "@"
	for _, n := range p.nodes {
		if n.pn == nil {
			continue
		}
		for _, key := range []string{AnnotationRollout, AnnotationRolledBack} {
			if v := n.pn.Annotations[key]; strings.HasPrefix(v, prefix) {
				if t, err := time.Parse(time.RFC3339, v[len(prefix):]); err == nil && t.After(latest) {
					latest = t
				}
			}
		}
	}
	return latest
}
