package switcher

import (
	"fmt"
	"slices"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

const (
	ipt  = v1alpha1.ModeIPTables
	nft  = v1alpha1.ModeNFTables
	ipvs = v1alpha1.ModeIPVS
	kp   = v1alpha1.ModeKubeProxy
)

var allModes = []v1alpha1.ProxyMode{ipt, nft, ipvs}

func TestServingIsTheModeAhead(t *testing.T) {
	for _, tc := range []struct {
		present []v1alpha1.ProxyMode
		want    v1alpha1.ProxyMode
	}{
		{nil, ""},
		{[]v1alpha1.ProxyMode{ipt}, ipt},
		{[]v1alpha1.ProxyMode{ipt, nft}, nft},
		{[]v1alpha1.ProxyMode{ipvs, ipt}, ipt},
		{[]v1alpha1.ProxyMode{ipvs, nft, ipt}, nft},
	} {
		if got := Serving(tc.present); got != tc.want {
			t.Errorf("Serving(%v) = %q, want %q", tc.present, got, tc.want)
		}
	}
}

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name     string
		s        State
		in       Input
		r        Result
		want     State
		wantStep Step
	}{
		{
			name:     "restart with only the desired mode serves it without a switch",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft}},
			want:     State{Phase: v1alpha1.NodeActive, Target: nft},
			wantStep: Step{Action: Serve, Mode: nft},
		},
		{
			name:     "fresh node switches from nothing",
			in:       Input{Desired: nft},
			want:     State{Phase: v1alpha1.NodePreparing, Target: nft},
			wantStep: Step{Action: Prepare, Mode: nft},
		},
		{
			name:     "start with another mode present switches from it",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{ipt}},
			want:     State{Phase: v1alpha1.NodePreparing, Target: nft, Previous: ipt},
			wantStep: Step{Action: Prepare, Mode: nft},
		},
		{
			name:     "restart with both modes resumes the switch, restoring the other on failure",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{ipt, nft}},
			want:     State{Phase: v1alpha1.NodePreparing, Target: nft, Previous: ipt},
			wantStep: Step{Action: Prepare, Mode: nft},
		},
		{
			name:     "restart interrupted after cleanup finishes the switch",
			in:       Input{Desired: ipt, Present: []v1alpha1.ProxyMode{ipt}, Resume: true},
			want:     State{Phase: v1alpha1.NodePreparing, Target: ipt, Previous: ipt},
			wantStep: Step{Action: Prepare, Mode: ipt},
		},
		{
			name:     "active node asked for another mode switches",
			s:        State{Phase: v1alpha1.NodeActive, Target: ipt},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{ipt}},
			want:     State{Phase: v1alpha1.NodePreparing, Target: nft, Previous: ipt},
			wantStep: Step{Action: Prepare, Mode: nft},
		},
		{
			name:     "new settings of the same mode reconfigure it in place",
			s:        State{Phase: v1alpha1.NodeActive, Target: nft},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft}, Reconfigure: true},
			want:     State{Phase: v1alpha1.NodePreparing, Target: nft, Previous: nft},
			wantStep: Step{Action: Prepare, Mode: nft},
		},
		{
			name:     "kube-proxy's leftovers beside the desired mode: a switch removes them",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft, kp}, KubeProxyStopped: true},
			want:     State{Phase: v1alpha1.NodePreparing, Target: nft, Previous: nft},
			wantStep: Step{Action: Prepare, Mode: nft},
		},
		{
			name:     "takeover resumed after kube-proxy left: the target serves, not kube-proxy's stale objects",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft, kp}, KubeProxyStopped: true, Resume: true},
			want:     State{Phase: v1alpha1.NodePreparing, Target: nft, Previous: nft},
			wantStep: Step{Action: Prepare, Mode: nft},
		},
		{
			name:     "installing changes nothing: kube-proxy serves, the agent idles",
			in:       Input{Present: []v1alpha1.ProxyMode{kp}},
			want:     State{Phase: v1alpha1.NodeIdle, Target: kp},
			wantStep: Step{Action: Wait},
		},
		{
			name:     "idle node follows kube-proxy's objects going",
			s:        State{Phase: v1alpha1.NodeIdle, Target: kp},
			want:     State{Phase: v1alpha1.NodeIdle},
			wantStep: Step{Action: Wait},
		},
		{
			name:     "takeover: verified, kube-proxy still runs: wait for it to leave",
			s:        State{Phase: v1alpha1.NodeVerifying, Target: nft, Previous: kp},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft, kp}},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeWaitingForKubeProxy, Target: nft, Previous: kp},
			wantStep: Step{Action: Wait, Mode: nft},
		},
		{
			name:     "takeover: still waiting while kube-proxy runs",
			s:        State{Phase: v1alpha1.NodeWaitingForKubeProxy, Target: nft, Previous: kp},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft, kp}},
			want:     State{Phase: v1alpha1.NodeWaitingForKubeProxy, Target: nft, Previous: kp},
			wantStep: Step{Action: Wait, Mode: nft},
		},
		{
			name:     "takeover: kube-proxy left: its leftovers go, no cutover behind nftables",
			s:        State{Phase: v1alpha1.NodeWaitingForKubeProxy, Target: nft, Previous: kp},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft, kp}, KubeProxyStopped: true},
			want:     State{Phase: v1alpha1.NodeCleaningUp, Target: nft, Previous: kp},
			wantStep: Step{Action: CleanUp, Mode: nft, Remove: []v1alpha1.ProxyMode{kp}},
		},
		{
			name:     "takeover into iptables: kube-proxy's jumps may be first, so removing them is the cutover",
			s:        State{Phase: v1alpha1.NodeVerifying, Target: ipt, Previous: kp},
			in:       Input{Desired: ipt, Present: []v1alpha1.ProxyMode{ipt, kp}, KubeProxyStopped: true},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeCleaningUp, Target: ipt, Previous: kp},
			wantStep: Step{Action: CleanUp, Mode: ipt, Remove: []v1alpha1.ProxyMode{kp}, Cutover: true},
		},
		{
			name:     "takeover rolled back while waiting: hand the node back",
			s:        State{Phase: v1alpha1.NodeWaitingForKubeProxy, Target: nft, Previous: kp},
			in:       Input{Desired: kp, Present: []v1alpha1.ProxyMode{nft, kp}},
			want:     State{Phase: v1alpha1.NodePreparing, Target: kp, Previous: nft},
			wantStep: Step{Action: Prepare, Mode: kp},
		},
		{
			name:     "takeover fails before kube-proxy left: kube-proxy's rules serve again",
			s:        State{Phase: v1alpha1.NodeVerifying, Target: nft, Previous: kp},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft, kp}},
			r:        Failed,
			want:     State{Phase: v1alpha1.NodeFailed, Target: kp},
			wantStep: Step{Action: Rollback, Mode: nft, Restore: kp},
		},
		{
			name:     "takeover fails after kube-proxy left: the target keeps serving",
			s:        State{Phase: v1alpha1.NodeCleaningUp, Target: ipt, Previous: kp},
			in:       Input{Desired: ipt, Present: []v1alpha1.ProxyMode{ipt}, KubeProxyStopped: true},
			r:        Failed,
			want:     State{Phase: v1alpha1.NodeFailed, Target: ipt},
			wantStep: Step{Action: Rollback, Mode: ipt},
		},
		{
			name:     "hand-back: prepared, wait for kube-proxy to serve",
			s:        State{Phase: v1alpha1.NodePreparing, Target: kp, Previous: nft},
			in:       Input{Desired: kp, Present: []v1alpha1.ProxyMode{nft}},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeWaitingForKubeProxy, Target: kp, Previous: nft},
			wantStep: Step{Action: AwaitKubeProxy, Mode: kp},
		},
		{
			name:     "hand-back: kube-proxy serves: removing proxyshift's rules is the cutover",
			s:        State{Phase: v1alpha1.NodeWaitingForKubeProxy, Target: kp, Previous: ipt},
			in:       Input{Desired: kp, Present: []v1alpha1.ProxyMode{ipt, kp}},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeCleaningUp, Target: kp, Previous: ipt},
			wantStep: Step{Action: CleanUp, Mode: kp, Remove: []v1alpha1.ProxyMode{ipt}, Cutover: true},
		},
		{
			name:     "hand-back fails: proxyshift's mode is programmed again",
			s:        State{Phase: v1alpha1.NodeCleaningUp, Target: kp, Previous: nft},
			in:       Input{Desired: kp, Present: []v1alpha1.ProxyMode{kp}},
			r:        Failed,
			want:     State{Phase: v1alpha1.NodeFailed, Target: nft},
			wantStep: Step{Action: Rollback, Mode: kp, Restore: nft},
		},
		{
			name:     "verified target ahead of the old one: cleanup without cutover",
			s:        State{Phase: v1alpha1.NodeVerifying, Target: nft, Previous: ipt},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{ipt, nft}},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeCleaningUp, Target: nft, Previous: ipt},
			wantStep: Step{Action: CleanUp, Mode: nft, Remove: []v1alpha1.ProxyMode{ipt}},
		},
		{
			name:     "verified target behind the old one: cleanup is the cutover",
			s:        State{Phase: v1alpha1.NodeVerifying, Target: ipt, Previous: nft},
			in:       Input{Desired: ipt, Present: []v1alpha1.ProxyMode{ipt, nft}},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeCleaningUp, Target: ipt, Previous: nft},
			wantStep: Step{Action: CleanUp, Mode: ipt, Remove: []v1alpha1.ProxyMode{nft}, Cutover: true},
		},
		{
			name:     "failed verification rolls back to the previous mode",
			s:        State{Phase: v1alpha1.NodeVerifying, Target: nft, Previous: ipt},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{ipt, nft}},
			r:        Failed,
			want:     State{Phase: v1alpha1.NodeFailed, Target: ipt},
			wantStep: Step{Action: Rollback, Mode: nft, Restore: ipt},
		},
		{
			name:     "failure with nothing before keeps the target",
			s:        State{Phase: v1alpha1.NodeVerifying, Target: nft},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft}},
			r:        Failed,
			want:     State{Phase: v1alpha1.NodeFailed, Target: nft},
			wantStep: Step{Action: Rollback, Mode: nft},
		},
		{
			name:     "held failure keeps serving the old mode",
			s:        State{Phase: v1alpha1.NodeFailed, Target: ipt},
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{ipt}, Held: true},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeFailed, Target: ipt},
			wantStep: Step{Action: Serve, Mode: ipt},
		},
		{
			name:     "held failure at start removes the failed target's leftovers",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{ipt, nft}, Held: true},
			want:     State{Phase: v1alpha1.NodeFailed, Target: ipt},
			wantStep: Step{Action: Rollback, Mode: nft, Restore: ipt},
		},
		{
			name:     "held failure at start keeps the target over kube-proxy's stale leftovers",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft, kp}, Held: true, KubeProxyStopped: true},
			want:     State{Phase: v1alpha1.NodeFailed, Target: nft},
			wantStep: Step{Action: Serve, Mode: nft},
		},
		{
			name:     "held failure at start goes back to kube-proxy while it runs",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft, kp}, Held: true},
			want:     State{Phase: v1alpha1.NodeFailed, Target: kp},
			wantStep: Step{Action: Rollback, Mode: nft, Restore: kp},
		},
		{
			name:     "held failure back to kube-proxy that has stopped since keeps the target",
			s:        State{Phase: v1alpha1.NodeFailed, Target: kp},
			in:       Input{Desired: ipvs, Present: []v1alpha1.ProxyMode{ipvs, kp}, Held: true, KubeProxyStopped: true},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeFailed, Target: ipvs},
			wantStep: Step{Action: Serve, Mode: ipvs},
		},
		{
			name:     "desire changed in the middle of a switch starts over toward it",
			s:        State{Phase: v1alpha1.NodeProgramming, Target: nft, Previous: ipt},
			in:       Input{Desired: ipt, Present: []v1alpha1.ProxyMode{ipt, nft}},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodePreparing, Target: ipt, Previous: ipt},
			wantStep: Step{Action: Prepare, Mode: ipt},
		},
		{
			name:     "nothing desired at start serves what is there",
			in:       Input{Present: []v1alpha1.ProxyMode{ipt}},
			want:     State{Phase: v1alpha1.NodeActive, Target: ipt},
			wantStep: Step{Action: Serve, Mode: ipt},
		},
		{
			name:     "nothing desired and nothing there is idle",
			want:     State{Phase: v1alpha1.NodeIdle},
			wantStep: Step{Action: Wait},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, step := Next(tc.s, tc.in, tc.r)
			if got != tc.want || fmt.Sprint(step) != fmt.Sprint(tc.wantStep) {
				t.Errorf("Next(%+v, %+v, %v)\n = %+v, %+v\nwant %+v, %+v", tc.s, tc.in, tc.r, got, step, tc.want, tc.wantStep)
			}
		})
	}
}

