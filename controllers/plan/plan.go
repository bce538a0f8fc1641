package plan

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Plan decides, from what the API says now, what to write next for one
// ProxyConfig. It is a pure function of its input: the same input gives the
// same result, and nothing is read from anywhere else (time included).
//
// A pass reads the policy (policy.go), selects and classifies the nodes
// (selection.go), works out which rollout is current (decide), and runs
// one branch: starting or continuing a rollout (rollout.go), or stopping
// and rolling one back (rollback.go). The branch returns an outcome: where
// the rollout stands and what to write; status.go turns it into the
// status, and messages.go words it.
func Plan(in Input) Result {
	p := &pass{
		in:   in,
		cfg:  in.Config,
		prev: &in.Config.Status,
		now:  in.Now,
		nowT: metav1.NewTime(in.Now.UTC().Truncate(time.Second)),
	}
	return p.finish(p.run())
}

// pass is one run of the planner: its input, the policy, and the
// selected nodes as this pass sees them (their states change as the pass
// decides to write them).
type pass struct {
	in   Input
	cfg  *v1alpha1.ProxyConfig
	prev *v1alpha1.ProxyConfigStatus
	now  time.Time
	nowT metav1.Time
	pol  policy
	sel  selection
	// maxUnav is the policy's maxUnavailable for the selected nodes.
	maxUnav int
	// rid names the current rollout ("" when there is none).
	rid string
	// findings are what will behave differently on the nodes that still
	// have to move, as the pass found them before moving any.
	findings []v1alpha1.Finding
	// br is the change of kube-proxy's mode (spec.kubeProxy), if any;
	// bridgeEvents are its events decided before the leg's rollout ran.
	br           *bridge
	bridgeEvents []Event
	// expectKubeProxy is the mode kube-proxy must come back in on nodes
	// handed back to it ("" when any mode will do).
	expectKubeProxy v1alpha1.ProxyMode
	// step is the configRef step of the specs this pass writes (the
	// bridge's leg; "" outside a change of kube-proxy's mode).
	step string
	// kubeProxyWrite is kube-proxy's ConfigMap with a new mode, to write.
	kubeProxyWrite *corev1.ConfigMap
}

// run decides the pass's outcome.
func (p *pass) run() outcome {
	pol, err := parsePolicy(p.cfg)
	if err != nil {
		return outcome{
			phase: v1alpha1.RolloutFailed, stage: ReasonInvalidSpec, degraded: ReasonInvalidSpec,
			stageMsg: err.Error(), degMsg: err.Error() + "; nothing is changed until the spec is fixed",
		}
	}
	p.pol = pol
	p.sel = selectNodes(p.in, p.pol.selector)
	if p.sel.selected == 0 && len(p.sel.strays) == 0 {
		return outcome{phase: v1alpha1.RolloutPending, stage: ReasonNoNodesSelected, stageMsg: "no node matches the node selector"}
	}
	p.maxUnav = p.pol.maxUnav.of(p.sel.selected)
	if len(p.sel.tracked) == 0 {
		return outcome{phase: v1alpha1.RolloutPending, stage: ReasonConflict, stageMsg: "every selected node is selected by another ProxyConfig too"}
	}
	var stop *outcome
	if ch := p.cfg.Spec.KubeProxy; ch != nil && p.cfg.Spec.Mode == v1alpha1.ModeKubeProxy {
		stop = p.openBridge(ch) // from here p.cfg is the leg's config
	}
	e := p.classify()
	p.findings = p.behaviourDiff()
	var o outcome
	switch {
	case stop != nil:
		o = *stop
	case p.br != nil:
		o = p.closeBridge(p.decide())
	default:
		o = p.decide()
	}
	o.effects = e.then(o.effects)
	return o
}

var rolloutFailureReasons = map[string]bool{ReasonNodeFailed: true, ReasonRolledBack: true, ReasonRollbackFailed: true}

// decide works out which rollout is current and runs the matching branch.
func (p *pass) decide() outcome {
	prev := p.prev
	oldRID := ""
	if prev.StartTime != nil {
		oldRID = RolloutID(p.cfg.Name, prev.StartTime.Time)
	}
	p.setMembership(oldRID)
	targetChanged := prev.TargetMode != "" && prev.TargetMode != p.cfg.Spec.Mode
	anyFailedMember := false
	for _, n := range p.sel.tracked {
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
		o := p.rollback(sticky)
		o.start = prev.StartTime.DeepCopy()
		return o
	case active:
		return p.proceed(prev.StartTime.DeepCopy())
	default:
		p.setMembership("")
		return p.start()
	}
}

// outcome is what a pass decided: where the rollout stands, and what to
// write and record.
type outcome struct {
	phase v1alpha1.RolloutPhase
	// stage and stageMsg are the Progressing condition's reason and
	// message.
	stage, stageMsg string
	// degraded and degMsg are the Degraded condition's reason ("" when
	// not degraded) and message.
	degraded, degMsg string
	// start and completion are the rollout's start and completion times,
	// canaryPassed when its canary passed.
	start, completion, canaryPassed *metav1.Time
	// plan is what the rollout would do (dry run only).
	plan *v1alpha1.RolloutPlan
	effects
}

// effects are the writes and records of a pass.
type effects struct {
	create, delete, update []*v1alpha1.ProxyNode
	events                 []Event
	// failed are the failed nodes with their reasons.
	failed map[string]failedEntry
	// deadlines are the times at which to look again.
	deadlines []time.Time
}

type failedEntry struct {
	reason    string
	preflight bool
}

// then returns e followed by f.
func (e effects) then(f effects) effects {
	e.create = append(e.create, f.create...)
	e.delete = append(e.delete, f.delete...)
	e.update = append(e.update, f.update...)
	e.events = append(e.events, f.events...)
	e.deadlines = append(e.deadlines, f.deadlines...)
	for name, entry := range f.failed {
		if e.failed == nil {
			e.failed = map[string]failedEntry{}
		}
		if _, ok := e.failed[name]; !ok {
			e.failed[name] = entry
		}
	}
	return e
}

// fail records a failed node; the first reason recorded for a node stays.
func (e *effects) fail(name, reason string, preflight bool) {
	if e.failed == nil {
		e.failed = map[string]failedEntry{}
	}
	if _, ok := e.failed[name]; !ok {
		e.failed[name] = failedEntry{reason: reason, preflight: preflight}
	}
}

// event records an event about the ProxyConfig (node: the node it is
// about, if any).
func (e *effects) event(warning bool, reason, node, msg string) {
	e.events = append(e.events, Event{Warning: warning, Reason: reason, Node: node, Message: msg})
}

// recordFailing records every failing node of the pass as failed.
func (p *pass) recordFailing(o *outcome) {
	for _, n := range p.failing() {
		o.fail(n.name, n.failReason, false)
	}
}
