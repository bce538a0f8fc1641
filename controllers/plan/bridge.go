package plan

import (
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/kubeproxyconfig"
	"github.com/proxyshift/proxyshift/controllers/preflight"
)

// Changing kube-proxy's own mode (spec.kubeProxy) is one rollout in legs,
// each an ordinary rollout of this planner with its own target:
//
//  1. TakingOver: the target is the bridge mode; proxyshift takes every
//     selected node over and kube-proxy's pods leave them (the handover
//     controller sees to that, as for any takeover).
//  2. ReconfiguringKubeProxy: once every node runs the bridge and no
//     kube-proxy pod is left on them, the new mode is written into
//     kube-proxy's ConfigMap (kubeproxyconfig.WithMode keeps what it
//     replaced).
//  3. HandingBack: the target is kube-proxy; the nodes go back batch by
//     batch and each kube-proxy pod starts in the new mode. A node whose
//     kube-proxy reports another mode has failed.
//
// A leg that fails is rolled back by the leg's own rollout (autoRollback),
// and then the change as a whole runs again towards kube-proxy's previous
// mode (RollingBack): nodes handed back are taken over again, the
// ConfigMap is restored, and the nodes are handed back to kube-proxy in
// its old mode. The change then ends Failed (RolledBack).
//
// The stage lives in status.kubeProxyBridge; everything else is read
// from the API again each pass (the ConfigMap's mode, the nodes), so an
// operator restarted at any point goes on where it stopped. status.
// targetMode is the current leg's target. While a leg completed but the
// change did not, the status shows phase Progressing with reason
// ReconfiguringKubeProxy (and the leg's completionTime), which the next
// pass reads back as the leg's Completed; after a rollback it shows
// Failed, read back likewise.

// Reasons and events of a change of kube-proxy's mode.
const (
	// ReasonKubeProxyConfig: kube-proxy's DaemonSet or ConfigMap cannot
	// be changed as asked; the message names what to fix.
	ReasonKubeProxyConfig = "KubeProxyConfig"
	// ReasonKubeProxyScope: kube-proxy runs on nodes the ProxyConfig does
	// not select, and its mode is one setting for all of them.
	ReasonKubeProxyScope = "KubeProxyScope"
	// ReasonReconfiguringKubeProxy: the nodes run the bridge; kube-proxy's
	// ConfigMap is being changed.
	ReasonReconfiguringKubeProxy = "ReconfiguringKubeProxy"

	EventBridgeStarted         = "KubeProxyBridgeStarted"
	EventKubeProxyReconfigured = "KubeProxyReconfigured"
	EventBridgeRollingBack     = "KubeProxyBridgeRollingBack"
	EventBridgeCompleted       = "KubeProxyBridgeCompleted"
)

// bridge is a change of kube-proxy's mode as one pass sees it.
type bridge struct {
	st   v1alpha1.KubeProxyBridgeStatus
	key  string
	conf kubeproxyconfig.Config
}

// legMode is the target of the stage's leg.
func (b *bridge) legMode() v1alpha1.ProxyMode {
	switch b.st.Stage {
	case v1alpha1.BridgeTakingOver, v1alpha1.BridgeReconfiguring:
		return b.st.Bridge
	}
	return v1alpha1.ModeKubeProxy
}

// step is the configRef step of the leg's specs: each leg, and each leg
// of the rollback, asks the agents with a reference of its own, so that
// a status echoing one leg's spec never passes for another's.
func (b *bridge) step() string {
	leg := string(v1alpha1.BridgeHandingBack)
	if b.legMode() != v1alpha1.ModeKubeProxy {
		leg = string(v1alpha1.BridgeTakingOver)
	}
	if b.st.RollingBack {
		return "RollingBack/" + leg
	}
	return leg
}

// what names the change for messages: "kube-proxy iptables → nftables",
// or "rolling kube-proxy back to iptables".
func (b *bridge) what() string {
	if b.st.RollingBack {
		return fmt.Sprintf("rolling kube-proxy back to %s", b.st.To)
	}
	return fmt.Sprintf("kube-proxy %s → %s", b.st.From, b.st.To)
}