// world is a fake kernel: the set of modes programmed, in the order they
// were programmed, for simulating the protocol.
type world struct {
	present []v1alpha1.ProxyMode
	// servedAlways is false once a step left nothing programmed although
	// something was before.
	servedAlways bool
	log          []string
}

func (w *world) has(m v1alpha1.ProxyMode) bool { return slices.Contains(w.present, m) }
func (w *world) add(m v1alpha1.ProxyMode) {
	if !w.has(m) {
		w.present = append(w.present, m)
	}
}
func (w *world) remove(m v1alpha1.ProxyMode) {
	w.present = without(w.present, m)
	if len(w.present) == 0 {
		w.servedAlways = false
	}
}

// apply carries out a step on the fake kernel. failAt makes the step of
// that phase fail.
func (w *world) apply(st State, step Step, failAt v1alpha1.NodePhase) Result {
	w.log = append(w.log, fmt.Sprintf("%s:%s", st.Phase, step.Action))
	if st.Phase == failAt && Switching(st.Phase) {
		return Failed
	}
	switch step.Action {
	case Program:
		w.add(step.Mode)
	case CleanUp:
		if !w.has(step.Mode) {
			panic("cleanup before the target is programmed")
		}
		for _, m := range step.Remove {
			w.remove(m)
		}
	case Rollback:
		if step.Restore != "" {
			w.add(step.Restore)
			if step.Restore != step.Mode {
				w.remove(step.Mode)
			}
		}
	case Serve, Wait:
		return None
	}
	return Succeeded
}

