package plan

import (
	"maps"
	"strings"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestTenNodesMaxUnavailableTwo(t *testing.T) {
	s := newSim(t, 10, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)))
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	st := s.cfg("pc").Status
	if st.Nodes.Updated != 10 || st.Nodes.Selected != 10 || st.Nodes.Summary != "10/10" || st.Nodes.Failed != 0 {
		t.Fatalf("counts %+v", st.Nodes)
	}
	for name, pn := range s.pns {
		if pn.Status.ActiveMode != v1alpha1.ModeNFTables || pn.Status.Phase != v1alpha1.NodeActive {
			t.Errorf("%s: active %s phase %s", name, pn.Status.ActiveMode, pn.Status.Phase)
		}
		if pn.Annotations[AnnotationPreviousMode] != "iptables" {
			t.Errorf("%s: previous mode %q", name, pn.Annotations[AnnotationPreviousMode])
		}
		if s.writes[name] != 2 {
			t.Errorf("%s: %d writes, want 2 (create, move)", name, s.writes[name])
		}
	}
	if s.maxSeen["pc"] != 2 {
		t.Errorf("at most %d nodes moved at once; want the full budget of 2 used", s.maxSeen["pc"])
	}
	if c := s.cond("pc", v1alpha1.ConditionReady); c.Status != metav1.ConditionTrue || c.ObservedGeneration != 1 {
		t.Errorf("Ready %+v", c)
	}
	if c := s.cond("pc", v1alpha1.ConditionProgressing); c.Status != metav1.ConditionFalse || c.Reason != ReasonCompleted {
		t.Errorf("Progressing %+v", c)
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Status != metav1.ConditionFalse {
		t.Errorf("Degraded %+v", c)
	}
	if st.StartTime == nil || st.CompletionTime == nil || st.CompletionTime.Before(st.StartTime) {
		t.Errorf("times %v %v", st.StartTime, st.CompletionTime)
	}
	want := []string{EventRolloutStarted, EventCanaryPassed, EventRolloutCompleted}
	if got := s.eventReasons(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("events %v, want %v", got, want)
	}
	// The canary went alone: the first spec write is followed by no other
	// until the canary node ran the target.
	if s.specLog[0] != "node-00=nftables" {
		t.Errorf("first move %v", s.specLog)
	}
	// Steady state: planning again changes nothing.
	res := Plan(s.input(s.cfg("pc")))
	if len(res.Update)+len(res.Create)+len(res.Delete)+len(res.Events) != 0 || !apiequality.Semantic.DeepEqual(res.Status, st) || res.RequeueAfter != 0 {
		t.Errorf("steady state plans work: %+v", res)
	}
}

func TestCanaryAloneFirst(t *testing.T) {
	s := newSim(t, 6, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(3)), canary(2, ""))
	var sawCanaryOnly bool
	s.run(200, func() bool {
		moved := 0
		for _, pn := range s.pns {
			if pn.Spec.DesiredMode != "" {
				moved++
			}
		}
		if s.cfg("pc").Status.Conditions != nil && s.cond("pc", v1alpha1.ConditionProgressing).Reason == ReasonCanary {
			if moved > 2 {
				t.Fatalf("%d nodes moved during the canary of 2", moved)
			}
			sawCanaryOnly = true
		}
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutCompleted
	})
	if !sawCanaryOnly {
		t.Fatal("never saw the canary stage")
	}
}

func TestPercentAndCanaryPause(t *testing.T) {
	s := newSim(t, 10, v1alpha1.ModeIPVS, maxU(intstr.FromString("30%")), canary(1, "2m"))
	var canaryDone, batchStart time.Time
	s.run(400, func() bool {
		c := s.cfg("pc")
		if c.Status.Nodes.Updated >= 1 && canaryDone.IsZero() {
			canaryDone = s.now
		}
		moved := 0
		for _, pn := range s.pns {
			if pn.Spec.DesiredMode != "" {
				moved++
			}
		}
		if moved > 1 && batchStart.IsZero() {
			batchStart = s.now
		}
		if !canaryDone.IsZero() && batchStart.IsZero() && s.now.Sub(canaryDone) > 10*time.Second {
			if c.Status.Phase != v1alpha1.RolloutPaused || s.cond("pc", v1alpha1.ConditionProgressing).Reason != ReasonCanaryPause {
				t.Fatalf("during the pause: phase %s %+v", c.Status.Phase, s.cond("pc", v1alpha1.ConditionProgressing))
			}
		}
		return c.Status.Phase == v1alpha1.RolloutCompleted
	})
	if d := batchStart.Sub(canaryDone); d < 2*time.Minute || d > 2*time.Minute+5*time.Second {
		t.Errorf("first batch %s after the canary, want the 2m pause", d)
	}
	if s.maxSeen["pc"] != 3 {
		t.Errorf("max in transition %d, want 3 (30%% of 10)", s.maxSeen["pc"])
	}
	if !s.hasEvent(EventCanaryPassed) {
		t.Error("no CanaryPassed event")
	}
}