// openBridge reads kube-proxy's DaemonSet and ConfigMap, works out the
// change's stage, and points the pass at the stage's leg (p.cfg becomes
// the leg's config). It returns an outcome when the change cannot go on;
// nothing is moved then.
func (p *pass) openBridge(ch *v1alpha1.KubeProxyModeChange) *outcome {
	kp := p.in.KubeProxy
	refuse := func(reason, msg string) *outcome {
		return &outcome{phase: v1alpha1.RolloutFailed, stage: reason, degraded: reason, stageMsg: msg,
			degMsg: msg + "; no node is moved until it is fixed"}
	}
	switch {
	case kp.DaemonSet == "":
		return refuse(ReasonKubeProxyConfig, `spec.kubeProxy changes kube-proxy's mode, but the operator runs with --kube-proxy-daemonset="" (this cluster has no kube-proxy)`)
	case !kp.Found:
		return refuse(ReasonKubeProxyConfig, fmt.Sprintf("kube-proxy's DaemonSet %s (--kube-proxy-daemonset) was not found", kp.DaemonSet))
	case kp.ModeFlag != "":
		return refuse(ReasonKubeProxyConfig, fmt.Sprintf("kube-proxy's DaemonSet %s runs kube-proxy with --proxy-mode=%s, which overrides the mode in its ConfigMap; remove the flag from the DaemonSet first", kp.DaemonSet, kp.ModeFlag))
	case kp.ConfigMap == "":
		return refuse(ReasonKubeProxyConfig, `spec.kubeProxy changes kube-proxy's mode, but the operator runs with --kube-proxy-configmap="" (no kube-proxy configuration to change)`)
	case kp.Config == nil:
		return refuse(ReasonKubeProxyConfig, fmt.Sprintf("kube-proxy's ConfigMap %s (--kube-proxy-configmap) was not found", kp.ConfigMap))
	}
	b := &bridge{key: kp.configKey()}
	var err error
	if b.conf, err = kubeproxyconfig.Read(kp.Config, b.key); err != nil {
		return refuse(ReasonKubeProxyConfig, "kube-proxy's configuration cannot be changed: "+err.Error())
	}
	if err := b.conf.CheckSettings(); err != nil {
		return refuse(ReasonKubeProxyConfig, "proxyshift cannot serve the nodes with kube-proxy's settings while its mode changes: "+err.Error())
	}
	prevB := p.prev.KubeProxyBridge
	if prevB != nil && (prevB.ObservedGeneration == p.cfg.Generation || sameChange(prevB, ch, kp.ConfigMap)) {
		b.st = *prevB
		b.st.ObservedGeneration, b.st.Requested = p.cfg.Generation, ch.Mode
	} else {
		// From is the mode the ConfigMap says now: where a failure of
		// this change returns to.
		b.st = v1alpha1.KubeProxyBridgeStatus{ObservedGeneration: p.cfg.Generation, Stage: v1alpha1.BridgeTakingOver,
			From: b.conf.Mode, To: ch.Mode, Requested: ch.Mode, Bridge: ch.BridgeMode(), ConfigMap: kp.ConfigMap}
		if b.conf.Mode == ch.Mode && len(p.kubeProxyIn(ch.Mode)) == 0 {
			b.st.Stage = v1alpha1.BridgeHandingBack // nothing to reconfigure: hand back what proxyshift serves
		}
	}
	p.br = b
	if b.st.Stage == v1alpha1.BridgeTakingOver || b.st.Stage == v1alpha1.BridgeReconfiguring {
		if out := p.outsidePods(); len(out) > 0 {
			return refuse(ReasonKubeProxyScope, fmt.Sprintf("kube-proxy's mode is one setting for its whole DaemonSet, and its pods run on %d nodes this ProxyConfig does not select (%s): "+
				"select every node that runs kube-proxy (an empty nodeSelector selects all), or remove kube-proxy from those nodes first", len(out), nameList(out, 5)))
		}
	}
	if b.st.Stage == v1alpha1.BridgeTakingOver && !b.st.RollingBack {
		if why := bridgeOverlap(b.st); why != "" {
			return refuse(ReasonKubeProxyConfig, why)
		}
		if o := p.kubeProxyPreflight(b.st.To); o != nil {
			return o
		}
	}
	if prevB == nil || b.st.ObservedGeneration != prevB.ObservedGeneration {
		first := "taking them over first"
		if b.st.Stage == v1alpha1.BridgeHandingBack {
			first = "its ConfigMap says " + string(b.st.To) + " already: handing them back"
		}
		p.bridgeEvents = append(p.bridgeEvents, Event{Reason: EventBridgeStarted, Message: fmt.Sprintf("changing %s over %d nodes, with proxyshift %s serving them meanwhile; %s",
			b.what(), len(p.sel.nodes), b.st.Bridge, first)})
	}

	// The leg: the stage's target, with kube-proxy's own settings for
	// the bridge (its cluster CIDRs and NodePort addresses) as it applied
	// them in the mode it ran before the change, whatever the ConfigMap's
	// mode line says meanwhile, and the previous status as the leg's
	// rollout wrote it.
	cfg := p.cfg.DeepCopy()
	cfg.Spec.Mode = b.legMode()
	cfg.Spec.KubeProxy = nil
	cfg.Spec.ProxySettings = v1alpha1.ProxySettings{}
	if cfg.Spec.Mode != v1alpha1.ModeKubeProxy {
		before := b.conf.InMode(b.st.From)
		cfg.Spec.ClusterCIDRs, cfg.Spec.NodePortAddresses = before.ClusterCIDRs, before.NodePortAddresses
	} else {
		p.expectKubeProxy = b.st.To
	}
	p.cfg = cfg
	p.step = b.step()
	prev := *p.prev
	if prevB != nil && (prev.Phase == v1alpha1.RolloutProgressing && p.prevReason(v1alpha1.ConditionProgressing) == ReasonReconfiguringKubeProxy ||
		prevB.RollingBack && prevB.Stage == v1alpha1.BridgeCompleted) {
		prev.Phase = v1alpha1.RolloutCompleted
	}
	p.prev = &prev
	return nil
}