// run drives Next until it serves or waits, for at most 30 steps.
func (w *world) run(t *testing.T, s State, in func() Input, failAt v1alpha1.NodePhase, stopAfter v1alpha1.NodePhase) (State, Step, bool) {
	t.Helper()
	r := None
	for range 30 {
		var step Step
		s, step = Next(s, in(), r)
		r = w.apply(s, step, failAt)
		if s.Phase == stopAfter && Switching(s.Phase) {
			return s, step, true // killed after this phase's work
		}
		if step.Action == Serve || step.Action == Wait {
			return s, step, false
		}
	}
	t.Fatalf("no steady state after 30 steps: %v", w.log)
	return s, Step{}, false
}

// TestEveryPairConvergesFromEveryCrashPoint simulates every switch
// between two modes (and from none), killed after each phase, restarted
// from what the kernel holds: it must end Active in the target with
// nothing else programmed, and never leave the node with nothing
// programmed once something was.
func TestEveryPairConvergesFromEveryCrashPoint(t *testing.T) {
	phases := []v1alpha1.NodePhase{"", v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeCleaningUp}
	froms := append([]v1alpha1.ProxyMode{""}, allModes...)
	for _, from := range froms {
		for _, to := range allModes {
			if from == to {
				continue
			}
			for _, crash := range phases {
				t.Run(fmt.Sprintf("%s-to-%s-killed-after-%s", orNone(from), to, orNone(v1alpha1.ProxyMode(crash))), func(t *testing.T) {
					w := &world{servedAlways: true}
					if from != "" {
						w.present = []v1alpha1.ProxyMode{from}
					}
					in := func() Input { return Input{Desired: to, Present: slices.Clone(w.present)} }
					s := State{}
					if from != "" {
						s = State{Phase: v1alpha1.NodeActive, Target: from}
					}
					st, _, killed := w.run(t, s, in, "", crash)
					if crash != "" {
						if !killed {
							t.Fatalf("never reached %s: %v", crash, w.log)
						}
						// Restart: nothing but what the kernel holds and
						// that the last phase was mid-switch.
						resume := func() Input { i := in(); i.Resume = true; return i }
						st, _, _ = w.run(t, State{}, resume, "", "")
					}
					if st.Phase != v1alpha1.NodeActive || st.Target != to || !slices.Equal(w.present, []v1alpha1.ProxyMode{to}) {
						t.Errorf("ended %+v with %v programmed; want Active %s alone (steps %v)", st, w.present, to, w.log)
					}
					if from != "" && !w.servedAlways {
						t.Errorf("some step left nothing programmed: %v", w.log)
					}
				})
			}
		}
	}
}

