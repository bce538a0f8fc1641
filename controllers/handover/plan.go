package handover

import (
	"fmt"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Need is what a node needs of kube-proxy.
type Need int

// What a node needs of kube-proxy; see the package doc.
const (
	// Keep: leave the node's label as it is.
	Keep Need = iota
	// Off: kube-proxy must leave the node.
	Off
	// On: kube-proxy must run on the node.
	On
)

// Want says what the node of this ProxyNode needs of kube-proxy.
func Want(pn *v1alpha1.ProxyNode) Need {
	desired, active := pn.Spec.DesiredMode, pn.Status.ActiveMode
	switch {
	case contract.ValidMode(desired):
		if pn.Status.Phase == v1alpha1.NodeWaitingForKubeProxy || contract.ValidMode(active) {
			return Off
		}
	case desired == v1alpha1.ModeKubeProxy:
		return On
	case desired == "" && contract.ValidMode(active):
		return Off
	case desired == "" && active == v1alpha1.ModeKubeProxy:
		return On
	}
	return Keep
}

// Pod is what the planner needs of a pod in the DaemonSet's namespace.
type Pod struct {
	// Labels are matched against the DaemonSet's selector.
	Labels map[string]string
	// Node is the node it is bound to (spec.nodeName); empty when not
	// scheduled yet.
	Node string
}

// Input is what the planner looks at. It never modifies it.
type Input struct {
	// DaemonSetName is the configured DaemonSet, "namespace/name"; empty
	// when the operator was told this cluster has no kube-proxy
	// (--kube-proxy-daemonset="").
	DaemonSetName string
	// DaemonSet is kube-proxy's DaemonSet; nil when it was not found.
	DaemonSet *appsv1.DaemonSet
	// Pods are the pods of the DaemonSet's namespace (those its selector
	// matches are kube-proxy's).
	Pods []Pod
	// Labelled are the nodes carrying LabelKey=LabelValue, by name.
	Labelled map[string]bool
	// Nodes are the cluster's nodes by name (only those can be labelled).
	Nodes map[string]bool
	// ProxyNodes are the ProxyNodes by name.
	ProxyNodes map[string]*v1alpha1.ProxyNode
}

// Event reasons. The node events are about a ProxyNode, the others about
// the DaemonSet.
const (
	EventStopping          = "KubeProxyStopping"          // the node was labelled
	EventStopped           = "KubeProxyStopped"           // its kube-proxy pod is gone
	EventReturning         = "KubeProxyReturning"         // the label was removed
	EventAffinityAdded     = "KubeProxyAffinityAdded"     // the DaemonSet excludes labelled nodes
	EventAffinityRemoved   = "KubeProxyAffinityRemoved"   // it no longer does
	EventStrategyRestored  = "KubeProxyStrategyRestored"  // its update strategy is back
	EventDaemonSetNotFound = "KubeProxyDaemonSetNotFound" // conflict: kube-proxy's rules, no DaemonSet
)

// Event is an event to record; Node names the ProxyNode it is about, or
// is empty for the DaemonSet.
type Event struct {
	// Warning is true for Warning events, false for Normal ones.
	Warning bool
	// Reason is one of the Event* reasons.
	Reason string
	// Node names the node (and ProxyNode) the event is about, if any.
	Node string
	// Message says what happened, naming the node.
	Message string
	// After is the write the event announces (WriteDaemonSet, or
	// NodeWrite or ProxyNodeWrite of a node): it is recorded only once
	// that write succeeded. Empty: recorded at once.
	After string
}

// WriteDaemonSet names the write of Result.DaemonSet.
const WriteDaemonSet = "DaemonSet"

// NodeWrite names the write of a node's label.
func NodeWrite(node string) string { return "Node/" + node }

// ProxyNodeWrite names the write of a ProxyNode's spec.kubeProxyStopped.
func ProxyNodeWrite(node string) string { return "ProxyNode/" + node }

// Result is what to write.
type Result struct {
	// DaemonSet is the modified copy of the input's DaemonSet to update
	// (same resourceVersion), or nil.
	DaemonSet *appsv1.DaemonSet
	// Label and Unlabel name the nodes to add the label to and remove it
	// from, sorted.
	Label, Unlabel []string
	// ProxyNodes are modified copies (same resourceVersion) whose
	// spec.kubeProxyStopped changes.
	ProxyNodes []*v1alpha1.ProxyNode
	// Events are the events of this pass.
	Events []Event
	// Conflicts name the nodes that report kube-proxy's objects while its
	// DaemonSet is missing, sorted.
	Conflicts []string
}

// Plan decides one pass of the handover: see the package doc.
func Plan(in Input) Result {
	var res Result
	names := make([]string, 0, len(in.ProxyNodes))
	for name := range in.ProxyNodes {
		names = append(names, name)
	}
	sort.Strings(names)
	if in.DaemonSetName == "" {
		for _, name := range names {
			res.setStopped(in.ProxyNodes[name], true)
		}
		return res
	}
	ds := in.DaemonSet
	if ds == nil {
		for _, name := range names {
			if m := in.ProxyNodes[name].Status.KubeProxyMode; m != "" {
				res.Conflicts = append(res.Conflicts, name)
				res.Events = append(res.Events, Event{Warning: true, Reason: EventDaemonSetNotFound, Node: name,
					Message: fmt.Sprintf("%s holds kube-proxy's %s rules but kube-proxy's DaemonSet %s was not found; nothing is changed: "+
						"pass --kube-proxy-daemonset=<namespace/name> naming it, or --kube-proxy-daemonset=\"\" if kube-proxy was removed for good",
						name, m, in.DaemonSetName)})
			}
		}
		return res
	}

	podOn := kubeProxyNodes(ds, in.Pods)
	affinity := HasAffinity(ds)
	anyOff, anyLabelled := false, false
	for _, name := range names {
		pn := in.ProxyNodes[name]
		labelled := in.Labelled[name]
		switch Want(pn) {
		case Off:
			anyOff = true
			if !labelled && affinity && in.Nodes[name] {
				res.Label = append(res.Label, name)
				res.Events = append(res.Events, Event{Reason: EventStopping, Node: name, After: NodeWrite(name),
					Message: fmt.Sprintf("%s: proxyshift serves the node; kube-proxy is leaving it (label %s=%s)", name, LabelKey, LabelValue)})
			}
		case On:
			if labelled {
				labelled = false
				res.Unlabel = append(res.Unlabel, name)
				res.Events = append(res.Events, Event{Reason: EventReturning, Node: name, After: NodeWrite(name),
					Message: fmt.Sprintf("%s: kube-proxy is coming back to the node (label %s removed)", name, LabelKey)})
			}
		}
		anyLabelled = anyLabelled || in.Labelled[name] // removed labels count until the cache shows them gone
		stopped := labelled && !podOn[name]
		if stopped && !pn.Spec.KubeProxyStopped {
			res.Events = append(res.Events, Event{Reason: EventStopped, Node: name, After: ProxyNodeWrite(name),
				Message: fmt.Sprintf("%s: kube-proxy's pod has left the node", name)})
		}
		res.setStopped(pn, stopped)
	}
	for name, l := range in.Labelled {
		if l && in.ProxyNodes[name] == nil {
			anyLabelled = true // a node whose ProxyNode is not there (yet)
		}
	}

	_, ours := ds.Annotations[AnnotationAffinity]
	switch {
	case anyOff || anyLabelled:
		if !affinity {
			res.DaemonSet = ds.DeepCopy()
			addAffinity(res.DaemonSet)
			res.Events = append(res.Events, Event{Reason: EventAffinityAdded, After: WriteDaemonSet,
				Message: fmt.Sprintf("kube-proxy's pods no longer run on nodes labelled %s=%s", LabelKey, LabelValue)})
		}
	case ours:
		res.DaemonSet = ds.DeepCopy()
		removeAffinity(res.DaemonSet)
		res.Events = append(res.Events, Event{Reason: EventAffinityRemoved, After: WriteDaemonSet,
			Message: fmt.Sprintf("kube-proxy's pods may run on every node again (node affinity on %s removed)", LabelKey)})
	case !affinity && ds.Annotations[AnnotationStrategy] != "" && rolled(ds):
		res.DaemonSet = ds.DeepCopy()
		restoreStrategy(res.DaemonSet)
		res.Events = append(res.Events, Event{Reason: EventStrategyRestored, After: WriteDaemonSet,
			Message: "kube-proxy's pods are back on every node; its update strategy is as it was"})
	}
	return res
}

// setStopped adds a copy of pn with spec.kubeProxyStopped = v when it
// differs.
func (r *Result) setStopped(pn *v1alpha1.ProxyNode, v bool) {
	if pn.Spec.KubeProxyStopped == v {
		return
	}
	c := pn.DeepCopy()
	c.Spec.KubeProxyStopped = v
	r.ProxyNodes = append(r.ProxyNodes, c)
}

// kubeProxyNodes are the nodes a pod of the DaemonSet is bound to
// (terminating ones included: kube-proxy may still be running). An
// unusable selector matches every pod, so nothing counts as stopped.
func kubeProxyNodes(ds *appsv1.DaemonSet, pods []Pod) map[string]bool {
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || ds.Spec.Selector == nil {
		sel = labels.Everything()
	}
	out := map[string]bool{}
	for _, p := range pods {
		if p.Node != "" && sel.Matches(labels.Set(p.Labels)) {
			out[p.Node] = true
		}
	}
	return out
}
