// Package rollout holds the operator's envtest scenarios: a real API server,
// the real reconciler in a real manager, simulated agents that answer
// ProxyNode spec changes by writing status, and a watch that records every
// ProxyNode change to assert that maxUnavailable is never exceeded.
package rollout

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/plan"
)

var pool = map[string]string{"pool": "workers"}

func TestTenNodesMaxUnavailableTwo(t *testing.T) {
	w := newWorld(t)
	nodes := w.createNodes("node", 10, pool)
	w.rec.track("pc", nodes, 2)
	w.startOperator(opOptions{})
	w.create(newConfig("pc", v1alpha1.ModeNFTables, intstr.FromInt32(2)))

	c := w.waitPhase("pc", v1alpha1.RolloutCompleted, 60*time.Second)
	if c.Status.Nodes.Updated != 10 || c.Status.Nodes.Selected != 10 || c.Status.Nodes.Summary != "10/10" {
		t.Errorf("counts %+v", c.Status.Nodes)
	}
	if r := cond(c, v1alpha1.ConditionReady); r.Status != metav1.ConditionTrue || r.ObservedGeneration != c.Generation {
		t.Errorf("Ready %+v", r)
	}
	if c.Status.StartTime == nil || c.Status.CompletionTime == nil || c.Status.TargetMode != v1alpha1.ModeNFTables {
		t.Errorf("status %+v", c.Status)
	}
	for _, n := range nodes {
		pn := w.proxyNode(n)
		if pn.Status.ActiveMode != v1alpha1.ModeNFTables || pn.Status.Phase != v1alpha1.NodeActive {
			t.Errorf("%s: active %s phase %s", n, pn.Status.ActiveMode, pn.Status.Phase)
		}
		if len(pn.OwnerReferences) != 1 || pn.OwnerReferences[0].Kind != "Node" || pn.OwnerReferences[0].Name != n {
			t.Errorf("%s owner %+v", n, pn.OwnerReferences)
		}
		if pn.Annotations[plan.AnnotationPreviousMode] != "iptables" {
			t.Errorf("%s annotations %v", n, pn.Annotations)
		}
	}
	if max := w.rec.check(t)["pc"]; max != 2 {
		t.Errorf("at most %d nodes moved at once, want 2", max)
	}
	if got := w.rec.specChanges(); len(got) != 10 || got[0] != "node-00=nftables" {
		t.Errorf("spec changes %v", got)
	}
	for _, r := range []string{plan.EventRolloutStarted, plan.EventCanaryPassed, plan.EventNodeUpdated, plan.EventRolloutCompleted} {
		w.waitEvent("pc", r)
	}
}

func TestPercentAndCanaryWithPause(t *testing.T) {
	w := newWorld(t)
	nodes := w.createNodes("node", 10, pool)
	w.rec.track("pc", nodes, 3) // 30% of 10
	w.startOperator(opOptions{})
	pc := newConfig("pc", v1alpha1.ModeIPVS, intstr.FromString("30%"))
	pc.Spec.Rollout.Canary = v1alpha1.CanaryPolicy{Nodes: ptr.To(int32(1)), Pause: "4s"}
	w.create(pc)

	w.waitFor("the canary to pass", 30*time.Second, func() bool { return w.config("pc").Status.Nodes.Updated == 1 })
	passed := time.Now()
	c := w.waitPhase("pc", v1alpha1.RolloutPaused, 5*time.Second)
	if r := cond(c, v1alpha1.ConditionProgressing); r.Reason != plan.ReasonCanaryPause {
		t.Errorf("Progressing %+v", r)
	}
	w.waitFor("the first batch", 15*time.Second, func() bool { return len(w.rec.specChanges()) > 1 })
	if d := time.Since(passed); d < 3*time.Second {
		t.Errorf("first batch %s after the canary, want the 4s pause", d)
	}
	w.waitPhase("pc", v1alpha1.RolloutCompleted, 60*time.Second)
	if max := w.rec.check(t)["pc"]; max != 3 {
		t.Errorf("at most %d nodes moved at once, want 3", max)
	}
	w.waitEvent("pc", plan.EventCanaryPassed)
}

