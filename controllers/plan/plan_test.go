package plan

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestMaxUnavailable(t *testing.T) {
	for _, tc := range []struct {
		v        *intstr.IntOrString
		selected int
		want     int
	}{
		{nil, 10, 1},
		{ptr.To(intstr.FromInt32(2)), 10, 2},
		{ptr.To(intstr.FromInt32(20)), 10, 20},
		{ptr.To(intstr.FromString("30%")), 10, 3},
		{ptr.To(intstr.FromString("30%")), 3, 1}, // 0.9 rounds down to 0, then at least 1
		{ptr.To(intstr.FromString("10%")), 1000, 100},
		{ptr.To(intstr.FromString("100%")), 7, 7},
		{ptr.To(intstr.FromString("1%")), 0, 1},
		{ptr.To(intstr.FromString("35%")), 10, 3}, // 3.5 rounds down
	} {
		got, err := MaxUnavailable(tc.v, tc.selected)
		if err != nil || got != tc.want {
			t.Errorf("MaxUnavailable(%v, %d) = %d, %v; want %d", tc.v, tc.selected, got, err, tc.want)
		}
	}
}

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

func TestCanaryFailsRollsBack(t *testing.T) {
	s := newSim(t, 10, v1alpha1.ModeIPVS, maxU(intstr.FromInt32(2)))
	s.agents["node-00"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeIPVS: true}
	s.run(200, func() bool {
		c := s.cfg("pc")
		return c.Status.Phase == v1alpha1.RolloutFailed && s.pns["node-00"].Status.ActiveMode == v1alpha1.ModeIPTables &&
			s.pns["node-00"].Status.Phase == v1alpha1.NodeActive && s.pns["node-00"].Spec.DesiredMode == v1alpha1.ModeIPTables
	})
	st := s.cfg("pc").Status
	for name, pn := range s.pns {
		if name != "node-00" && (pn.Spec.DesiredMode != "" || s.writes[name] != 1) {
			t.Errorf("%s was touched: desired %q, %d writes", name, pn.Spec.DesiredMode, s.writes[name])
		}
	}
	if len(st.FailedNodes) != 1 || st.FailedNodes[0].Name != "node-00" || !strings.Contains(st.FailedNodes[0].Reason, "VerifyFailed") {
		t.Errorf("failed nodes %+v", st.FailedNodes)
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Status != metav1.ConditionTrue || c.Reason != ReasonRolledBack || !strings.Contains(c.Message, "node-00") {
		t.Errorf("Degraded %+v", c)
	}
	for _, r := range []string{EventRolloutStarted, EventNodeFailed, EventRollbackStarted} {
		if !s.hasEvent(r) {
			t.Errorf("no %s event in %v", r, s.eventReasons())
		}
	}
	// It holds: more time passes, nothing moves.
	writes := len(s.specLog)
	for i := 0; i < 50; i++ {
		s.run(1, func() bool { return true })
		s.now = s.now.Add(time.Minute)
	}
	if len(s.specLog) != writes || s.cfg("pc").Status.Phase != v1alpha1.RolloutFailed {
		t.Errorf("failed rollout moved on: %v, phase %s", s.specLog[writes:], s.cfg("pc").Status.Phase)
	}
	// A spec change retries: the node fails again, is rolled back again.
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(3)) })
	s.run(200, func() bool { return len(s.specLog) >= writes+2 && s.cfg("pc").Status.Phase == v1alpha1.RolloutFailed })
	if s.specLog[writes] != "node-00=ipvs" {
		t.Errorf("retry did not start with the canary: %v", s.specLog[writes:])
	}
}