// sameChange says a spec edited since prev was written still asks for
// prev's change, unfinished: the same mode, bridge and ConfigMap. Then
// the change goes on where it stands (a rollback under way goes on
// rolling back, and From stays the mode it returns to); any other edit,
// or one after the change ended, starts a change from what the ConfigMap
// says now ("change the spec to retry").
func sameChange(prev *v1alpha1.KubeProxyBridgeStatus, ch *v1alpha1.KubeProxyModeChange, configMap string) bool {
	requested := prev.Requested
	if requested == "" && !prev.RollingBack {
		requested = prev.To // written before Requested was
	}
	return prev.Stage != v1alpha1.BridgeCompleted && requested == ch.Mode && prev.Bridge == ch.BridgeMode() && prev.ConfigMap == configMap
}

// kubeProxyIn names the selected nodes kube-proxy serves in a reported
// mode other than mode (its pods started before its ConfigMap changed).
func (p *pass) kubeProxyIn(mode v1alpha1.ProxyMode) []string {
	var out []string
	for _, n := range p.sel.nodes {
		pn := p.in.ProxyNodes[n.name]
		if pn == nil || pn.Status.ActiveMode != v1alpha1.ModeKubeProxy {
			continue
		}
		if m := pn.Status.KubeProxyMode; m != "" && m != mode {
			out = append(out, n.name)
		}
	}
	return out
}

// outsidePods names the nodes that run a kube-proxy pod and are not
// among the nodes this ProxyConfig manages.
func (p *pass) outsidePods() []string {
	var out []string
	for node := range p.in.KubeProxy.PodNodes {
		if _, ok := p.sel.byName[node]; !ok {
			out = append(out, node)
		}
	}
	sort.Strings(out)
	return out
}

// bridgeOverlap says why the bridge mode cannot stand between kube-proxy's
// modes ("" when it can): it takes the nodes over from kube-proxy in From
// and hands them back to kube-proxy in To, and a rollback does both
// again, so an overlap with either refuses the change before any node
// moves.
func bridgeOverlap(st v1alpha1.KubeProxyBridgeStatus) string {
	for _, kp := range []v1alpha1.ProxyMode{st.From, st.To} {
		if why := preflight.KubeProxyOverlap(st.Bridge, kp); why != "" {
			return fmt.Sprintf("proxyshift %s cannot bridge kube-proxy %s → %s: %s; set spec.kubeProxy.bridge to nftables or iptables",
				st.Bridge, st.From, st.To, why)
		}
	}
	return ""
}

