package switcher

import (
	"slices"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Action is what the switcher does next.
type Action string

// The actions, one per phase of a switch, plus the two outside a switch.
const (
	// Wait does nothing until the input changes (no mode desired, or a
	// failed desire held until the spec changes).
	Wait Action = "Wait"
	// Serve keeps the target mode synced: the steady state.
	Serve Action = "Serve"
	// Prepare loads the modules the target needs and fails closed.
	Prepare Action = "Prepare"
	// Program fully syncs the target while the old mode keeps serving.
	Program Action = "Program"
	// Verify compares what the kernel holds with the model and probes
	// services from the node.
	Verify Action = "Verify"
	// AwaitKubeProxy waits, handing a node back, until kube-proxy's pod
	// is back on the node and has synced its rules.
	AwaitKubeProxy Action = "AwaitKubeProxy"
	// CleanUp removes the modes in Step.Remove (kube-proxy's leftovers
	// when it is among them).
	CleanUp Action = "CleanUp"
	// Rollback leaves Step.Restore serving and removes the target.
	Rollback Action = "Rollback"
)

// State is where the switcher stands between steps.
type State struct {
	// Phase is the phase reported; "" before the first decision.
	Phase v1alpha1.NodePhase
	// Target is the mode being switched to, or the mode that serves when
	// Active or Failed ("" when none does).
	Target v1alpha1.ProxyMode
	// Previous is the mode that served when the switch began ("" none);
	// a failed switch returns to it.
	Previous v1alpha1.ProxyMode
}

// Input is what the world says at a decision point.
type Input struct {
	// Desired is the mode asked for ("" when nothing is);
	// v1alpha1.ModeKubeProxy hands the node back to kube-proxy.
	Desired v1alpha1.ProxyMode
	// Reconfigure says the desired settings differ from those the
	// serving instance of Desired runs with.
	Reconfigure bool
	// Present are the modes whose objects the kernel holds;
	// v1alpha1.ModeKubeProxy stands for kube-proxy's, in whatever mode.
	Present []v1alpha1.ProxyMode
	// Held says the switch to Desired already failed for this spec: it is
	// not tried again until the spec changes.
	Held bool
	// Resume says a previous agent was interrupted in the middle of a
	// switch (its last reported phase): the switch is finished properly
	// even if only the desired mode is left in the kernel.
	Resume bool
	// KubeProxyStopped says kube-proxy's pod has left the node for good
	// (the operator's word): its objects, if present, are leftovers that
	// a switch removes once the desired mode is verified, and nothing can
	// hand the node back to them.
	KubeProxyStopped bool
}

// Result is the outcome of the last step.
type Result int

// Step outcomes.
const (
	// None: no step ran (first decision, or the input changed while
	// waiting or serving).
	None Result = iota
	Succeeded
	Failed
)

// Step is the decided next step.
type Step struct {
	Action Action
	// Mode is the target of the step.
	Mode v1alpha1.ProxyMode
	// Remove are the modes CleanUp removes, in this order.
	Remove []v1alpha1.ProxyMode
	// Cutover says removing Remove moves new connections to Mode: one of
	// them was ahead of Mode in netfilter's hook order, so Mode is only
	// proven to carry traffic afterwards (CleanUp probes again).
	Cutover bool
	// Restore is the mode Rollback leaves serving ("" none: Mode stays,
	// as nothing else could serve).
	Restore v1alpha1.ProxyMode
}

// rank orders the modes by where they take new connections in netfilter:
// lower ranks see a connection first and bind its NAT, so that mode
// serves when several are programmed. nftables' nat chains are at
// priority -110 (dstnat-10), ahead of iptables' nat table at -100 (legacy
// or nft), and both translate at prerouting/output, ahead of IPVS, which
// takes connections only at the input hook. kube-proxy translates at -100
// in any of its modes that matter here (its iptables mode in either
// backend, its nftables mode at dstnat; its IPVS mode cannot share a
// Service address with proxyshift's): behind proxyshift's nftables, level
// with proxyshift's iptables, where the order of the jumps in the same
// built-in chain, or of two backends' hooks, decides. It ranks just
// behind iptables, so proxyshift's iptables is taken to serve, but Ahead
// never says which of the two wins (see contested).
var rank = map[v1alpha1.ProxyMode]int{
	v1alpha1.ModeNFTables:  0,
	v1alpha1.ModeIPTables:  2,
	v1alpha1.ModeKubeProxy: 3,
	v1alpha1.ModeIPVS:      4,
}

// contested says whether neither of a and b is known to take new
// connections first.
func contested(a, b v1alpha1.ProxyMode) bool {
	pair := func(x, y v1alpha1.ProxyMode) bool { return a == x && b == y || a == y && b == x }
	return pair(v1alpha1.ModeIPTables, v1alpha1.ModeKubeProxy)
}

// Ahead says whether mode a takes new connections before mode b when both
// are programmed (false when that is contested).
func Ahead(a, b v1alpha1.ProxyMode) bool { return rank[a] < rank[b] && !contested(a, b) }

// cutover says whether removing remove may move new connections to
// target: one of them is, or may be, ahead of it, so target is only proven
// to carry traffic once they are gone.
func cutover(target v1alpha1.ProxyMode, remove []v1alpha1.ProxyMode) bool {
	return slices.ContainsFunc(remove, func(m v1alpha1.ProxyMode) bool { return !Ahead(target, m) })
}

// Serving is the mode that takes new connections among present: the one
// ahead of the others; "" when none is present.
func Serving(present []v1alpha1.ProxyMode) v1alpha1.ProxyMode {
	var best v1alpha1.ProxyMode
	for _, m := range present {
		if best == "" || Ahead(m, best) {
			best = m
		}
	}
	return best
}

func switching(p v1alpha1.NodePhase) bool {
	switch p {
	case v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeWaitingForKubeProxy, v1alpha1.NodeCleaningUp:
		return true
	}
	return false
}

// Switching says whether phase is one of a switch in progress.
func Switching(p v1alpha1.NodePhase) bool { return switching(p) }

func without(ms []v1alpha1.ProxyMode, m v1alpha1.ProxyMode) []v1alpha1.ProxyMode {
	var out []v1alpha1.ProxyMode
	for _, x := range ms {
		if x != m {
			out = append(out, x)
		}
	}
	return out
}

// Next decides the next state and step from the current state, the input
// and the outcome of the last step. It is the whole switch protocol; the
// Switcher only carries steps out.
//
//   - A failed step of a switch ends it: Failed, and Rollback to the mode
//     that served before (nothing of it was removed unless CleanUp cut
//     over, and Rollback programs it again first).
//   - A successful step moves to the next phase: Preparing, Programming,
//     Verifying, CleaningUp (remove every other present mode), Active.
//   - If the desired mode changes during a switch, a new switch to it
//     starts from Preparing; what it finds programmed is cleaned up in
//     its CleaningUp, so nothing of the abandoned target is left.
//   - Outside a switch, a desired mode that alone is present, with the
//     same settings, is served as it is: a restart does not switch. Any
//     other case starts a switch, without removing anything first.
//   - A desire that failed (Held) is not tried again: the mode that
//     serves keeps serving, and leftovers of the failed target found at
//     start are rolled back, unless only kube-proxy's stale leftovers
//     (kube-proxy stopped) could take over: then the target stays.
func Next(s State, in Input, r Result) (State, Step) {
	present := slices.Clone(in.Present)
	slices.SortFunc(present, func(a, b v1alpha1.ProxyMode) int { return rank[a] - rank[b] })

	if switching(s.Phase) {
		if r == Failed {
			restore := s.Previous
			if restore == v1alpha1.ModeKubeProxy && (in.KubeProxyStopped || !slices.Contains(present, restore)) {
				// kube-proxy's rules are gone, or stale with no
				// kube-proxy to update them: the target keeps serving.
				restore = ""
			}
			next := State{Phase: v1alpha1.NodeFailed, Target: restore}
			if restore == "" {
				next.Target = s.Target
			}
			return next, Step{Action: Rollback, Mode: s.Target, Restore: restore}
		}
		if (r == Succeeded || s.Phase == v1alpha1.NodeWaitingForKubeProxy) && in.Desired != "" && in.Desired != s.Target {
			return start(in, present, s.Previous)
		}
		if r == None && s.Phase == v1alpha1.NodeWaitingForKubeProxy && s.Target != v1alpha1.ModeKubeProxy {
			// Taking over, waiting for the operator's word that
			// kube-proxy left: look again.
			r = Succeeded
		}
		if r == Succeeded {
			switch s.Phase {
			case v1alpha1.NodePreparing:
				if s.Target == v1alpha1.ModeKubeProxy {
					// Handing back: nothing to program; kube-proxy's pod
					// returns (the operator sees to it) and syncs.
					s.Phase = v1alpha1.NodeWaitingForKubeProxy
					return s, Step{Action: AwaitKubeProxy, Mode: s.Target}
				}
				s.Phase = v1alpha1.NodeProgramming
				return s, Step{Action: Program, Mode: s.Target}
			case v1alpha1.NodeProgramming:
				s.Phase = v1alpha1.NodeVerifying
				return s, Step{Action: Verify, Mode: s.Target}
			case v1alpha1.NodeVerifying, v1alpha1.NodeWaitingForKubeProxy:
				if s.Target != v1alpha1.ModeKubeProxy && slices.Contains(present, v1alpha1.ModeKubeProxy) && !in.KubeProxyStopped {
					// Taking over: the target serves; kube-proxy must
					// leave before its objects can go.
					s.Phase = v1alpha1.NodeWaitingForKubeProxy
					return s, Step{Action: Wait, Mode: s.Target}
				}
				s.Phase = v1alpha1.NodeCleaningUp
				return s, stepFor(s, present, in)
			case v1alpha1.NodeCleaningUp:
				return State{Phase: v1alpha1.NodeActive, Target: s.Target}, Step{Action: Serve, Mode: s.Target}
			}
		}
		// No outcome yet (the input changed in the middle of a step):
		// carry on with the step in hand.
		return s, stepFor(s, present, in)
	}

	if in.Desired == "" {
		if s.Phase == "" {
			switch m := Serving(present); m {
			case "":
				return State{Phase: v1alpha1.NodeIdle}, Step{Action: Wait}
			case v1alpha1.ModeKubeProxy:
				// Installing changes nothing: kube-proxy serves.
				return State{Phase: v1alpha1.NodeIdle, Target: m}, Step{Action: Wait}
			default:
				return State{Phase: v1alpha1.NodeActive, Target: m}, Step{Action: Serve, Mode: m}
			}
		}
		if s.Phase == v1alpha1.NodeIdle {
			// Nothing of proxyshift's serves: follow what kube-proxy's
			// objects in the kernel say.
			if slices.Contains(present, v1alpha1.ModeKubeProxy) {
				return State{Phase: v1alpha1.NodeIdle, Target: v1alpha1.ModeKubeProxy}, Step{Action: Wait}
			}
			return State{Phase: v1alpha1.NodeIdle}, Step{Action: Wait}
		}
		if s.Target != "" {
			return s, Step{Action: Serve, Mode: s.Target}
		}
		return s, Step{Action: Wait}
	}

	if in.Held {
		// What can serve: kube-proxy's objects only while kube-proxy runs
		// to keep them up to date. Stopped, they are stale leftovers a
		// failure never goes back to (see the switching branch); a
		// restarted agent must decide as the one that failed did.
		candidates := present
		if in.KubeProxyStopped {
			candidates = without(present, v1alpha1.ModeKubeProxy)
		}
		serving := s.Target
		if s.Phase == "" || !slices.Contains(candidates, serving) {
			serving = Serving(without(candidates, in.Desired))
		}
		if serving == "" {
			// Nothing else could serve: the failed target stays.
			serving = Serving(candidates)
		}
		if serving == "" {
			// Nothing of proxyshift's is left: kube-proxy's leftovers,
			// if any, are what the kernel holds.
			serving = Serving(present)
		}
		next := State{Phase: v1alpha1.NodeFailed, Target: serving}
		if serving != in.Desired && slices.Contains(present, in.Desired) {
			return next, Step{Action: Rollback, Mode: in.Desired, Restore: serving}
		}
		if serving == "" {
			return next, Step{Action: Wait}
		}
		return next, Step{Action: Serve, Mode: serving}
	}

	only := len(present) == 1 && present[0] == in.Desired
	if only && !in.Reconfigure && !(s.Phase == "" && in.Resume) {
		return State{Phase: v1alpha1.NodeActive, Target: in.Desired}, Step{Action: Serve, Mode: in.Desired}
	}
	var prev v1alpha1.ProxyMode
	if s.Phase == v1alpha1.NodeActive || s.Phase == v1alpha1.NodeFailed {
		prev = s.Target
	}
	return start(in, present, prev)
}

// start begins a switch to in.Desired. prev is the mode known to serve;
// when it is unknown or gone, it is the mode ahead among the present
// others, or else the desired mode itself if it is present (a failure
// then keeps it, with the settings it had).
func start(in Input, present []v1alpha1.ProxyMode, prev v1alpha1.ProxyMode) (State, Step) {
	if in.Desired == v1alpha1.ModeKubeProxy && prev == in.Desired {
		// Handing back in the middle of a takeover: what serves is
		// the mode proxyshift programmed.
		prev = ""
	}
	if in.KubeProxyStopped && prev == v1alpha1.ModeKubeProxy {
		// kube-proxy has left: its objects are stale leftovers, not a
		// mode that serves (or that a failure could go back to).
		prev = ""
	}
	if prev == "" || !slices.Contains(present, prev) {
		others := without(present, in.Desired)
		if in.KubeProxyStopped {
			others = without(others, v1alpha1.ModeKubeProxy)
		}
		prev = Serving(others)
		if prev == "" && slices.Contains(present, in.Desired) {
			prev = in.Desired
		}
	}
	return State{Phase: v1alpha1.NodePreparing, Target: in.Desired, Previous: prev}, Step{Action: Prepare, Mode: in.Desired}
}

// stepFor is the step of a phase, for redoing it.
func stepFor(s State, present []v1alpha1.ProxyMode, in Input) Step {
	switch s.Phase {
	case v1alpha1.NodePreparing:
		return Step{Action: Prepare, Mode: s.Target}
	case v1alpha1.NodeProgramming:
		return Step{Action: Program, Mode: s.Target}
	case v1alpha1.NodeVerifying:
		return Step{Action: Verify, Mode: s.Target}
	case v1alpha1.NodeWaitingForKubeProxy:
		if s.Target == v1alpha1.ModeKubeProxy {
			return Step{Action: AwaitKubeProxy, Mode: s.Target}
		}
		return Step{Action: Wait, Mode: s.Target}
	case v1alpha1.NodeCleaningUp:
		remove := without(present, s.Target)
		if !in.KubeProxyStopped {
			// kube-proxy's objects go only once it has left the node.
			remove = without(remove, v1alpha1.ModeKubeProxy)
		}
		return Step{Action: CleanUp, Mode: s.Target, Remove: remove, Cutover: cutover(s.Target, remove)}
	}
	return Step{Action: Wait}
}
