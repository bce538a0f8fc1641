package plan

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/kubeproxyconfig"
	"github.com/proxyshift/proxyshift/controllers/preflight"
)

// selection is the nodes a ProxyConfig selects.
type selection struct {
	// nodes are the selected nodes no other ProxyConfig selects, sorted
	// by name; byName indexes them.
	nodes  []*nodeState
	byName map[string]*nodeState
	// conflicts are the selected nodes other ProxyConfigs select too,
	// with their names; they are left alone.
	conflicts map[string][]string
	// strays are nodes this config moved (movedBy) that it no longer
	// selects alone, because the selector or their labels changed or
	// another ProxyConfig selects them too, and that are still in
	// transition. The config that moved a node finishes or rolls back its
	// transition: strays count against its maxUnavailable, are watched
	// for failure and return with a rollback until they settle; they are
	// never started anew.
	strays []*nodeState
	// tracked are nodes followed by strays: every node the config
	// answers for.
	tracked []*nodeState
	// selected counts every selected node, ready those Active and
	// healthy in any mode.
	selected, ready int
}

// selectNodes picks the nodes the selector matches, sets apart those
// another ProxyConfig selects too, and finds the strays.
func selectNodes(in Input, sel labels.Selector) selection {
	type other struct {
		name string
		sel  labels.Selector
	}
	var others []other
	for i := range in.Others {
		o := &in.Others[i]
		if o.Name == in.Config.Name || o.DeletionTimestamp != nil {
			continue
		}
		if sel, err := Selector(o); err == nil {
			others = append(others, other{o.Name, sel})
		}
	}
	sort.Slice(others, func(i, j int) bool { return others[i].name < others[j].name })
	s := selection{byName: map[string]*nodeState{}, conflicts: map[string][]string{}}
	states := make([]nodeState, 0, len(in.Nodes)) // one allocation; never grows
	state := func(n Node) *nodeState {
		states = append(states, nodeState{name: n.Name, node: n})
		return &states[len(states)-1]
	}
	for _, n := range in.Nodes {
		if n.Deleting {
			continue
		}
		pn := in.ProxyNodes[n.Name]
		if !sel.Matches(labels.Set(n.Labels)) {
			if stray(pn, n, in.Config.Name) {
				s.strays = append(s.strays, state(n))
			}
			continue
		}
		s.selected++
		if pn != nil && pn.Status.Phase == v1alpha1.NodeActive && pn.Status.ActiveMode != "" {
			if ok, _ := contract.Healthy(&pn.Status); ok {
				s.ready++
			}
		}
		for _, o := range others {
			if o.sel.Matches(labels.Set(n.Labels)) {
				s.conflicts[n.Name] = append(s.conflicts[n.Name], o.name)
			}
		}
		switch {
		case len(s.conflicts[n.Name]) == 0:
			ns := state(n)
			s.nodes = append(s.nodes, ns)
			s.byName[n.Name] = ns
		case stray(pn, n, in.Config.Name):
			s.strays = append(s.strays, state(n))
		}
	}
	sortByName(s.nodes)
	sortByName(s.strays)
	s.tracked = append(s.nodes[:len(s.nodes):len(s.nodes)], s.strays...)
	return s
}

// sortByName sorts nodes by name.
func sortByName(ns []*nodeState) {
	sort.Slice(ns, func(i, j int) bool { return ns[i].name < ns[j].name })
}

// stray says whether config answers for a node it does not select alone:
// it moved the node (its ProxyNode is not a replaced Node's) and the node
// is still in transition.
func stray(pn *v1alpha1.ProxyNode, n Node, config string) bool {
	return pn != nil && movedBy(pn) == config && InTransition(pn) && !ownedByOtherNode(pn, n)
}

// movedBy names the ProxyConfig that last moved the node: the one its
// rollout annotation names (a rollback keeps it while its configRef
// names the previous spec's config) or, without that annotation, the one
// its configRef names.
func movedBy(pn *v1alpha1.ProxyNode) string {
	if name, _, ok := strings.Cut(pn.Annotations[AnnotationRollout], "@"); ok {
		return name
	}
	if ref := pn.Spec.ConfigRef; ref != nil {
		return ref.Name
	}
	return ""
}