// kubeProxyPreflight checks that every selected node that reported its
// kernel can run kube-proxy's target mode.
func (p *pass) kubeProxyPreflight(mode v1alpha1.ProxyMode) *outcome {
	var o outcome
	var blocked []*nodeState
	for _, n := range p.sel.nodes {
		pn := p.in.ProxyNodes[n.name]
		if pn == nil || pn.Status.Kernel == nil {
			continue
		}
		if probs := preflight.Problems(mode, &v1alpha1.ProxySettings{}, pn.Status.Kernel); len(probs) > 0 {
			blocked = append(blocked, n)
			o.fail(n.name, fmt.Sprintf("cannot run kube-proxy in %s mode: %s", mode, strings.Join(probs, "; ")), true)
		}
	}
	if len(blocked) == 0 {
		return nil
	}
	o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonPreflightFailed, ReasonPreflightFailed
	o.stageMsg = fmt.Sprintf("%d of %d nodes cannot run kube-proxy in %s mode (%s); no node was changed", len(blocked), len(p.sel.nodes), mode, failedSummary(blocked, o.failed))
	o.degMsg = o.stageMsg + "; fix the nodes or change spec.kubeProxy.mode"
	if p.prevReason(v1alpha1.ConditionProgressing) != ReasonPreflightFailed {
		o.event(true, EventPreflightFailed, "", o.stageMsg)
	}
	return &o
}

// closeBridge moves the change on from what its leg's rollout decided.
func (p *pass) closeBridge(o outcome) outcome {
	b := p.br
	o.events = append(p.bridgeEvents, o.events...)
	if b.st.RollingBack && b.st.Stage != v1alpha1.BridgeCompleted && rolloutFailed(o) {
		o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonRollbackFailed, ReasonRollbackFailed
		o.stageMsg = fmt.Sprintf("returning kube-proxy to %s failed: %s", b.st.To, o.stageMsg)
		o.degMsg = o.stageMsg + "; changing its mode failed first: " + b.st.Failure + "; the nodes need a person"
		return o
	}
	if !b.st.RollingBack && o.phase == v1alpha1.RolloutFailed && o.degraded == ReasonRolledBack {
		return p.reverseBridge(o)
	}
	switch b.st.Stage {
	case v1alpha1.BridgeTakingOver:
		if o.phase != v1alpha1.RolloutCompleted {
			o.stageMsg = fmt.Sprintf("%s: taking the nodes over: %s", b.what(), o.stageMsg)
			return o
		}
		b.st.Stage = v1alpha1.BridgeReconfiguring
		fallthrough
	case v1alpha1.BridgeReconfiguring:
		if o.phase != v1alpha1.RolloutCompleted {
			b.st.Stage = v1alpha1.BridgeTakingOver // a node left the bridge: take it over again first
			o.stageMsg = fmt.Sprintf("%s: taking the nodes over: %s", b.what(), o.stageMsg)
			return o
		}
		return p.reconfigure(o)
	case v1alpha1.BridgeHandingBack:
		if o.phase != v1alpha1.RolloutCompleted {
			o.stageMsg = fmt.Sprintf("%s: handing the nodes back: %s", b.what(), o.stageMsg)
			return o
		}
		b.st.Stage = v1alpha1.BridgeCompleted
		if b.st.RollingBack {
			p.bridgeEvent(&o, true, EventBridgeCompleted, fmt.Sprintf("every node runs kube-proxy in %s mode again and its ConfigMap is restored; changing its mode failed: %s", b.st.To, b.st.Failure))
		} else {
			p.bridgeEvent(&o, false, EventBridgeCompleted, fmt.Sprintf("every selected node runs kube-proxy in %s mode (was %s)", b.st.To, b.st.From))
		}
		fallthrough
	case v1alpha1.BridgeCompleted:
		if b.st.RollingBack && o.phase == v1alpha1.RolloutCompleted {
			o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonRolledBack, ReasonRolledBack
			o.stageMsg = fmt.Sprintf("changing kube-proxy's mode failed and was rolled back: every node runs kube-proxy in %s mode again and its ConfigMap %s is restored",
				b.st.To, b.st.ConfigMap)
			o.degMsg = "the change failed: " + b.st.Failure + "; change the spec to retry"
		}
	}
	return o
}

// rolloutFailed says the leg's rollout failed or is rolling back.
func rolloutFailed(o outcome) bool {
	return o.phase == v1alpha1.RolloutRollingBack || o.phase == v1alpha1.RolloutFailed && rolloutFailureReasons[o.degraded]
}