func TestCanaryFailsAndRollsBack(t *testing.T) {
	w := newWorld(t)
	nodes := w.createNodes("node", 6, pool)
	w.agents.set("node-00", behavior{facts: allFacts(), initial: v1alpha1.ModeIPTables, delay: 300 * time.Millisecond,
		failOn: map[v1alpha1.ProxyMode]string{v1alpha1.ModeIPVS: "service 10.96.0.10:53/UDP unreachable through ipvs"}})
	w.rec.track("pc", nodes, 2)
	w.startOperator(opOptions{})
	w.create(newConfig("pc", v1alpha1.ModeIPVS, intstr.FromInt32(2)))

	var c *v1alpha1.ProxyConfig
	w.waitFor("the canary to be rolled back", 60*time.Second, func() bool {
		c = w.config("pc")
		pn := &v1alpha1.ProxyNode{}
		if w.c.Get(w.ctx, types.NamespacedName{Name: "node-00"}, pn) != nil {
			return false
		}
		return c.Status.Phase == v1alpha1.RolloutFailed && pn.Spec.DesiredMode == v1alpha1.ModeIPTables &&
			pn.Status.ActiveMode == v1alpha1.ModeIPTables && pn.Status.Phase == v1alpha1.NodeActive
	})
	if len(c.Status.FailedNodes) != 1 || c.Status.FailedNodes[0].Name != "node-00" || !strings.Contains(c.Status.FailedNodes[0].Reason, "unreachable through ipvs") {
		t.Errorf("failed nodes %+v", c.Status.FailedNodes)
	}
	if d := cond(c, v1alpha1.ConditionDegraded); d.Status != metav1.ConditionTrue || d.Reason != plan.ReasonRolledBack || !strings.Contains(d.Message, "node-00") {
		t.Errorf("Degraded %+v", d)
	}
	time.Sleep(2 * time.Second) // nothing else may move
	if got := w.rec.specChanges(); strings.Join(got, ",") != "node-00=ipvs,node-00=iptables" {
		t.Errorf("spec changes %v, want only the canary and its rollback", got)
	}
	w.rec.check(t)
	w.waitEvent("pc", plan.EventNodeFailed)
	w.waitEvent("pc", plan.EventRollbackStarted)
}

func TestPreflightBlocksIPVSWithoutModules(t *testing.T) {
	w := newWorld(t)
	nodes := w.createNodes("node", 5, pool)
	f := allFacts()
	f.Modules = []v1alpha1.KernelModule{{Name: "ip_vs", State: v1alpha1.ModuleMissing}, {Name: "ip_vs_rr", State: v1alpha1.ModuleMissing}, {Name: "nf_conntrack", State: v1alpha1.ModuleLoaded}}
	w.agents.set("node-03", behavior{facts: f, initial: v1alpha1.ModeIPTables, delay: 300 * time.Millisecond})
	w.rec.track("pc", nodes, 1)
	w.startOperator(opOptions{})
	w.create(newConfig("pc", v1alpha1.ModeIPVS, intstr.FromInt32(1)))

	c := w.waitPhase("pc", v1alpha1.RolloutFailed, 30*time.Second)
	if len(c.Status.FailedNodes) != 1 || c.Status.FailedNodes[0].Name != "node-03" ||
		!strings.Contains(c.Status.FailedNodes[0].Reason, "ip_vs is Missing") {
		t.Errorf("failed %+v", c.Status.FailedNodes)
	}
	if d := cond(c, v1alpha1.ConditionDegraded); d.Reason != plan.ReasonPreflightFailed || !strings.Contains(d.Message, "node-03") {
		t.Errorf("Degraded %+v", d)
	}
	time.Sleep(time.Second)
	for _, n := range nodes {
		if pn := w.proxyNode(n); pn.Spec.DesiredMode != "" {
			t.Errorf("%s was changed: %+v", n, pn.Spec)
		}
	}
	if got := w.rec.specChanges(); len(got) != 0 {
		t.Errorf("spec changes %v", got)
	}
	w.waitEvent("pc", plan.EventPreflightFailed)
}

