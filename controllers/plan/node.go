package plan

import (
	"fmt"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// nodeState is one selected, non-conflicting node as the planner sees it.
type nodeState struct {
	name string
	node Node
	pn   *v1alpha1.ProxyNode // nil when it does not exist (yet)

	atTarget     bool // spec carries the target mode and settings
	converged    bool // status reflects spec: active, healthy, same config generation
	inTransition bool // spec set but not (yet) reflected by status
	failed       bool
	failReason   string
	deadline     time.Time // when an in-transition node times out

	member     bool // moved by the current rollout
	rolledBack bool // sent back by the current rollout

	reported       bool // kernel facts present
	reportDeadline time.Time
}

// Converged says whether a ProxyNode's status reflects its spec: the agent
// acted on this very spec (same config name and generation), runs the
// desired mode, is Active and healthy. A ProxyNode with no desired mode
// never converges (and is never in transition).
func Converged(pn *v1alpha1.ProxyNode) bool {
	s, st := &pn.Spec, &pn.Status
	if s.DesiredMode == "" || s.ConfigRef == nil || st.ObservedConfig == nil {
		return false
	}
	if *st.ObservedConfig != *s.ConfigRef || st.ActiveMode != s.DesiredMode || st.Phase != v1alpha1.NodeActive {
		return false
	}
	ok, _ := contract.Healthy(&pn.Status)
	return ok
}

// InTransition says whether a ProxyNode has a desired mode its status does
// not reflect yet. Failed nodes are in transition too: they are unavailable
// and count against maxUnavailable.
func InTransition(pn *v1alpha1.ProxyNode) bool {
	return pn.Spec.DesiredMode != "" && !Converged(pn)
}

// sameContent says whether a ProxyNode spec already asks for this mode with
// these settings (the config reference is not compared: a change of the
// rollout policy alone does not move nodes).
func sameContent(s *v1alpha1.ProxyNodeSpec, mode v1alpha1.ProxyMode, settings *v1alpha1.ProxySettings) bool {
	return s.DesiredMode == mode && apiequality.Semantic.DeepEqual(s.Settings, *settings)
}

// requestedAt is when the operator last changed the spec, from the
// annotation, or the object's creation when it is absent or unreadable.
func requestedAt(pn *v1alpha1.ProxyNode) time.Time {
	if v, ok := pn.Annotations[AnnotationRequestedAt]; ok {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t
		}
	}
	return pn.CreationTimestamp.Time
}

// failure decides whether an in-transition node has failed, and why.
func failure(pn *v1alpha1.ProxyNode, timeout time.Duration, now time.Time) (bool, string, time.Time) {
	s, st := &pn.Spec, &pn.Status
	deadline := requestedAt(pn).Add(timeout)
	if s.ConfigRef != nil && st.ObservedConfig != nil && *st.ObservedConfig == *s.ConfigRef {
		// The agent acted on this spec: believe what it says.
		if st.Phase == v1alpha1.NodeFailed {
			why := fmt.Sprintf("agent reported phase Failed switching to %s", s.DesiredMode)
			if _, c := contract.Healthy(st); c != "" {
				why += ": " + c
			} else if m := firstFalseMessage(st.Conditions); m != "" {
				why += ": " + m
			}
			return true, why, deadline
		}
		// A node that observed this config and switches again (it is
		// not Active: a re-programming after a change of its resolved
		// settings) is Ready=False only because it is switching: that is
		// progress, which the deadline bounds, not a failure.
		if ok, why := contract.Healthy(st); !ok && !switchingOnly(st) {
			return true, why, deadline
		}
		if st.Phase == v1alpha1.NodeActive && st.ActiveMode != s.DesiredMode {
			return true, fmt.Sprintf("agent runs %s, not the requested %s (no silent fallback)", orNone(st.ActiveMode), s.DesiredMode), deadline
		}
	}
	if !now.Before(deadline) {
		return true, fmt.Sprintf("did not become Active in %s within %s (phase %s, active mode %s)",
			s.DesiredMode, timeout, orNone(v1alpha1.ProxyMode(st.Phase)), orNone(st.ActiveMode)), deadline
	}
	return false, "", deadline
}

// switchingOnly says the node's only unhealthy condition is Ready=False
// for the reason Switching, in a phase of a switch.
func switchingOnly(st *v1alpha1.ProxyNodeStatus) bool {
	if st.Phase == v1alpha1.NodeActive || st.Phase == v1alpha1.NodeFailed {
		return false
	}
	for _, c := range st.Conditions {
		switch {
		case c.Type == contract.ConditionReady && c.Status == metav1.ConditionFalse && c.Reason != contract.ReasonSwitching,
			c.Type == contract.ConditionDegraded && c.Status == metav1.ConditionTrue:
			return false
		}
	}
	return true
}

func firstFalseMessage(cs []metav1.Condition) string {
	for _, c := range cs {
		if c.Status == metav1.ConditionFalse || c.Type == contract.ConditionDegraded && c.Status == metav1.ConditionTrue {
			return contract.ConditionText(c)
		}
	}
	return ""
}

func orNone(m v1alpha1.ProxyMode) string {
	if m == "" {
		return "none"
	}
	return string(m)
}

// ownedByOtherNode says whether the ProxyNode belongs to an earlier Node of
// the same name (its Node owner reference has another UID).
func ownedByOtherNode(pn *v1alpha1.ProxyNode, n Node) bool {
	if n.UID == "" {
		return false
	}
	for _, o := range pn.OwnerReferences {
		if o.Kind == "Node" && o.APIVersion == "v1" && o.Name == n.Name && o.UID != "" && o.UID != n.UID {
			return true
		}
	}
	return false
}

// NewProxyNode is the ProxyNode a node gets before anything asks it for a
// mode: no spec, owned by its Node so the garbage collector removes it
// with the Node.
func NewProxyNode(n Node) *v1alpha1.ProxyNode {
	return &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: n.Name, OwnerReferences: []metav1.OwnerReference{nodeOwnerRef(n)}}}
}

// nodeOwnerRef is the owner reference that lets the garbage collector
// delete a ProxyNode with its Node.
func nodeOwnerRef(n Node) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}
}

func hasOwnerRef(pn *v1alpha1.ProxyNode, n Node) bool {
	for _, o := range pn.OwnerReferences {
		if o.Kind == "Node" && o.APIVersion == "v1" && o.UID == n.UID {
			return true
		}
	}
	return false
}