func TestCanaryPauseRequeues(t *testing.T) {
	s := newSim(t, 3, v1alpha1.ModeNFTables, canary(1, "90s"))
	s.run(100, func() bool {
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutPaused
	})
	res := Plan(s.input(s.cfg("pc")))
	if res.RequeueAfter < 85*time.Second || res.RequeueAfter > 91*time.Second {
		t.Errorf("requeue after %s during a 90s pause", res.RequeueAfter)
	}
}

func TestPauseAndResume(t *testing.T) {
	s := newSim(t, 10, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)))
	s.run(200, func() bool { return s.cfg("pc").Status.Nodes.Updated >= 4 })
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = true })
	s.steps(2)
	moves := len(s.specLog)
	s.steps(60)
	st := s.cfg("pc").Status
	if len(s.specLog) != moves {
		t.Fatalf("paused rollout started nodes: %v", s.specLog[moves:])
	}
	if st.Phase != v1alpha1.RolloutPaused || st.Nodes.Updated == 10 {
		t.Fatalf("phase %s counts %+v", st.Phase, st.Nodes)
	}
	if c := s.cond("pc", v1alpha1.ConditionProgressing); c.Status != metav1.ConditionFalse || c.Reason != ReasonPaused {
		t.Errorf("Progressing %+v", c)
	}
	start := *st.StartTime
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = false })
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if !s.cfg("pc").Status.StartTime.Equal(&start) {
		t.Error("resuming started a new rollout")
	}
	if len(s.specLog) != 10 {
		t.Errorf("%d moves for 10 nodes: %v", len(s.specLog), s.specLog)
	}
	if countEvents(s.events, EventRolloutStarted) != 1 || countEvents(s.events, EventCanaryPassed) != 1 {
		t.Errorf("events %v", s.eventReasons())
	}
}

func TestNewTargetMidRollout(t *testing.T) {
	s := newSim(t, 10, v1alpha1.ModeIPVS, maxU(intstr.FromInt32(3)))
	s.run(200, func() bool { return s.cfg("pc").Status.Nodes.Updated >= 4 })
	s.edit("pc", func(c *v1alpha1.ProxyConfig) {
		c.Spec.Mode = v1alpha1.ModeNFTables
	})
	s.run(400, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	for name, pn := range s.pns {
		if pn.Status.ActiveMode != v1alpha1.ModeNFTables {
			t.Errorf("%s runs %s", name, pn.Status.ActiveMode)
		}
	}
	if countEvents(s.events, EventRolloutStarted) != 2 {
		t.Errorf("events %v", s.eventReasons())
	}
	if st := s.cfg("pc").Status; st.TargetMode != v1alpha1.ModeNFTables || st.Nodes.Summary != "10/10" {
		t.Errorf("status %+v", st)
	}
}

func TestSettingsChangeIsARollout(t *testing.T) {
	s := newSim(t, 4, v1alpha1.ModeIPVS, maxU(intstr.FromInt32(2)))
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	s.edit("pc", func(c *v1alpha1.ProxyConfig) {
		c.Spec.IPVS = &v1alpha1.IPVSSettings{Scheduler: "wrr"}
	})
	s.run(200, func() bool {
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutCompleted && s.cfg("pc").Status.ObservedGeneration == 2
	})
	for _, pn := range s.pns {
		if pn.Spec.Settings.IPVS == nil || pn.Spec.Settings.IPVS.Scheduler != "wrr" {
			t.Errorf("%s settings %+v", pn.Name, pn.Spec.Settings)
		}
	}
	// A policy-only change moves nobody.
	moves := len(s.specLog)
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "7m" })
	s.steps(10)
	if len(s.specLog) != moves || s.cfg("pc").Status.Phase != v1alpha1.RolloutCompleted {
		t.Errorf("policy change moved nodes: %v", s.specLog[moves:])
	}
}