// TestFailureInEveryPhaseLeavesTheOldModeServing injects a failure into
// each phase of each switch: the node ends Failed with only the old mode
// programmed, and does not try again while the desire is held.
func TestFailureInEveryPhaseLeavesTheOldModeServing(t *testing.T) {
	for _, from := range allModes {
		for _, to := range allModes {
			if from == to {
				continue
			}
			for _, failAt := range []v1alpha1.NodePhase{v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeCleaningUp} {
				t.Run(fmt.Sprintf("%s-to-%s-fails-in-%s", from, to, failAt), func(t *testing.T) {
					w := &world{servedAlways: true, present: []v1alpha1.ProxyMode{from}}
					held := false
					in := func() Input { return Input{Desired: to, Present: slices.Clone(w.present), Held: held} }
					s := State{Phase: v1alpha1.NodeActive, Target: from}
					r := None
					for range 10 {
						var step Step
						s, step = Next(s, in(), r)
						r = w.apply(s, step, failAt)
						if r == Failed {
							held = true // the switcher remembers the failure
						}
						if step.Action == Serve {
							break
						}
					}
					if s.Phase != v1alpha1.NodeFailed || s.Target != from || !slices.Equal(w.present, []v1alpha1.ProxyMode{from}) {
						t.Errorf("ended %+v with %v programmed; want Failed serving %s alone (steps %v)", s, w.present, from, w.log)
					}
					if !w.servedAlways {
						t.Errorf("some step left nothing programmed: %v", w.log)
					}
					// A new spec (no longer held) tries again.
					held = false
					s2, step := Next(s, in(), None)
					if s2.Phase != v1alpha1.NodePreparing || step.Action != Prepare || s2.Previous != from {
						t.Errorf("after the spec changed: %+v %+v; want a new switch from %s", s2, step, from)
					}
				})
			}
		}
	}
}