// classify fills in each tracked node's state from its ProxyNode, and
// returns the ProxyNodes to create (missing ones) and delete (left by a
// replaced Node), and when to look again.
func (p *pass) classify() effects {
	var e effects
	mode, settings := p.cfg.Spec.Mode, &p.cfg.Spec.ProxySettings
	for _, n := range p.sel.tracked {
		pn := p.in.ProxyNodes[n.name]
		if pn != nil && ownedByOtherNode(pn, n.node) {
			e.delete = append(e.delete, pn)
			n.reportDeadline = p.now.Add(p.pol.timeout)
			continue // created again once the deletion is seen
		}
		if pn == nil {
			e.create = append(e.create, NewProxyNode(n.node))
			n.reportDeadline = p.now.Add(p.pol.timeout)
			continue
		}
		n.pn = pn
		n.reported = pn.Status.Kernel != nil
		n.reportDeadline = pn.CreationTimestamp.Add(p.pol.timeout)
		n.atTarget = sameContent(&pn.Spec, mode, settings)
		n.converged = Converged(pn)
		n.inTransition = InTransition(pn)
		if why := p.wrongKubeProxyMode(pn); n.converged && why != "" {
			n.converged, n.inTransition, n.failed, n.failReason = false, true, true, why
			continue
		}
		if n.inTransition {
			n.failed, n.failReason, n.deadline = failure(pn, p.pol.timeout, p.now)
			if !n.failed {
				e.deadlines = append(e.deadlines, n.deadline)
			}
		}
	}
	return e
}

// setMembership marks the nodes rollout rid moved and sent back ("": no
// rollout).
func (p *pass) setMembership(rid string) {
	p.rid = rid
	for _, n := range p.sel.tracked {
		n.member, n.rolledBack = false, false
		if rid == "" || n.pn == nil {
			continue
		}
		n.member = n.pn.Annotations[AnnotationRollout] == rid
		n.rolledBack = n.member && n.pn.Annotations[AnnotationRolledBack] == rid
	}
}