func TestNoAutoRollbackHolds(t *testing.T) {
	s := newSim(t, 5, v1alpha1.ModeNFTables, autoRollback(false), canary(1, ""))
	s.agents["node-00"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeNFTables: true}
	s.run(100, s.phaseIs("pc", v1alpha1.RolloutFailed))
	s.steps(30)
	st := s.cfg("pc").Status
	if st.Phase != v1alpha1.RolloutFailed || len(s.specLog) != 1 || s.pns["node-00"].Spec.DesiredMode != v1alpha1.ModeNFTables {
		t.Fatalf("phase %s, moves %v", st.Phase, s.specLog)
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonNodeFailed || !strings.Contains(c.Message, "autoRollback is off") {
		t.Errorf("Degraded %+v", c)
	}
	// The person fixes the node and touches the spec: the node is retried
	// (a new generation) and the rollout goes on.
	s.agents["node-00"].failOn = nil
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "10m" })
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if s.pns["node-00"].Spec.ConfigRef.Generation != 2 {
		t.Errorf("node-00 not retried with generation 2: %+v", s.pns["node-00"].Spec.ConfigRef)
	}
}

func TestNodeTimeoutFailsAndRollsBack(t *testing.T) {
	s := newSim(t, 4, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)), canary(0, ""), func(c *v1alpha1.ProxyConfig) {
		c.Spec.Rollout.NodeTimeout = "30s"
	})
	s.agents["node-01"].hang = true
	s.run(200, func() bool {
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutFailed && s.pns["node-00"].Status.ActiveMode == v1alpha1.ModeIPTables
	})
	st := s.cfg("pc").Status
	if len(st.FailedNodes) == 0 || st.FailedNodes[0].Name != "node-01" || !strings.Contains(st.FailedNodes[0].Reason, "within 30s") {
		t.Errorf("failed %+v", st.FailedNodes)
	}
	assertNoMoveForwardAfterRollback(t, s.specLog, "nftables")
	for name, pn := range s.pns {
		if pn.Spec.DesiredMode == v1alpha1.ModeNFTables {
			t.Errorf("%s was not rolled back", name)
		}
	}
	// node-01 hangs on the way back as well: the rollback failed.
	s.steps(60)
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonRollbackFailed {
		t.Errorf("Degraded %+v", c)
	}
}

func TestRollbackInBatches(t *testing.T) {
	// 8 nodes, budget 2, no canary: six move fine, then node-06 fails;
	// the rollback returns the moved nodes at most two at a time.
	s := newSim(t, 8, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)), canary(0, ""))
	s.agents["node-06"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeNFTables: true}
	s.run(300, func() bool {
		if s.cfg("pc").Status.Phase != v1alpha1.RolloutFailed {
			return false
		}
		for _, pn := range s.pns {
			if pn.Spec.DesiredMode != "" && pn.Status.ActiveMode != v1alpha1.ModeIPTables {
				return false
			}
		}
		return true
	})
	if s.maxSeen["pc"] > 2 {
		t.Errorf("max in transition %d", s.maxSeen["pc"])
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonRolledBack || !strings.Contains(c.Message, "node-06") {
		t.Errorf("Degraded %+v", c)
	}
	assertNoMoveForwardAfterRollback(t, s.specLog, "nftables")
}

func TestSilentFallbackIsFailure(t *testing.T) {
	s := newSim(t, 3, v1alpha1.ModeIPVS)
	s.agents["node-00"].fallback = v1alpha1.ModeIPTables
	s.run(100, s.phaseIs("pc", v1alpha1.RolloutFailed))
	if f := s.cfg("pc").Status.FailedNodes; len(f) != 1 || !strings.Contains(f[0].Reason, "no silent fallback") {
		t.Errorf("failed %+v", f)
	}
}