// TestRestartWhileHeldKeepsWhatTheRunningAgentServes fails each switch,
// from each mode, from nothing and from kube-proxy (running, or stopped
// with its rules left behind), in each phase, then restarts the agent
// while the failure is held: its first decision, from nothing but what
// the kernel holds, must keep serving the mode the running agent kept
// serving, and remove nothing of it. (A restart after a takeover with
// kube-proxy stopped used to roll the target back to kube-proxy's stale
// rules, which nothing updates.)
func TestRestartWhileHeldKeepsWhatTheRunningAgentServes(t *testing.T) {
	type origin struct {
		name    string
		present []v1alpha1.ProxyMode
		state   State
		stopped bool
	}
	origins := []origin{
		{name: "none"},
		{name: "kube-proxy", present: []v1alpha1.ProxyMode{kp}, state: State{Phase: v1alpha1.NodeIdle, Target: kp}},
		{name: "kube-proxy-stopped", present: []v1alpha1.ProxyMode{kp}, state: State{Phase: v1alpha1.NodeIdle, Target: kp}, stopped: true},
	}
	for _, m := range allModes {
		origins = append(origins, origin{name: string(m), present: []v1alpha1.ProxyMode{m}, state: State{Phase: v1alpha1.NodeActive, Target: m}})
		origins = append(origins, origin{name: string(m) + "-and-kube-proxy-stopped", present: []v1alpha1.ProxyMode{m, kp}, state: State{Phase: v1alpha1.NodeActive, Target: m}, stopped: true})
	}
	for _, from := range origins {
		for _, to := range allModes {
			if from.state.Target == to {
				continue
			}
			for _, failAt := range []v1alpha1.NodePhase{v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeCleaningUp} {
				if failAt == v1alpha1.NodeCleaningUp && slices.Contains(from.present, kp) && !from.stopped {
					continue // a takeover waits for kube-proxy to leave first
				}
				t.Run(fmt.Sprintf("%s-to-%s-fails-in-%s", from.name, to, failAt), func(t *testing.T) {
					w := &world{servedAlways: true, present: slices.Clone(from.present)}
					held := false
					in := func() Input {
						return Input{Desired: to, Present: slices.Clone(w.present), Held: held, KubeProxyStopped: from.stopped}
					}
					s, r := from.state, None
					for range 30 {
						var step Step
						s, step = Next(s, in(), r)
						r = w.apply(s, step, failAt)
						held = held || r == Failed
						if step.Action == Serve || step.Action == Wait {
							break
						}
					}
					if s.Phase != v1alpha1.NodeFailed {
						t.Fatalf("the switch did not fail: %+v (steps %v)", s, w.log)
					}
					kernel := slices.Clone(w.present)
					restarted, step := Next(State{}, in(), None)
					w.apply(restarted, step, "")
					if restarted.Target != s.Target {
						t.Errorf("with %v in the kernel, the running agent serves %s, a restarted one %s (%+v)", kernel, orNone(s.Target), orNone(restarted.Target), step)
					}
					if s.Target != "" && !w.has(s.Target) {
						t.Errorf("a restart removed %s, which the running agent kept serving: %+v left %v", s.Target, step, w.present)
					}
				})
			}
		}
	}
}