// pending are the nodes the rollout still has to write: those not asking
// for the target yet, and failed ones a previous generation left at the
// target (they are retried once per generation).
func (p *pass) pending() []*nodeState {
	var out []*nodeState
	for _, n := range p.sel.nodes {
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

// checked is pending nodes, split by what their kernel facts say.
type checked struct {
	// eligible may move, those in transition first (redirecting them
	// adds nothing to the number of unavailable nodes); waiting have not
	// reported their facts yet; blocked cannot run the target, or did not
	// report in time.
	eligible, waiting, blocked []*nodeState
}

// preflightCheck splits pending nodes into those that may move, those whose
// agent has not reported yet, and those that cannot run the target. It
// records the blocked ones as failed (by preflight) and when the waiting
// ones time out.
func (p *pass) preflightCheck(pending []*nodeState, o *outcome) checked {
	var pf checked
	for _, n := range pending {
		if !n.reported {
			if p.now.Before(n.reportDeadline) {
				pf.waiting = append(pf.waiting, n)
				o.deadlines = append(o.deadlines, n.reportDeadline)
			} else {
				pf.blocked = append(pf.blocked, n)
				o.fail(n.name, fmt.Sprintf("agent has not reported kernel facts within the node timeout (%s)", p.pol.timeout), true)
			}
			continue
		}
		if why := p.kubeProxyProblem(n.pn); why != "" {
			pf.blocked = append(pf.blocked, n)
			o.fail(n.name, why, true)
			continue
		}
		if probs := preflight.Problems(p.cfg.Spec.Mode, &p.cfg.Spec.ProxySettings, n.pn.Status.Kernel); len(probs) > 0 {
			pf.blocked = append(pf.blocked, n)
			o.fail(n.name, fmt.Sprintf("cannot run %s: %s", p.cfg.Spec.Mode, strings.Join(probs, "; ")), true)
			continue
		}
		pf.eligible = append(pf.eligible, n)
	}
	sort.SliceStable(pf.eligible, func(i, j int) bool {
		return pf.eligible[i].inTransition && !pf.eligible[j].inTransition
	})
	return pf
}

// unavailable counts the tracked nodes in transition.
func (p *pass) unavailable() int {
	c := 0
	for _, n := range p.sel.tracked {
		if n.inTransition {
			c++
		}
	}
	return c
}

// failing are the tracked nodes in transition that failed.
func (p *pass) failing() []*nodeState {
	var out []*nodeState
	for _, n := range p.sel.tracked {
		if n.inTransition && n.failed {
			out = append(out, n)
		}
	}
	return out
}

// latestRollout is the latest start time among this config's rollout
// names on the nodes and in the previous status.
func (p *pass) latestRollout() time.Time {
	var latest time.Time
	if p.prev.StartTime != nil {
		latest = p.prev.StartTime.Time
	}
	prefix := p.cfg.Name + "@"
	for _, n := range p.sel.tracked {
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

// kubeProxyProblem says why the node cannot move to the target because of
// kube-proxy: its rules on the node are of a mode the target cannot take
// over from (preflight.KubeProxyOverlap); handing a node back needs the
// DaemonSet, and taking over a node that holds kube-proxy's rules needs it
// to stop kube-proxy there first. Empty means no problem.
func (p *pass) kubeProxyProblem(pn *v1alpha1.ProxyNode) string {
	if why := preflight.KubeProxyOverlap(p.cfg.Spec.Mode, pn.Status.KubeProxyMode); why != "" {
		return fmt.Sprintf("kube-proxy's %s rules are on the node: %s; move the node to nftables or iptables first, then to %s",
			pn.Status.KubeProxyMode, why, p.cfg.Spec.Mode)
	}
	if p.cfg.Spec.Mode == v1alpha1.ModeKubeProxy {
		mode := p.kubeProxyConfiguredMode()
		if why := preflight.KubeProxyOverlap(pn.Status.ActiveMode, mode); why != "" {
			return fmt.Sprintf("the node runs proxyshift's %s mode and kube-proxy starts in %s mode: %s; move the node to nftables or iptables first, then hand it back",
				pn.Status.ActiveMode, mode, why)
		}
	}
	kp := p.in.KubeProxy
	switch {
	case kp.Found:
		return ""
	case p.cfg.Spec.Mode == v1alpha1.ModeKubeProxy && kp.DaemonSet == "":
		return `the operator runs with --kube-proxy-daemonset="" (this cluster has no kube-proxy), so no node can be handed back to kube-proxy; ` +
			"pass --kube-proxy-daemonset=<namespace/name> naming kube-proxy's DaemonSet"
	case p.cfg.Spec.Mode == v1alpha1.ModeKubeProxy:
		return fmt.Sprintf("kube-proxy's DaemonSet %s (--kube-proxy-daemonset) was not found, so no node can be handed back to kube-proxy; "+
			"create it, or pass --kube-proxy-daemonset=<namespace/name> naming it", kp.DaemonSet)
	case kp.DaemonSet != "" && pn.Status.KubeProxyMode != "":
		return fmt.Sprintf("kube-proxy's %s rules are on the node but its DaemonSet %s (--kube-proxy-daemonset) was not found, so kube-proxy cannot be stopped there; "+
			`pass --kube-proxy-daemonset=<namespace/name> naming it, or --kube-proxy-daemonset="" if kube-proxy was removed for good`,
			pn.Status.KubeProxyMode, kp.DaemonSet)
	}
	return ""
}

// kubeProxyConfiguredMode is the mode kube-proxy's pods start in: the
// DaemonSet's --proxy-mode flag, else its ConfigMap's mode; "" when the
// operator cannot tell (no ConfigMap configured or found, or one it
// cannot read: a change of kube-proxy's mode reports those).
func (p *pass) kubeProxyConfiguredMode() v1alpha1.ProxyMode {
	kp := p.in.KubeProxy
	if kp.ModeFlag != "" {
		return v1alpha1.ProxyMode(kp.ModeFlag)
	}
	if kp.Config == nil {
		return ""
	}
	c, err := kubeproxyconfig.Read(kp.Config, kp.configKey())
	if err != nil {
		return ""
	}
	return c.Mode
}

// wrongKubeProxyMode says why a node handed back to kube-proxy has failed
// because kube-proxy came back in another mode than the one its
// configuration was changed to ("" when it did not).
func (p *pass) wrongKubeProxyMode(pn *v1alpha1.ProxyNode) string {
	got := pn.Status.KubeProxyMode
	if p.expectKubeProxy == "" || pn.Spec.DesiredMode != v1alpha1.ModeKubeProxy || got == "" || got == p.expectKubeProxy {
		return ""
	}
	return fmt.Sprintf("kube-proxy came back in %s mode, not %s: its pod read another configuration (does its DaemonSet set --proxy-mode, or mount another ConfigMap?)", got, p.expectKubeProxy)
}
