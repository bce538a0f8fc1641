package plan

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

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

// TestRollbackKeepsKubeProxyStopped: sending a node back rewrites its spec
// but keeps the handover controller's spec.kubeProxyStopped.
func TestRollbackKeepsKubeProxyStopped(t *testing.T) {
	s := newSim(t, 3, v1alpha1.ModeNFTables)
	s.agents["node-00"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeNFTables: true}
	s.run(50, func() bool { return s.pns["node-00"] != nil })
	s.pns["node-00"].Spec.KubeProxyStopped = true
	s.run(200, func() bool {
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutFailed && s.pns["node-00"].Spec.DesiredMode == v1alpha1.ModeIPTables
	})
	if !s.pns["node-00"].Spec.KubeProxyStopped {
		t.Error("the rollback cleared spec.kubeProxyStopped")
	}
}

// A node a rollout moved away from ipvs{strictARP} is redirected to a new
// target while still switching; the new target fails on it. The rollback
// returns it to ipvs with strictARP and the configRef that ran it, as for
// a node that was not redirected.
func TestRollbackOfRedirectedNodeRestoresPreviousSettings(t *testing.T) {
	s := newSim(t, 2, v1alpha1.ModeIPVS, canary(1, ""), func(c *v1alpha1.ProxyConfig) {
		c.Spec.IPVS = &v1alpha1.IPVSSettings{Scheduler: "rr", StrictARP: true}
	})
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	ranIPVS := *s.pns["node-00"].Spec.ConfigRef
	a := s.agents["node-00"]
	a.delay = time.Minute // still switching when the target changes again
	a.failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeIPTables: true}
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = v1alpha1.ModeNFTables; c.Spec.IPVS = nil })
	s.steps(3)
	before := s.pns["node-00"].Annotations
	if s.pns["node-00"].Spec.DesiredMode != v1alpha1.ModeNFTables || before[AnnotationPreviousSettings] == "" {
		t.Fatalf("setup: node-00 %+v %v", s.pns["node-00"].Spec, before)
	}
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = v1alpha1.ModeIPTables })
	s.steps(2)
	after := s.pns["node-00"]
	if after.Spec.DesiredMode != v1alpha1.ModeIPTables {
		t.Fatalf("node-00 not redirected: %+v", after.Spec)
	}
	for _, key := range []string{AnnotationPreviousMode, AnnotationPreviousSettings, AnnotationPreviousConfig} {
		if after.Annotations[key] != before[key] {
			t.Errorf("redirect changed %s from %q to %q", key, before[key], after.Annotations[key])
		}
	}
	a.delay = 3 * time.Second
	s.run(400, func() bool {
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutFailed && s.pns["node-00"].Status.ActiveMode == v1alpha1.ModeIPVS &&
			s.pns["node-00"].Status.Phase == v1alpha1.NodeActive
	})
	pn := s.pns["node-00"]
	if pn.Spec.Settings.IPVS == nil || !pn.Spec.Settings.IPVS.StrictARP {
		t.Errorf("rollback of a redirected node lost its ipvs settings: %+v", pn.Spec.Settings)
	}
	if *pn.Spec.ConfigRef != ranIPVS {
		t.Errorf("rollback configRef %+v, want the one that ran ipvs, %+v", *pn.Spec.ConfigRef, ranIPVS)
	}
}