func orNone[S ~string](s S) string {
	if s == "" {
		return "none"
	}
	return string(s)
}

// kubeProxyWorld is the fake kernel of world with kube-proxy's pod beside
// it, and the operator's part: the pod leaves once the agent, taking the
// node over, waits for it (the operator labels the node), and returns
// once the node is to be handed back; spec.kubeProxyStopped follows the
// pod.
type kubeProxyWorld struct {
	world
	podRuns bool
}

func (w *kubeProxyWorld) input(desired v1alpha1.ProxyMode, resume bool) Input {
	return Input{Desired: desired, Present: slices.Clone(w.present), KubeProxyStopped: !w.podRuns, Resume: resume}
}

// apply carries a step out; it fails the test if kube-proxy's objects
// are removed while its pod runs, or if the node is ever left with
// nothing serving.
func (w *kubeProxyWorld) apply(t *testing.T, st State, step Step, desired v1alpha1.ProxyMode) Result {
	t.Helper()
	if desired == kp {
		w.podRuns = true // the operator removed the label
	} else if st.Phase == v1alpha1.NodeWaitingForKubeProxy {
		w.podRuns = false // the operator labelled the node; the pod left
	}
	if w.podRuns {
		w.add(kp) // a running kube-proxy keeps its rules
	}
	if step.Action == CleanUp && slices.Contains(step.Remove, kp) && w.podRuns {
		t.Fatalf("kube-proxy's objects removed while its pod runs: %v", w.log)
	}
	if step.Action == AwaitKubeProxy {
		w.log = append(w.log, fmt.Sprintf("%s:%s", st.Phase, step.Action))
		return Succeeded
	}
	return w.world.apply(st, step, "")
}

// run drives Next until it serves or waits with nothing to wait for.
func (w *kubeProxyWorld) run(t *testing.T, s State, desired v1alpha1.ProxyMode, resume bool, stopAfter v1alpha1.NodePhase) (State, bool) {
	t.Helper()
	r := None
	for range 40 {
		var step Step
		s, step = Next(s, w.input(desired, resume), r)
		r = w.apply(t, s, step, desired)
		if s.Phase == stopAfter && Switching(s.Phase) {
			return s, true
		}
		if step.Action == Serve || step.Action == Wait && s.Phase != v1alpha1.NodeWaitingForKubeProxy {
			return s, false
		}
	}
	t.Fatalf("no steady state after 40 steps: %v", w.log)
	return s, false
}

// TestTakeoverAndHandBackFromEveryCrashPoint takes a node served by
// kube-proxy over into each mode and hands it back, killing the agent
// after each phase and restarting it from what the kernel holds: it ends
// with the target alone, kube-proxy's objects removed only after its pod
// left, and something serving at every step.
func TestTakeoverAndHandBackFromEveryCrashPoint(t *testing.T) {
	phases := []v1alpha1.NodePhase{"", v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeWaitingForKubeProxy, v1alpha1.NodeCleaningUp}
	for _, mode := range allModes {
		for _, crash := range phases {
			t.Run(fmt.Sprintf("%s-killed-after-%s", mode, orNone(crash)), func(t *testing.T) {
				w := &kubeProxyWorld{world: world{servedAlways: true, present: []v1alpha1.ProxyMode{kp}}, podRuns: true}
				// leg switches to to; handing back skips Programming
				// and Verifying, so only a takeover must meet every
				// crash point.
				leg := func(from State, to v1alpha1.ProxyMode) {
					st, killed := w.run(t, from, to, false, crash)
					if killed {
						st, _ = w.run(t, State{}, to, true, "")
					} else if crash != "" && to != kp {
						t.Fatalf("never reached %s: %v", crash, w.log)
					}
					if st.Phase != v1alpha1.NodeActive || st.Target != to || !slices.Equal(w.present, []v1alpha1.ProxyMode{to}) {
						t.Fatalf("ended %+v with %v; want Active %s alone (steps %v)", st, w.present, to, w.log)
					}
				}
				leg(State{Phase: v1alpha1.NodeIdle, Target: kp}, mode)
				if w.podRuns {
					t.Errorf("kube-proxy's pod still runs on a node taken over")
				}
				leg(State{Phase: v1alpha1.NodeActive, Target: mode}, kp)
				if !w.servedAlways {
					t.Errorf("some step left nothing serving: %v", w.log)
				}
			})
		}
	}
}
