package plan

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// refusedInPreflight runs s until ProxyConfig pc fails and checks that
// no node was changed, that the failed nodes are exactly nodes and that
// each one's reason says every phrase of says.
func (s *sim) refusedInPreflight(nodes []string, says ...string) {
	s.t.Helper()
	s.run(50, s.phaseIs("pc", v1alpha1.RolloutFailed))
	if len(s.specLog) != 0 {
		s.t.Fatalf("nodes changed: %v", s.specLog)
	}
	st := s.cfg("pc").Status
	var failed []string
	for _, f := range st.FailedNodes {
		failed = append(failed, f.Name)
	}
	if !slices.Equal(failed, nodes) {
		s.t.Fatalf("failed nodes %+v, want %v", st.FailedNodes, nodes)
	}
	for _, f := range st.FailedNodes {
		for _, w := range says {
			if !strings.Contains(f.Reason, w) {
				s.t.Errorf("%s: reason %q does not say %q", f.Name, f.Reason, w)
			}
		}
	}
}

func TestPreflightBlocksMissingIPVS(t *testing.T) {
	s := newSim(t, 5, v1alpha1.ModeIPVS)
	s.agents["node-03"].facts = noIPVS()
	s.refusedInPreflight([]string{"node-03"}, "ip_vs is Missing", "ip_vs_rr not reported")
	s.steps(20)
	if len(s.specLog) != 0 {
		t.Fatalf("nodes changed after the refusal: %v", s.specLog)
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
	s := newSim(t, 0, v1alpha1.ModeNFTables, selector(map[string]v1alpha1.LabelValue{"pool": "a"}))
	for i := 0; i < 4; i++ {
		s.addNode(fmt.Sprintf("a-%d", i), map[string]string{"pool": "a"})
		s.addNode(fmt.Sprintf("b-%d", i), map[string]string{"pool": "b"})
	}
	s.addNode("both", map[string]string{"pool": "a", "edge": "yes"})
	s.addConfig("edge", v1alpha1.ModeIPVS, func(c *v1alpha1.ProxyConfig) {
		c.Spec.NodeSelector = &v1alpha1.NodeSelector{MatchExpressions: []v1alpha1.NodeSelectorRequirement{
			{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []v1alpha1.LabelValue{"b"}}}}
	}, func(c *v1alpha1.ProxyConfig) {
		c.Spec.NodeSelector.MatchExpressions = nil
		c.Spec.NodeSelector.MatchLabels = map[string]v1alpha1.LabelValue{"edge": "yes"}
	})
	s.cfg("edge").Spec.NodeSelector = &v1alpha1.NodeSelector{MatchExpressions: []v1alpha1.NodeSelectorRequirement{
		{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []v1alpha1.LabelValue{"b"}}}}
	// edge selects pool=b or edge=yes? A selector is an AND, so use two
	// matchExpressions-free configs: "edge" selects pool in (b) plus the
	// node "both" via a second label.
	s.cfg("edge").Spec.NodeSelector = &v1alpha1.NodeSelector{MatchExpressions: []v1alpha1.NodeSelectorRequirement{
		{Key: "side", Operator: metav1.LabelSelectorOpIn, Values: []v1alpha1.LabelValue{"b"}}}}
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

func TestNoNodesSelected(t *testing.T) {
	s := newSim(t, 3, v1alpha1.ModeNFTables, selector(map[string]v1alpha1.LabelValue{"pool": "nope"}))
	s.steps(2)
	st := s.cfg("pc").Status
	if st.Phase != v1alpha1.RolloutPending || st.Nodes.Summary != "0/0" || st.Selector != "pool=nope" {
		t.Fatalf("%+v", st)
	}
	if c := s.cond("pc", v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != ReasonNoNodesSelected {
		t.Errorf("Ready %+v", c)
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

// TestPreflightKubeProxyNeedsItsDaemonSet: handing nodes back to
// kube-proxy fails preflight, naming the DaemonSet and the flag, when the
// DaemonSet is not found or none is configured; nothing moves until it is.
func TestPreflightKubeProxyNeedsItsDaemonSet(t *testing.T) {
	for _, tc := range []struct {
		kp   KubeProxy
		want string
	}{
		{KubeProxy{DaemonSet: "kube-system/kube-proxy"}, "kube-proxy's DaemonSet kube-system/kube-proxy (--kube-proxy-daemonset) was not found"},
		{KubeProxy{}, `--kube-proxy-daemonset="" (this cluster has no kube-proxy)`},
	} {
		s := newSim(t, 3, v1alpha1.ModeKubeProxy)
		s.kubeProxy = tc.kp
		s.refusedInPreflight([]string{"node-00", "node-01", "node-02"}, tc.want)
		if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonPreflightFailed || !strings.Contains(c.Message, tc.want) {
			t.Errorf("Degraded %+v", c)
		}
		s.kubeProxy = KubeProxy{DaemonSet: "kube-system/kube-proxy", Found: true}
		s.edit("pc", func(*v1alpha1.ProxyConfig) {}) // a person retries
		s.run(300, s.phaseIs("pc", v1alpha1.RolloutCompleted))
		for name, pn := range s.pns {
			if pn.Status.ActiveMode != v1alpha1.ModeKubeProxy {
				t.Errorf("%s runs %s", name, pn.Status.ActiveMode)
			}
		}
	}
}

// TestPreflightKubeProxyRulesWithoutDaemonSet: a node holding kube-proxy's
// rules cannot be taken over while kube-proxy's DaemonSet is not found
// (the operator could not stop kube-proxy there); the message says what
// to do. With no kube-proxy configured, or the DaemonSet found, it can.
func TestPreflightKubeProxyRulesWithoutDaemonSet(t *testing.T) {
	for _, tc := range []struct {
		kp   KubeProxy
		fail bool
	}{
		{KubeProxy{DaemonSet: "kube-system/kube-proxy"}, true},
		{KubeProxy{DaemonSet: "kube-system/kube-proxy", Found: true}, false},
		{KubeProxy{}, false},
	} {
		s := newSim(t, 3, v1alpha1.ModeNFTables)
		s.kubeProxy = tc.kp
		s.agents["node-01"].kubeProxyMode = v1alpha1.ModeIPTables
		if !tc.fail {
			s.run(300, s.phaseIs("pc", v1alpha1.RolloutCompleted))
			continue
		}
		s.refusedInPreflight([]string{"node-01"},
			"kube-proxy's iptables rules are on the node but its DaemonSet kube-system/kube-proxy (--kube-proxy-daemonset) was not found",
			"--kube-proxy-daemonset=<namespace/name>", `--kube-proxy-daemonset="" if kube-proxy was removed for good`)
	}
}

// TestPreflightKubeProxyIPVSIntoIPVS: a node whose kernel holds kube-proxy's
// IPVS rules cannot be taken over into proxyshift's ipvs mode (both
// program the same IPVS virtual services): preflight refuses it, naming
// the way round, before any node moves. Into nftables it can.
func TestPreflightKubeProxyIPVSIntoIPVS(t *testing.T) {
	for _, target := range []v1alpha1.ProxyMode{v1alpha1.ModeIPVS, v1alpha1.ModeNFTables} {
		s := newSim(t, 3, target)
		s.kubeProxy = KubeProxy{DaemonSet: "kube-system/kube-proxy", Found: true}
		for _, a := range s.agents {
			a.initial, a.kubeProxyMode = v1alpha1.ModeKubeProxy, v1alpha1.ModeIPTables
		}
		s.agents["node-01"].kubeProxyMode = v1alpha1.ModeIPVS
		if target != v1alpha1.ModeIPVS {
			s.run(300, s.phaseIs("pc", v1alpha1.RolloutCompleted))
			continue
		}
		s.refusedInPreflight([]string{"node-01"},
			"kube-proxy's ipvs rules are on the node", "same IPVS virtual services", "move the node to nftables or iptables first, then to ipvs")
		if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonPreflightFailed || !strings.Contains(c.Message, "node-01") {
			t.Errorf("Degraded %+v", c)
		}
	}
}

// zonedSim is a world of nodes node-00, node-01, ... labelled with the
// given zones, whose switches take 30 seconds.
func zonedSim(t *testing.T, zones ...string) *sim {
	s := &sim{t: t, pns: map[string]*v1alpha1.ProxyNode{}, agents: map[string]*agent{}, now: t0, tick: time.Second,
		writes: map[string]int{}, maxSeen: map[string]int{}}
	for i, zone := range zones {
		s.addNode(fmt.Sprintf("node-%02d", i), map[string]string{"zone": zone}).delay = 30 * time.Second
	}
	return s
}

// countInTransition counts every ProxyNode in transition, selected or not.
func (s *sim) countInTransition() int {
	c := 0
	for _, pn := range s.pns {
		if InTransition(pn) {
			c++
		}
	}
	return c
}

// The selector is narrowed while the first batch is still switching: the
// nodes it left still count against maxUnavailable, so the newly selected
// nodes wait; one of them fails, and the rollout rolls it back and fails.
func TestSelectorNarrowedMidRollout(t *testing.T) {
	s := zonedSim(t, "x", "x", "y", "y")
	s.agents["node-00"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeNFTables: true}
	s.addConfig("pc", v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)), canary(0, ""))
	s.steps(3)
	if n := s.countInTransition(); n != 2 {
		t.Fatalf("setup: %d in transition\n%s", n, s.dump())
	}
	s.edit("pc", selector(map[string]v1alpha1.LabelValue{"zone": "y"}))
	s.steps(2)
	if n := s.countInTransition(); n != 2 {
		t.Errorf("%d nodes in transition with maxUnavailable 2 after the selector was narrowed\n%s", n, s.dump())
	}
	if c := s.cond("pc", v1alpha1.ConditionProgressing); !strings.Contains(c.Message, "no longer selected by it alone and are still in transition (node-00, node-01)") {
		t.Errorf("Progressing does not name the nodes that left the selection: %+v", c)
	}
	s.run(300, s.phaseIs("pc", v1alpha1.RolloutFailed))
	st := s.cfg("pc").Status
	if len(st.FailedNodes) != 1 || st.FailedNodes[0].Name != "node-00" {
		t.Errorf("failedNodes %+v, want node-00", st.FailedNodes)
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Reason != ReasonRolledBack || !strings.Contains(c.Message, "node node-00 failed") {
		t.Errorf("Degraded %+v", c)
	}
	if c := s.cond("pc", v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse {
		t.Errorf("Ready %+v", c)
	}
	pn := s.pns["node-00"]
	if pn.Status.ActiveMode != v1alpha1.ModeIPTables || pn.Annotations[AnnotationRolledBack] == "" {
		t.Errorf("node-00 was not rolled back: active %s, annotations %v", pn.Status.ActiveMode, pn.Annotations)
	}
	for _, name := range []string{"node-02", "node-03"} {
		if d := s.pns[name].Spec.DesiredMode; d != "" {
			t.Errorf("%s was started (%s) although the budget was full", name, d)
		}
	}
}

// A second ProxyConfig selecting the node the first one is switching is
// created: the node becomes a conflict, yet the config that moved it still
// counts it against maxUnavailable and rolls it back when it fails; the
// other config never writes it.
func TestConflictMidRolloutKeepsBudgetAndRollback(t *testing.T) {
	s := zonedSim(t, "x", "y", "y", "y")
	s.agents["node-00"].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeNFTables: true}
	s.addConfig("pc", v1alpha1.ModeNFTables, maxU(intstr.FromInt32(1)), canary(0, ""))
	s.steps(2)
	if n := s.countInTransition(); n != 1 || !InTransition(s.pns["node-00"]) {
		t.Fatalf("setup: %d in transition\n%s", n, s.dump())
	}
	s.addConfig("other", v1alpha1.ModeIPVS, selector(map[string]v1alpha1.LabelValue{"zone": "x"}))
	s.steps(2)
	if n := s.countInTransition(); n != 1 {
		t.Errorf("%d nodes in transition with maxUnavailable 1 after a conflict appeared\n%s", n, s.dump())
	}
	s.run(300, s.phaseIs("pc", v1alpha1.RolloutFailed))
	if st := s.cfg("pc").Status; len(st.FailedNodes) != 1 || st.FailedNodes[0].Name != "node-00" {
		t.Errorf("failedNodes %+v, want node-00", st.FailedNodes)
	}
	pn := s.pns["node-00"]
	if pn.Status.ActiveMode != v1alpha1.ModeIPTables || !strings.HasPrefix(pn.Annotations[AnnotationRolledBack], "pc@") {
		t.Errorf("pc did not roll node-00 back: active %s, annotations %v", pn.Status.ActiveMode, pn.Annotations)
	}
	for _, w := range s.specLog {
		if w == "node-00=ipvs" {
			t.Errorf("the other config wrote the conflicting node: %v", s.specLog)
		}
	}
}

// TestHandBackFromIPVSIntoKubeProxyIPVS: a node proxyshift serves in ipvs
// mode cannot be handed back to a kube-proxy whose configuration says
// ipvs (kube-proxy would adopt proxyshift's virtual services, which
// proxyshift's cleanup then deletes): preflight refuses it, naming the
// way round, before any node moves. A kube-proxy in iptables mode takes
// it back.
func TestHandBackFromIPVSIntoKubeProxyIPVS(t *testing.T) {
	for _, kubeProxyMode := range []string{"ipvs", "iptables"} {
		t.Run(kubeProxyMode, func(t *testing.T) {
			s := newSim(t, 3, v1alpha1.ModeKubeProxy)
			for _, a := range s.agents {
				a.initial = v1alpha1.ModeIPVS
			}
			s.kubeProxy = kubeProxyFound("kind: KubeProxyConfiguration\nmode: " + kubeProxyMode + "\n")
			if kubeProxyMode != "ipvs" {
				s.run(300, s.phaseIs("pc", v1alpha1.RolloutCompleted))
				return
			}
			s.refusedInPreflight([]string{"node-00", "node-01", "node-02"},
				"the node runs proxyshift's ipvs mode and kube-proxy starts in ipvs mode", "move the node to nftables or iptables first, then hand it back")
		})
	}
}
