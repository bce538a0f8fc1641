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
			name:     "adoption with kube-proxy leftovers switches even if the mode is programmed",
			in:       Input{Desired: nft, Present: []v1alpha1.ProxyMode{nft}, KubeProxy: true},
			want:     State{Phase: v1alpha1.NodePreparing, Target: nft, Previous: nft},
			wantStep: Step{Action: Prepare, Mode: nft},
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
			in:       Input{Desired: ipt, Present: []v1alpha1.ProxyMode{ipt, nft}, KubeProxy: true},
			r:        Succeeded,
			want:     State{Phase: v1alpha1.NodeCleaningUp, Target: ipt, Previous: nft},
			wantStep: Step{Action: CleanUp, Mode: ipt, Remove: []v1alpha1.ProxyMode{nft}, Cutover: true, AdoptKubeProxy: true},
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

func orNone[S ~string](s S) string {
	if s == "" {
		return "none"
	}
	return string(s)
}