func TestConflictingConfigs(t *testing.T) {
	w := newWorld(t)
	a := w.createNodes("a", 4, map[string]string{"pool": "a"})
	b := w.createNodes("b", 4, map[string]string{"pool": "b"})
	w.createNode("shared", map[string]string{"pool": "a", "edge": "true"})
	w.rec.track("pa", a, 1)
	w.rec.track("pb", b, 2)
	pa := newConfig("pa", v1alpha1.ModeNFTables, intstr.FromInt32(1))
	pa.Spec.NodeSelector = &v1alpha1.NodeSelector{MatchLabels: map[string]v1alpha1.LabelValue{"pool": "a"}}
	pb := newConfig("pb", v1alpha1.ModeIPVS, intstr.FromInt32(2))
	// pb selects the b nodes and the shared one, which pa selects too.
	pb.Spec.NodeSelector = &v1alpha1.NodeSelector{MatchExpressions: []v1alpha1.NodeSelectorRequirement{
		{Key: "side", Operator: metav1.LabelSelectorOpIn, Values: []v1alpha1.LabelValue{"b"}}}}
	for _, n := range append(b, "shared") {
		w.labelNode(n, "side", "b")
	}
	w.create(pa)
	w.create(pb)
	w.startOperator(opOptions{})

	ca := w.waitPhase("pa", v1alpha1.RolloutCompleted, 60*time.Second)
	cb := w.waitPhase("pb", v1alpha1.RolloutCompleted, 60*time.Second)
	for _, c := range []*v1alpha1.ProxyConfig{ca, cb} {
		if c.Status.Nodes.Selected != 5 || c.Status.Nodes.Updated != 4 {
			t.Errorf("%s counts %+v", c.Name, c.Status.Nodes)
		}
		d := cond(c, v1alpha1.ConditionDegraded)
		if d.Status != metav1.ConditionTrue || d.Reason != plan.ReasonConflict || !strings.Contains(d.Message, "shared") {
			t.Errorf("%s Degraded %+v", c.Name, d)
		}
		w.waitEvent(c.Name, plan.EventConflict)
	}
	if pn := w.proxyNode("a-00"); pn.Status.ActiveMode != v1alpha1.ModeNFTables {
		t.Errorf("a-00 runs %s", pn.Status.ActiveMode)
	}
	if pn := w.proxyNode("b-00"); pn.Status.ActiveMode != v1alpha1.ModeIPVS {
		t.Errorf("b-00 runs %s", pn.Status.ActiveMode)
	}
	for _, ch := range w.rec.specChanges() {
		if strings.HasPrefix(ch, "shared=") {
			t.Errorf("the shared node was moved: %s", ch)
		}
	}
	w.rec.check(t)
}

func TestPauseResumeNewTargetAndLateNode(t *testing.T) {
	w := newWorld(t)
	nodes := w.createNodes("node", 10, pool)
	w.agents.def.delay = 600 * time.Millisecond
	w.rec.track("pc", nodes, 2)
	w.startOperator(opOptions{})
	w.create(newConfig("pc", v1alpha1.ModeIPVS, intstr.FromInt32(2)))

	// Pause mid-rollout: nothing new starts.
	w.waitFor("3 nodes updated", 30*time.Second, func() bool { return w.config("pc").Status.Nodes.Updated >= 3 })
	w.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = true })
	c := w.waitPhase("pc", v1alpha1.RolloutPaused, 10*time.Second)
	before := len(w.rec.specChanges())
	time.Sleep(3 * time.Second)
	if got := w.rec.specChanges(); len(got) != before {
		t.Fatalf("paused rollout moved nodes: %v", got[before:])
	}
	if r := cond(w.config("pc"), v1alpha1.ConditionProgressing); r.Reason != plan.ReasonPaused || r.Status != metav1.ConditionFalse {
		t.Errorf("Progressing %+v", r)
	}
	start := c.Status.StartTime

	// Resume: the same rollout goes on.
	w.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = false })
	w.waitFor("6 nodes updated", 30*time.Second, func() bool { return w.config("pc").Status.Nodes.Updated >= 6 })
	if c := w.config("pc"); !c.Status.StartTime.Equal(start) {
		t.Errorf("resume started a new rollout: %v -> %v", start, c.Status.StartTime)
	}

	// A new target mid-rollout re-plans from what the nodes report.
	w.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = v1alpha1.ModeNFTables })
	c = w.waitPhase("pc", v1alpha1.RolloutCompleted, 60*time.Second)
	if c.Status.TargetMode != v1alpha1.ModeNFTables || c.Status.Nodes.Summary != "10/10" {
		t.Errorf("status %+v", c.Status)
	}
	for _, n := range nodes {
		if pn := w.proxyNode(n); pn.Status.ActiveMode != v1alpha1.ModeNFTables {
			t.Errorf("%s runs %s", n, pn.Status.ActiveMode)
		}
	}

	// A node joining after completion gets the current mode.
	w.createNode("node-late", pool)
	w.rec.addToGroup("pc", "node-late")
	w.waitFor("the late node to run nftables", 30*time.Second, func() bool {
		c := w.config("pc")
		return c.Status.Phase == v1alpha1.RolloutCompleted && c.Status.Nodes.Summary == "11/11"
	})
	if pn := w.proxyNode("node-late"); pn.Status.ActiveMode != v1alpha1.ModeNFTables {
		t.Errorf("late node runs %s", pn.Status.ActiveMode)
	}

	// A deleted node drops out of the counts.
	w.deleteNode("node-03")
	w.rec.removeFromGroup("pc", "node-03")
	w.waitFor("10/10 after a delete", 10*time.Second, func() bool { return w.config("pc").Status.Nodes.Summary == "10/10" })
	w.rec.check(t)
}