// reconfigure: every node runs the bridge. Once no kube-proxy pod is left
// on them, write the target mode into kube-proxy's ConfigMap; once it
// says so, hand the nodes back.
func (p *pass) reconfigure(o outcome) outcome {
	b := p.br
	o.phase, o.stage = v1alpha1.RolloutProgressing, ReasonReconfiguringKubeProxy
	var running []*nodeState
	for _, n := range p.sel.nodes {
		if n.pn == nil || !n.pn.Spec.KubeProxyStopped {
			running = append(running, n)
		}
	}
	switch {
	case len(running) > 0:
		o.stageMsg = fmt.Sprintf("%s: every node runs proxyshift %s; waiting for kube-proxy's pods to leave %d nodes (%s)", b.what(), b.st.Bridge, len(running), names(running, 5))
	case b.conf.Mode == b.st.To:
		b.st.Stage = v1alpha1.BridgeHandingBack
		verb := "now says"
		if b.st.RollingBack {
			verb = "is restored and says"
		}
		p.bridgeEvent(&o, false, EventKubeProxyReconfigured, fmt.Sprintf("kube-proxy's ConfigMap %s %s mode %s; handing the nodes back", b.st.ConfigMap, verb, b.st.To))
		o.stageMsg = fmt.Sprintf("%s: kube-proxy's ConfigMap says %s; handing the nodes back next", b.what(), b.st.To)
		o.deadlines = append(o.deadlines, p.now.Add(time.Second))
	default:
		cm, err := kubeproxyconfig.WithMode(p.in.KubeProxy.Config, b.key, b.st.To)
		if err != nil {
			o.phase, o.stage, o.degraded = v1alpha1.RolloutFailed, ReasonKubeProxyConfig, ReasonKubeProxyConfig
			o.stageMsg = fmt.Sprintf("%s: kube-proxy's ConfigMap cannot be changed: %v", b.what(), err)
			o.degMsg = o.stageMsg + "; every node stays on proxyshift " + string(b.st.Bridge) + " until it is fixed"
			return o
		}
		p.kubeProxyWrite = cm
		o.stageMsg = fmt.Sprintf("%s: no kube-proxy pod runs on the nodes; writing mode %s into kube-proxy's ConfigMap %s", b.what(), b.st.To, b.st.ConfigMap)
		o.deadlines = append(o.deadlines, p.now.Add(5*time.Second)) // look again if the write's event is missed
	}
	return o
}

// reverseBridge: a leg's rollout failed and returned its nodes; run the
// change again towards kube-proxy's previous mode.
func (p *pass) reverseBridge(o outcome) outcome {
	b := p.br
	b.st.RollingBack, b.st.Failure, b.st.To = true, o.degMsg, b.st.From
	if f := firstFailure(o.failed); f != "" {
		b.st.Failure = f
	}
	b.st.Stage = v1alpha1.BridgeHandingBack
	if b.conf.Mode != b.st.To {
		b.st.Stage = v1alpha1.BridgeTakingOver
	}
	p.bridgeEvent(&o, true, EventBridgeRollingBack, fmt.Sprintf("returning every node to kube-proxy in %s mode (stage %s next): %s", b.st.To, b.st.Stage, b.st.Failure))
	o.phase, o.stage, o.degraded = v1alpha1.RolloutRollingBack, ReasonRollingBack, ReasonNodeFailed
	o.stageMsg = fmt.Sprintf("changing kube-proxy's mode failed; returning every node to kube-proxy in %s mode: %s", b.st.To, b.st.Failure)
	o.degMsg = "changing kube-proxy's mode failed: " + b.st.Failure
	o.deadlines = append(o.deadlines, p.now.Add(time.Second))
	return o
}

// bridgeEvent records an event of the change, once: only when the
// stage it reports differs from the previous status's.
func (p *pass) bridgeEvent(o *outcome, warning bool, reason, msg string) {
	if prev := p.prev.KubeProxyBridge; prev != nil && *prev == p.br.st {
		return
	}
	o.event(warning, reason, "", msg)
}

// bridgeReady is the Ready condition while kube-proxy's mode changes:
// True only once every node runs kube-proxy in the target mode.
func (p *pass) bridgeReady(ready metav1.Condition) metav1.Condition {
	b := p.br
	if b.st.Stage == v1alpha1.BridgeCompleted && !b.st.RollingBack {
		if ready.Status == metav1.ConditionTrue {
			ready.Message = fmt.Sprintf("all %d selected nodes run kube-proxy in %s mode", p.sel.selected, b.st.To)
		}
		return ready
	}
	if ready.Status == metav1.ConditionTrue {
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonInProgress
	}
	ready.Message = fmt.Sprintf("changing kube-proxy's mode %s → %s: stage %s; %s", b.st.From, b.st.To, b.st.Stage, ready.Message)
	return ready
}