func TestPreflightBlocksMissingIPVS(t *testing.T) {
	s := newSim(t, 5, v1alpha1.ModeIPVS)
	s.agents["node-03"].facts = noIPVS()
	s.run(50, s.phaseIs("pc", v1alpha1.RolloutFailed))
	s.steps(20)
	st := s.cfg("pc").Status
	if len(s.specLog) != 0 {
		t.Fatalf("nodes changed: %v", s.specLog)
	}
	if len(st.FailedNodes) != 1 || st.FailedNodes[0].Name != "node-03" ||
		!strings.Contains(st.FailedNodes[0].Reason, "ip_vs is Missing") || !strings.Contains(st.FailedNodes[0].Reason, "ip_vs_rr not reported") {
		t.Errorf("failed %+v", st.FailedNodes)
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonPreflightFailed || !strings.Contains(c.Message, "no node was changed") {
		t.Errorf("Degraded %+v", c)
	}
	if n := countEvents(s.events, EventPreflightFailed); n != 1 {
		t.Errorf("%d PreflightFailed events", n)
	}
	// Once the node reports the modules, the rollout starts.
	s.pns["node-03"].Status.Kernel = allFacts()
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
}

func TestPreflightNftablesAndIptables(t *testing.T) {
	s := newSim(t, 3, v1alpha1.ModeNFTables)
	f := allFacts()
	f.NFTables = v1alpha1.CapabilityNo
	s.agents["node-01"].facts = f
	s.run(50, s.phaseIs("pc", v1alpha1.RolloutFailed))
	if r := s.cfg("pc").Status.FailedNodes[0].Reason; !strings.Contains(r, "nf_tables is not usable") {
		t.Error(r)
	}
}

func TestPreflightWaitsForAgentsThenTimesOut(t *testing.T) {
	s := newSim(t, 3, v1alpha1.ModeNFTables, func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "1m" })
	s.agents["node-02"].facts = nil // its agent never reports
	s.run(10, s.phaseIs("pc", v1alpha1.RolloutPreflight))
	if c := s.cond("pc", v1alpha1.ConditionProgressing); c.Reason != ReasonPreflight || !strings.Contains(c.Message, "node-02") {
		t.Errorf("Progressing %+v", c)
	}
	res := Plan(s.input(s.cfg("pc")))
	if res.RequeueAfter <= 0 || res.RequeueAfter > time.Minute+time.Second {
		t.Errorf("requeue %s while waiting for an agent", res.RequeueAfter)
	}
	s.run(100, s.phaseIs("pc", v1alpha1.RolloutFailed))
	if f := s.cfg("pc").Status.FailedNodes; len(f) != 1 || f[0].Name != "node-02" || !strings.Contains(f[0].Reason, "not reported") {
		t.Errorf("failed %+v", f)
	}
	if len(s.specLog) != 0 {
		t.Errorf("nodes moved: %v", s.specLog)
	}
}