func TestOperatorRestartMidRollout(t *testing.T) {
	w := newWorld(t)
	nodes := w.createNodes("node", 12, pool)
	w.agents.def.delay = 700 * time.Millisecond
	w.rec.track("pc", nodes, 3)
	op := w.startOperator(opOptions{leaderElection: true})
	pc := newConfig("pc", v1alpha1.ModeNFTables, intstr.FromInt32(3))
	pc.Spec.Rollout.Canary = v1alpha1.CanaryPolicy{Nodes: ptr.To(int32(2))}
	w.create(pc)

	// Kill it while the canary is moving.
	w.waitFor("the canary to start", 30*time.Second, func() bool { return len(w.rec.specChanges()) >= 1 })
	op.stop(t)
	op = w.startOperator(opOptions{leaderElection: true})
	// And again in the middle of the batches.
	w.waitFor("5 nodes updated", 60*time.Second, func() bool { return w.config("pc").Status.Nodes.Updated >= 5 })
	op.stop(t)
	time.Sleep(time.Second) // agents finish their switches meanwhile
	w.startOperator(opOptions{leaderElection: true})

	c := w.waitPhase("pc", v1alpha1.RolloutCompleted, 60*time.Second)
	if c.Status.Nodes.Summary != "12/12" {
		t.Errorf("counts %+v", c.Status.Nodes)
	}
	if got := w.rec.specChanges(); len(got) != 12 {
		t.Errorf("%d spec changes for 12 nodes: %v", len(got), got)
	}
	w.rec.check(t)
}