func TestCrashBetweenStatusAndNodeWrites(t *testing.T) {
	// Every third plan loses its ProxyNode writes after its status was
	// written, as a crash between the two would: the rollout still
	// completes within the limits.
	s := newSim(t, 12, v1alpha1.ModeIPVS, maxU(intstr.FromString("25%")), canary(2, "30s"))
	s.dropNodeWrites = func(step int) bool { return step%3 == 0 }
	s.run(500, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if s.cfg("pc").Status.Nodes.Updated != 12 {
		t.Error(s.dump())
	}
}

func TestRolloutNamesNeverCollide(t *testing.T) {
	// Everything within one second: the canary fails and is rolled back,
	// then the mode changes and changes back; the new rollout must not
	// take the rolled-back canary for one of its members.
	s := newSim(t, 3, v1alpha1.ModeNFTables, canary(1, ""))
	s.tick = 10 * time.Millisecond
	for _, a := range s.agents {
		a.delay = 0
	}
	s.agents["node-00"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeNFTables: true}
	s.run(50, s.phaseIs("pc", v1alpha1.RolloutFailed))
	first := s.cfg("pc").Status.StartTime.DeepCopy()
	s.agents["node-00"].failOn = nil
	// Paused on a new mode: no rollout runs, status.startTime is cleared.
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = v1alpha1.ModeIPVS; c.Spec.Rollout.Paused = true })
	s.run(5, s.phaseIs("pc", v1alpha1.RolloutPaused))
	if s.cfg("pc").Status.StartTime != nil {
		t.Fatal("a paused new rollout has a start time")
	}
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = v1alpha1.ModeNFTables; c.Spec.Rollout.Paused = false })
	s.run(50, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if s.now.Sub(t0) >= time.Second {
		t.Fatalf("test took %s of simulated time; it must stay within one second", s.now.Sub(t0))
	}
	if st := s.cfg("pc").Status.StartTime; st.Equal(first) {
		t.Errorf("two rollouts share the start time %v", st)
	}
}

// recordPrevious keeps what the move that started a transition recorded
// (a redirect, or the retry of a failed node after a spec edit), and
// records afresh from a settled node's spec.
func TestRecordPrevious(t *testing.T) {
	strict := `{"ipvs":{"scheduler":"rr","strictARP":true}}`
	recorded := map[string]string{AnnotationPreviousMode: "ipvs", AnnotationPreviousSettings: strict, AnnotationPreviousConfig: "pc/1"}
	ipvsStrict := v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{Scheduler: "rr", StrictARP: true}}
	ipvsLoose := v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{Scheduler: "rr"}}
	for _, tc := range []struct {
		name         string
		desired      v1alpha1.ProxyMode
		settings     v1alpha1.ProxySettings
		ref          int64
		active       v1alpha1.ProxyMode
		inTransition bool
		ann          map[string]string
		want         map[string]string
	}{
		{"settled node: recorded from its spec", v1alpha1.ModeIPVS, ipvsStrict, 1, v1alpha1.ModeIPVS, false, nil, recorded},
		{"redirected while switching", v1alpha1.ModeNFTables, v1alpha1.ProxySettings{}, 2, v1alpha1.ModeIPVS, true, recorded, recorded},
		{"failed node retried after an edit", v1alpha1.ModeIPTables, v1alpha1.ProxySettings{}, 3, v1alpha1.ModeIPVS, true, recorded, recorded},
		{"same mode, new settings, still switching", v1alpha1.ModeIPVS, ipvsLoose, 2, v1alpha1.ModeIPVS, true, recorded, recorded},
		{"in transition from a mode the annotations do not name", v1alpha1.ModeNFTables, v1alpha1.ProxySettings{}, 2, v1alpha1.ModeIPTables, true, recorded,
			map[string]string{AnnotationPreviousMode: "iptables"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pn := &v1alpha1.ProxyNode{}
			pn.Annotations = map[string]string{}
			for k, v := range tc.ann {
				pn.Annotations[k] = v
			}
			pn.Spec = v1alpha1.ProxyNodeSpec{DesiredMode: tc.desired, Settings: tc.settings, ConfigRef: &v1alpha1.ConfigReference{Name: "pc", Generation: tc.ref}}
			pn.Status.ActiveMode = tc.active
			recordPrevious(pn, tc.inTransition)
			if !maps.Equal(pn.Annotations, tc.want) {
				t.Errorf("annotations %v, want %v", pn.Annotations, tc.want)
			}
		})
	}
}

// The canary pause counts from the canary's success, recorded in
// status.canaryPassedTime: a person who paused while the canary was still
// switching and resumes a minute after it succeeded does not skip it.
func TestCanaryPauseCountsFromCanarySuccess(t *testing.T) {
	s := newSim(t, 4, v1alpha1.ModeNFTables, canary(1, "10m"), maxU(intstr.FromInt32(2)), func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "30m" })
	s.agents["node-00"].delay = 14 * time.Minute
	s.steps(2)
	if s.pns["node-00"].Spec.DesiredMode != v1alpha1.ModeNFTables {
		t.Fatalf("setup\n%s", s.dump())
	}
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = true })
	s.tick = 10 * time.Second
	s.run(200, func() bool { return s.pns["node-00"].Status.ActiveMode == v1alpha1.ModeNFTables })
	succeeded := s.now
	s.steps(6) // one minute
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = false })
	s.run(200, func() bool { return len(s.specLog) > 1 })
	if d := s.now.Sub(succeeded); d < 10*time.Minute || d > 10*time.Minute+s.tick {
		t.Errorf("next batch %v started %s after the canary succeeded, want the 10m canary pause", s.specLog[1:], d)
	}
	if p := s.cfg("pc").Status.CanaryPassedTime; p == nil || !p.Time.Equal(succeeded) {
		t.Errorf("status.canaryPassedTime %v, want %s", p, succeeded)
	}
}