func TestConflict(t *testing.T) {
	s := newSim(t, 0, v1alpha1.ModeNFTables, selector(map[string]string{"pool": "a"}))
	for i := 0; i < 4; i++ {
		s.addNode(fmt.Sprintf("a-%d", i), map[string]string{"pool": "a"})
		s.addNode(fmt.Sprintf("b-%d", i), map[string]string{"pool": "b"})
	}
	s.addNode("both", map[string]string{"pool": "a", "edge": "yes"})
	s.addConfig("edge", v1alpha1.ModeIPVS, func(c *v1alpha1.ProxyConfig) {
		c.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []string{"b"}}}}
	}, func(c *v1alpha1.ProxyConfig) {
		c.Spec.NodeSelector.MatchExpressions = nil
		c.Spec.NodeSelector.MatchLabels = map[string]string{"edge": "yes"}
	})
	s.cfg("edge").Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []string{"b"}}}}
	// edge selects pool=b or edge=yes? A selector is an AND, so use two
	// matchExpressions-free configs: "edge" selects pool in (b) plus the
	// node "both" via a second label.
	s.cfg("edge").Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "side", Operator: metav1.LabelSelectorOpIn, Values: []string{"b"}}}}
	for i := range s.nodes {
		if strings.HasPrefix(s.nodes[i].Name, "b-") || s.nodes[i].Name == "both" {
			s.nodes[i].Labels["side"] = "b"
		}
	}
	s.run(300, func() bool {
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutCompleted && s.cfg("edge").Status.Phase == v1alpha1.RolloutCompleted
	})
	if s.pns["both"] != nil {
		t.Errorf("the conflicting node was touched: %+v", s.pns["both"])
	}
	for _, name := range []string{"pc", "edge"} {
		st := s.cfg(name).Status
		if st.Nodes.Selected != 5 || st.Nodes.Updated != 4 {
			t.Errorf("%s counts %+v", name, st.Nodes)
		}
		c := s.cond(name, v1alpha1.ConditionDegraded)
		if c.Status != metav1.ConditionTrue || c.Reason != ReasonConflict || !strings.Contains(c.Message, "both (also selected by") {
			t.Errorf("%s Degraded %+v", name, c)
		}
		if r := s.cond(name, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != ReasonConflict {
			t.Errorf("%s Ready %+v", name, r)
		}
	}
	if n := countEvents(s.events, EventConflict); n != 2 {
		t.Errorf("%d Conflict events, want one per config", n)
	}
	for _, pn := range s.pns {
		want := v1alpha1.ModeNFTables
		if strings.HasPrefix(pn.Name, "b-") {
			want = v1alpha1.ModeIPVS
		}
		if pn.Status.ActiveMode != want {
			t.Errorf("%s runs %s", pn.Name, pn.Status.ActiveMode)
		}
	}
	// Resolving the conflict (the node leaves "edge") lets "pc" take it.
	for i := range s.nodes {
		if s.nodes[i].Name == "both" {
			delete(s.nodes[i].Labels, "side")
		}
	}
	s.run(100, func() bool {
		pn := s.pns["both"]
		return pn != nil && pn.Status.ActiveMode == v1alpha1.ModeNFTables && s.cfg("pc").Status.Nodes.Updated == 5
	})
	if c := s.cond("edge", v1alpha1.ConditionDegraded); c.Status != metav1.ConditionFalse {
		t.Errorf("edge still degraded: %+v", c)
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

func TestRollbackRestoresPreviousSettings(t *testing.T) {
	s := newSim(t, 2, v1alpha1.ModeIPVS, canary(1, ""), func(c *v1alpha1.ProxyConfig) {
		c.Spec.IPVS = &v1alpha1.IPVSSettings{Scheduler: "rr", StrictARP: true}
	})
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	s.agents["node-00"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeNFTables: true}
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = v1alpha1.ModeNFTables; c.Spec.IPVS = nil })
	s.run(200, func() bool {
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutFailed && s.pns["node-00"].Status.ActiveMode == v1alpha1.ModeIPVS &&
			s.pns["node-00"].Status.Phase == v1alpha1.NodeActive
	})
	pn := s.pns["node-00"]
	if pn.Spec.Settings.IPVS == nil || !pn.Spec.Settings.IPVS.StrictARP {
		t.Errorf("rollback lost the ipvs settings: %+v", pn.Spec.Settings)
	}
	if s.pns["node-01"].Spec.DesiredMode != v1alpha1.ModeIPVS {
		t.Errorf("node-01 touched: %+v", s.pns["node-01"].Spec)
	}
}

func TestNodeJoinsAfterCompletionAndDeletedNode(t *testing.T) {
	s := newSim(t, 5, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)), canary(1, "1m"))
	s.run(300, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	first := s.cfg("pc").Status.CompletionTime
	s.addNode("node-late", map[string]string{"pool": "a"})
	s.steps(1)
	if st := s.cfg("pc").Status; st.Phase != v1alpha1.RolloutPreflight || st.Nodes.Summary != "5/6" {
		t.Errorf("joined node: phase %s %+v", st.Phase, st.Nodes)
	}
	s.run(100, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if pn := s.pns["node-late"]; pn.Status.ActiveMode != v1alpha1.ModeNFTables {
		t.Errorf("late node runs %s", pn.Status.ActiveMode)
	}
	if st := s.cfg("pc").Status; st.Nodes.Summary != "6/6" || !st.CompletionTime.After(first.Time) {
		t.Errorf("status %+v", st)
	}
	// A deleted node drops out of the counts.
	s.nodes[0].Deleting = true
	s.steps(1)
	if st := s.cfg("pc").Status; st.Nodes.Summary != "5/5" || st.Phase != v1alpha1.RolloutCompleted {
		t.Errorf("after delete %+v", st.Nodes)
	}
	s.nodes = s.nodes[1:]
	s.steps(1)
	if st := s.cfg("pc").Status; st.Nodes.Selected != 5 {
		t.Errorf("after delete %+v", st.Nodes)
	}
}

func TestDeletedNodeMidRolloutFreesBudget(t *testing.T) {
	s := newSim(t, 6, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(1)), canary(0, ""))
	s.agents["node-00"].hang = true
	s.steps(5)
	if s.pns["node-00"].Spec.DesiredMode == "" {
		t.Fatal("node-00 not started")
	}
	// node-00 hangs, then its Node goes away: the rest proceeds.
	s.nodes = s.nodes[1:]
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if st := s.cfg("pc").Status; st.Nodes.Summary != "5/5" {
		t.Errorf("%+v", st.Nodes)
	}
}