func TestInvalidAndImpossibleSituations(t *testing.T) {
	w := newWorld(t)
	w.createNodes("node", 3, pool)
	w.createNode("silent", map[string]string{"pool": "silent"})
	w.agents.set("silent", behavior{}) // its agent never reports
	op := w.startOperator(opOptions{})

	// A spec the API accepts but the operator cannot run: a zero node
	// timeout. (A selector that does not parse no longer gets this far:
	// the API server refuses it, see test/apiserver.)
	bad := newConfig("bad-spec", v1alpha1.ModeNFTables, intstr.FromInt32(1))
	bad.Spec.NodeSelector = &v1alpha1.NodeSelector{MatchLabels: map[string]v1alpha1.LabelValue{"pool": "workers"}}
	bad.Spec.Rollout.NodeTimeout = "0"
	w.create(bad)
	// A selector matching nothing.
	none := newConfig("no-nodes", v1alpha1.ModeNFTables, intstr.FromInt32(1))
	none.Spec.NodeSelector = &v1alpha1.NodeSelector{MatchLabels: map[string]v1alpha1.LabelValue{"pool": "nope"}}
	w.create(none)
	// A node whose agent never reports: preflight waits, then fails.
	silent := newConfig("silent", v1alpha1.ModeNFTables, intstr.FromInt32(1))
	silent.Spec.NodeSelector = &v1alpha1.NodeSelector{MatchLabels: map[string]v1alpha1.LabelValue{"pool": "silent"}}
	silent.Spec.Rollout.NodeTimeout = "3s"
	w.create(silent)

	c := w.waitPhase("bad-spec", v1alpha1.RolloutFailed, 10*time.Second)
	if d := cond(c, v1alpha1.ConditionDegraded); d.Reason != plan.ReasonInvalidSpec || !strings.Contains(d.Message, "spec.rollout.nodeTimeout") {
		t.Errorf("Degraded %+v", d)
	}
	c = w.waitPhase("no-nodes", v1alpha1.RolloutPending, 10*time.Second)
	if r := cond(c, v1alpha1.ConditionReady); r.Reason != plan.ReasonNoNodesSelected {
		t.Errorf("Ready %+v", r)
	}
	w.waitPhase("silent", v1alpha1.RolloutPreflight, 10*time.Second)
	c = w.waitPhase("silent", v1alpha1.RolloutFailed, 15*time.Second)
	if len(c.Status.FailedNodes) != 1 || !strings.Contains(c.Status.FailedNodes[0].Reason, "not reported kernel facts") {
		t.Errorf("failed %+v", c.Status.FailedNodes)
	}
	// No crash loop: settled configs are not reconciled over and over.
	n1 := op.r.Totals().Reconciles
	time.Sleep(3 * time.Second)
	if n2 := op.r.Totals().Reconciles; n2-n1 > 5 {
		t.Errorf("%d reconciles in 3s with nothing changing", n2-n1)
	}
	if e := op.r.Totals().Errors; e != 0 {
		t.Errorf("%d reconcile errors", e)
	}
	// Fixing the spec clears the condition.
	w.edit("bad-spec", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "1m" })
	c = w.waitPhase("bad-spec", v1alpha1.RolloutCompleted, 30*time.Second)
	if d := cond(c, v1alpha1.ConditionDegraded); d.Status != metav1.ConditionFalse {
		t.Errorf("Degraded %+v", d)
	}
}

// TestEveryNodeGetsAProxyNodeWithoutAConfig: installing proxyshift gives
// every Node an empty ProxyNode (owned by it, nothing desired), so each
// agent has one to report on while no ProxyConfig exists; one deleted by
// hand comes back.
func TestEveryNodeGetsAProxyNodeWithoutAConfig(t *testing.T) {
	w := newWorld(t)
	nodes := w.createNodes("plain", 3, nil)
	w.startOperator(opOptions{})
	check := func(n string) {
		t.Helper()
		var pn *v1alpha1.ProxyNode
		w.waitFor("ProxyNode "+n, 30*time.Second, func() bool {
			pn = &v1alpha1.ProxyNode{}
			return w.c.Get(w.ctx, types.NamespacedName{Name: n}, pn) == nil
		})
		if pn.Spec.DesiredMode != "" || pn.Spec.ConfigRef != nil {
			t.Errorf("%s: spec %+v, want nothing desired", n, pn.Spec)
		}
		if len(pn.OwnerReferences) != 1 || pn.OwnerReferences[0].Kind != "Node" || pn.OwnerReferences[0].Name != n || pn.OwnerReferences[0].UID == "" {
			t.Errorf("%s: owners %+v, want its Node", n, pn.OwnerReferences)
		}
	}
	for _, n := range nodes {
		check(n)
	}
	w.createNode("late", nil)
	check("late")

	old := w.proxyNode(nodes[0])
	if err := w.c.Delete(w.ctx, old); err != nil {
		t.Fatal(err)
	}
	w.waitFor("ProxyNode "+nodes[0]+" created again", 30*time.Second, func() bool {
		pn := &v1alpha1.ProxyNode{}
		return w.c.Get(w.ctx, types.NamespacedName{Name: nodes[0]}, pn) == nil && pn.UID != old.UID
	})
	check(nodes[0])
}
