package switcher

import (
	"fmt"
	"strings"

	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/facts"
)

// Events tells people what the switch does (a *events.Recorder): reason
// is what happened, action the switch it happened in.
type Events interface {
	Normal(reason, action, message string)
	Warning(reason, action, message string)
}

// Reasons of the events that are not a phase's name.
const (
	EventCleanedUp         = "CleanedUp"
	EventKubeProxyRemoved  = "KubeProxyLeftoversRemoved"
	EventKubeProxyServing  = "KubeProxyServing"
	EventRolledBack        = "RolledBack"
	maxRemovedNamesInEvent = 10
)

// action names the switch to mode, the events' action.
func action(mode v1alpha1.ProxyMode) string {
	return "Switch to " + orNothing(mode)
}

// tell records an event, when the switcher has somewhere to tell it.
func (s *Switcher) tell(warning bool, reason string, mode v1alpha1.ProxyMode, format string, args ...any) {
	if s.cfg.Events == nil {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if warning {
		s.cfg.Events.Warning(reason, action(mode), msg)
	} else {
		s.cfg.Events.Normal(reason, action(mode), msg)
	}
}

// tellPhase tells that the phase of st starts, with step its work.
func (s *Switcher) tellPhase(st State, step Step) {
	t, prev := st.Target, orNothing(st.Previous)
	switch st.Phase {
	case v1alpha1.NodePreparing:
		if t == v1alpha1.ModeKubeProxy {
			s.tell(false, string(st.Phase), t, "handing the node back to kube-proxy from %s: taking a probe baseline through %s", prev, prev)
			return
		}
		if st.Previous == "" {
			s.tell(false, string(st.Phase), t, "switching from nothing to %s: loading the kernel modules %s needs", t, t)
			return
		}
		s.tell(false, string(st.Phase), t, "switching from %s to %s: taking a probe baseline through %s, loading the kernel modules %s needs", prev, t, prev, t)
	case v1alpha1.NodeProgramming:
		if st.Previous == "" {
			s.tell(false, string(st.Phase), t, "programming %s (nothing served the node before)", t)
			return
		}
		s.tell(false, string(st.Phase), t, "programming %s next to %s, which keeps serving", t, prev)
	case v1alpha1.NodeVerifying:
		probed := "the services that answered through " + prev
		if st.Previous == "" {
			probed = "a sample of the services"
		}
		s.tell(false, string(st.Phase), t, "verifying %s: checking its objects against its last sync and probing %s", t, probed)
	case v1alpha1.NodeWaitingForKubeProxy:
		if t == v1alpha1.ModeKubeProxy {
			s.tell(false, string(st.Phase), t, "waiting for kube-proxy's pod to come back and sync its rules; %s keeps serving meanwhile", prev)
			return
		}
		s.tell(false, string(st.Phase), t, "%s is programmed, verified and serves; waiting for kube-proxy's pod to leave the node (spec.kubeProxyStopped) before removing kube-proxy's rules", t)
	case v1alpha1.NodeCleaningUp:
		remove := strings.Join(modeNames(step.Remove), ", ")
		if remove == "" {
			remove = "nothing (no other mode is programmed)"
		}
		s.tell(false, string(st.Phase), t, "%s verified; removing %s", t, remove)
	case v1alpha1.NodeActive:
		if t == v1alpha1.ModeKubeProxy {
			s.tell(false, string(st.Phase), t, "kube-proxy serves the node again")
			return
		}
		s.tell(false, string(st.Phase), t, "%s serves the node", t)
	case v1alpha1.NodeFailed:
		s.mu.Lock()
		why := ""
		if s.failure != nil {
			why = fmt.Sprintf(" (%s)", s.failure.Reason)
		}
		s.mu.Unlock()
		s.tell(true, string(st.Phase), step.Mode, "the switch to %s failed%s; %s serves the node; change the spec to try again", step.Mode, why, orNothing(st.Target))
	}
}

// tellFailure tells that the work of phase failed.
func (s *Switcher) tellFailure(st State, step Step, fe *facts.Error) {
	s.tell(true, fe.Reason, step.Mode, "%s failed: %s", st.Phase, fe.Message)
}

// tellRemoved tells what a cleanup removed (the first few objects, and
// how many there were).
func (s *Switcher) tellRemoved(reason string, target v1alpha1.ProxyMode, what string, removed []string) {
	list := strings.Join(removed[:min(len(removed), maxRemovedNamesInEvent)], ", ")
	if more := len(removed) - maxRemovedNamesInEvent; more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	if len(removed) == 0 {
		list = "nothing was left"
	}
	s.tell(false, reason, target, "removed %s (%d objects): %s", what, len(removed), list)
}

// maxRemovedNamesInLog bounds the objects a removal's log line names: a
// switch out of iptables at 10 000 services removes 110 000 chains, which
// made one line of 6 MB. The line always counts them all; at -v=2 another
// line names every one.
const maxRemovedNamesInLog = 100

// logRemoved logs a removal (msg, with keysAndValues) and what it
// removed, see removedLogValues.
func logRemoved(msg string, removed []string, keysAndValues ...any) {
	klog.InfoS(msg, append(keysAndValues, removedLogValues(removed)...)...)
	if len(removed) > maxRemovedNamesInLog {
		klog.V(2).InfoS(msg+", every object", append(keysAndValues, "objects", removed)...)
	}
}

// removedLogValues are the key/value pairs that say what a removal
// removed: how many objects, the first maxRemovedNamesInLog of them, and
// how many more there were (when there were).
func removedLogValues(removed []string) []any {
	kv := []any{"count", len(removed), "objects", removed[:min(len(removed), maxRemovedNamesInLog)]}
	if more := len(removed) - maxRemovedNamesInLog; more > 0 {
		kv = append(kv, "more", more)
	}
	return kv
}

func orNothing(m v1alpha1.ProxyMode) string {
	if m == "" {
		return "nothing"
	}
	return string(m)
}