func TestReplacedNodeGetsFreshProxyNode(t *testing.T) {
	s := newSim(t, 2, v1alpha1.ModeNFTables)
	s.run(100, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	s.nodes[0].UID = "uid-new"
	s.agents["node-00"] = &agent{facts: allFacts(), initial: v1alpha1.ModeIPTables, delay: time.Second}
	res := Plan(s.input(s.cfg("pc")))
	if len(res.Delete) != 1 || res.Delete[0].Name != "node-00" || len(res.Create) != 0 {
		t.Fatalf("delete %v create %v", res.Delete, res.Create)
	}
	s.run(100, func() bool {
		pn := s.pns["node-00"]
		return pn != nil && pn.OwnerReferences[0].UID == "uid-new" && s.cfg("pc").Status.Phase == v1alpha1.RolloutCompleted
	})
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

func TestInvalidSpec(t *testing.T) {
	for name, mut := range map[string]func(*v1alpha1.ProxyConfig){
		"selector": func(c *v1alpha1.ProxyConfig) {
			c.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "In"}}}
		},
		"maxUnavailable": func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromString("lots")) },
		"timeout":        func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "soon" },
		"zeroTimeout":    func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "0" },
		"pause":          func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Canary.Pause = "-1s" },
		"mode":           func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = "ebpf" },
	} {
		t.Run(name, func(t *testing.T) {
			s := newSim(t, 3, v1alpha1.ModeNFTables, mut)
			s.steps(3)
			st := s.cfg("pc").Status
			if st.Phase != v1alpha1.RolloutFailed || len(s.pns) != 0 {
				t.Fatalf("phase %s, %d ProxyNodes", st.Phase, len(s.pns))
			}
			for _, typ := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionProgressing, v1alpha1.ConditionDegraded} {
				if c := s.cond("pc", typ); c.Reason != ReasonInvalidSpec || c.Message == "" {
					t.Errorf("%s %+v", typ, c)
				}
			}
			if res := Plan(s.input(s.cfg("pc"))); res.RequeueAfter != 0 {
				t.Error("invalid spec requeues")
			}
		})
	}
}

func TestNoNodesSelected(t *testing.T) {
	s := newSim(t, 3, v1alpha1.ModeNFTables, selector(map[string]string{"pool": "nope"}))
	s.steps(2)
	st := s.cfg("pc").Status
	if st.Phase != v1alpha1.RolloutPending || st.Nodes.Summary != "0/0" || st.Selector != "pool=nope" {
		t.Fatalf("%+v", st)
	}
	if c := s.cond("pc", v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != ReasonNoNodesSelected {
		t.Errorf("Ready %+v", c)
	}
}

func TestNodeWithoutPreviousModeCannotRollBack(t *testing.T) {
	s := newSim(t, 2, v1alpha1.ModeNFTables)
	s.agents["node-00"].initial = ""
	s.agents["node-00"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeNFTables: true}
	s.run(100, s.phaseIs("pc", v1alpha1.RolloutFailed))
	if f := s.cfg("pc").Status.FailedNodes; len(f) != 1 || !strings.Contains(f[0].Reason, "VerifyFailed") {
		t.Errorf("failed %+v", f)
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonRolledBack {
		t.Errorf("%+v", c)
	}
}

func TestUnhealthyAfterCompletionDoesNotRollBack(t *testing.T) {
	s := newSim(t, 4, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)))
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	pn := s.pns["node-02"]
	pn.Status.Conditions = []metav1.Condition{{Type: contract.ConditionDegraded, Status: metav1.ConditionTrue, Reason: "SyncFailed", Message: "netlink: EPERM"}}
	moves := len(s.specLog)
	s.steps(5)
	st := s.cfg("pc").Status
	if len(s.specLog) != moves || st.Phase != v1alpha1.RolloutCompleted {
		t.Fatalf("phase %s moves %v", st.Phase, s.specLog[moves:])
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonNodeUnhealthy || !strings.Contains(c.Message, "EPERM") {
		t.Errorf("%+v", c)
	}
	if c := s.cond("pc", v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse {
		t.Errorf("%+v", c)
	}
}

// TestRandomized drives many random worlds (sizes, budgets, canaries,
// failures, slow agents, pauses, new targets, joins, deletions, crashes)
// and checks the safety invariant at every step and that each settles.
func TestRandomized(t *testing.T) {
	modes := []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS}
	for seed := int64(1); seed <= 400; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewSource(seed))
			n := 1 + r.Intn(25)
			var mu intstr.IntOrString
			if r.Intn(2) == 0 {
				mu = intstr.FromInt32(int32(1 + r.Intn(5)))
			} else {
				mu = intstr.FromString(fmt.Sprintf("%d%%", 1+r.Intn(100)))
			}
			pause := v1alpha1.Duration("")
			if r.Intn(3) == 0 {
				pause = v1alpha1.Duration(fmt.Sprintf("%ds", r.Intn(60)))
			}
			s := newSim(t, n, modes[1+r.Intn(2)], maxU(mu), canary(int32(r.Intn(4)), pause),
				autoRollback(r.Intn(3) != 0), func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "2m" })
			for _, node := range s.nodes { // in order: the draws must be reproducible
				a := s.agents[node.Name]
				a.delay = time.Duration(r.Intn(20)) * time.Second
				if r.Intn(15) == 0 {
					a.failOn = map[v1alpha1.ProxyMode]bool{modes[r.Intn(3)]: true}
				}
				if r.Intn(30) == 0 {
					a.hang = true
				}
			}
			if r.Intn(4) == 0 {
				s.dropNodeWrites = func(step int) bool { return r.Intn(4) == 0 }
			}
			for i := 0; i < 400; i++ {
				s.steps(1)
				switch x := r.Intn(200); {
				case x == 0:
					s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = modes[r.Intn(3)] })
				case x == 1:
					s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = !c.Spec.Rollout.Paused })
				case x == 2:
					s.addNode(fmt.Sprintf("late-%d", i), map[string]string{"pool": "a"})
				case x == 3 && len(s.nodes) > 1:
					s.nodes = s.nodes[1:]
				}
			}
			// Unpause, stop injecting crashes, and let it settle.
			if s.cfg("pc").Spec.Rollout.Paused {
				s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = false })
			}
			s.dropNodeWrites = nil
			s.run(2000, func() bool {
				switch s.cfg("pc").Status.Phase {
				case v1alpha1.RolloutCompleted, v1alpha1.RolloutFailed:
					return true
				}
				return false
			})
			st := s.cfg("pc").Status
			if st.Phase == v1alpha1.RolloutCompleted && st.Nodes.Updated != st.Nodes.Selected {
				if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Status != metav1.ConditionTrue {
					t.Errorf("Completed at %s without saying why", st.Nodes.Summary)
				}
			}
			if st.Phase == v1alpha1.RolloutFailed {
				if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Status != metav1.ConditionTrue || c.Message == "" {
					t.Errorf("Failed without a Degraded reason: %+v", c)
				}
			}
		})
	}
}

func countEvents(es []Event, reason string) int {
	n := 0
	for _, e := range es {
		if e.Reason == reason {
			n++
		}
	}
	return n
}

// assertNoMoveForwardAfterRollback checks that once a node was sent back,
// no node was sent to the target again.
func assertNoMoveForwardAfterRollback(t *testing.T, log []string, target string) {
	t.Helper()
	back := false
	for _, m := range log {
		if !strings.HasSuffix(m, "="+target) {
			back = true
		} else if back {
			t.Errorf("%s after the rollback began: %v", m, log)
		}
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
