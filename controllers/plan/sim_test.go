package plan

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// agent is a simulated node agent.
type agent struct {
	facts    *v1alpha1.KernelFacts // nil: never reports
	initial  v1alpha1.ProxyMode    // mode it runs before any spec
	delay    time.Duration         // how long a switch takes
	failOn   map[v1alpha1.ProxyMode]bool
	hang     bool // never finishes a switch
	fallback v1alpha1.ProxyMode
	// kubeProxyMode is the mode of the kube-proxy rules it reports.
	kubeProxyMode v1alpha1.ProxyMode

	busyUntil time.Time
	working   string
}

func allFacts() *v1alpha1.KernelFacts {
	return &v1alpha1.KernelFacts{
		Version: "6.1.0",
		Modules: []v1alpha1.KernelModule{
			{Name: "ip_vs", State: v1alpha1.ModuleLoadable},
			{Name: "ip_vs_rr", State: v1alpha1.ModuleLoadable},
			{Name: "ip_vs_wrr", State: v1alpha1.ModuleLoadable},
			{Name: "nf_conntrack", State: v1alpha1.ModuleLoaded},
		},
		NFTables:         v1alpha1.CapabilityYes,
		IPTablesBackends: []v1alpha1.IPTablesBackend{{Name: "nft", Available: v1alpha1.CapabilityYes, HasRules: v1alpha1.CapabilityNo}},
	}
}

func noIPVS() *v1alpha1.KernelFacts {
	f := allFacts()
	f.Modules = []v1alpha1.KernelModule{{Name: "ip_vs", State: v1alpha1.ModuleMissing}, {Name: "nf_conntrack", State: v1alpha1.ModuleLoaded}}
	return f
}

// sim is a little world: nodes, ProxyNodes, agents, a clock, and a
// ProxyConfig whose status is whatever the planner last wrote.
type sim struct {
	t       *testing.T
	cfgs    []*v1alpha1.ProxyConfig
	nodes   []Node
	pns     map[string]*v1alpha1.ProxyNode
	agents  map[string]*agent
	now     time.Time
	tick    time.Duration
	events  []Event
	writes  map[string]int // ProxyNode writes per node
	maxSeen map[string]int // per config: most nodes in transition at once
	specLog []string       // "node=mode" for each spec write, in order
	// dropNodeWrites, when it returns true, loses a plan's ProxyNode
	// updates after its status was written (a crash between the two).
	dropNodeWrites func(step int) bool
	step           int
	// kubeProxy is what the operator knows of kube-proxy's DaemonSet.
	kubeProxy KubeProxy
	// services are the cluster's Services.
	services []*corev1.Service
}

func newSim(t *testing.T, n int, mode v1alpha1.ProxyMode, mut ...func(*v1alpha1.ProxyConfig)) *sim {
	s := &sim{t: t, pns: map[string]*v1alpha1.ProxyNode{}, agents: map[string]*agent{}, now: t0, tick: time.Second,
		writes: map[string]int{}, maxSeen: map[string]int{}}
	for i := 0; i < n; i++ {
		s.addNode(fmt.Sprintf("node-%02d", i), map[string]string{"pool": "a"})
	}
	s.addConfig("pc", mode, mut...)
	return s
}

func (s *sim) addNode(name string, lbl map[string]string) *agent {
	s.nodes = append(s.nodes, Node{Name: name, UID: types.UID("uid-" + name), Labels: lbl})
	a := &agent{facts: allFacts(), initial: v1alpha1.ModeIPTables, delay: 3 * time.Second}
	s.agents[name] = a
	return a
}

func (s *sim) addConfig(name string, mode v1alpha1.ProxyMode, mut ...func(*v1alpha1.ProxyConfig)) *v1alpha1.ProxyConfig {
	c := &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, UID: types.UID("uid-" + name)}}
	c.Spec.Mode = mode
	for _, m := range mut {
		m(c)
	}
	s.cfgs = append(s.cfgs, c)
	return c
}

func (s *sim) cfg(name string) *v1alpha1.ProxyConfig {
	for _, c := range s.cfgs {
		if c.Name == name {
			return c
		}
	}
	s.t.Fatalf("no config %s", name)
	return nil
}

// edit changes a config's spec and bumps its generation, as the API does.
func (s *sim) edit(name string, f func(*v1alpha1.ProxyConfig)) {
	c := s.cfg(name)
	f(c)
	c.Generation++
}

func (s *sim) others() []v1alpha1.ProxyConfig {
	var out []v1alpha1.ProxyConfig
	for _, c := range s.cfgs {
		out = append(out, *c)
	}
	return out
}

func (s *sim) input(c *v1alpha1.ProxyConfig) Input {
	return Input{Config: c.DeepCopy(), Others: s.others(), Nodes: s.nodes, ProxyNodes: s.pns, Now: s.now, KubeProxy: s.kubeProxy, Services: s.services}
}

// runAgents lets every agent act on its ProxyNode.
func (s *sim) runAgents() {
	names := make([]string, 0, len(s.pns))
	for n := range s.pns {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		pn, a := s.pns[name], s.agents[name]
		if a == nil || a.facts == nil {
			continue
		}
		st := &pn.Status
		if st.Kernel == nil {
			st.Kernel = a.facts.DeepCopy()
			st.ActiveMode = a.initial
			st.KubeProxyMode = a.kubeProxyMode
			st.Phase = v1alpha1.NodeActive
		}
		spec := pn.Spec
		if spec.DesiredMode == "" || spec.ConfigRef == nil {
			continue
		}
		// Like a real agent, it keys "have I acted on this spec" on the
		// config reference it reports back.
		if st.ObservedConfig != nil && *st.ObservedConfig == *spec.ConfigRef {
			continue
		}
		key := fmt.Sprintf("%s|%s/%d", spec.DesiredMode, spec.ConfigRef.Name, spec.ConfigRef.Generation)
		if a.working != key {
			a.working = key
			a.busyUntil = s.now.Add(a.delay)
			st.Phase = v1alpha1.NodeProgramming
			continue
		}
		if a.hang || s.now.Before(a.busyUntil) {
			continue
		}
		st.ObservedConfig = spec.ConfigRef.DeepCopy()
		switch {
		case a.failOn[spec.DesiredMode]:
			st.Phase = v1alpha1.NodeFailed
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: contract.ConditionReady, Status: metav1.ConditionFalse,
				Reason: "VerifyFailed", Message: "probe of service 10.0.0.1:80 failed"})
		case a.fallback != "":
			st.Phase = v1alpha1.NodeActive
			st.ActiveMode = a.fallback
		default:
			st.Phase = v1alpha1.NodeActive
			st.ActiveMode = spec.DesiredMode
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: contract.ConditionReady, Status: metav1.ConditionTrue, Reason: "Synced"})
		}
	}
}

// plan runs the planner for one config and applies its result.
func (s *sim) plan(c *v1alpha1.ProxyConfig) Result {
	res := Plan(s.input(c))
	// Determinism: the same input plans the same.
	if again := Plan(s.input(c)); !apiequality.Semantic.DeepEqual(res, again) {
		s.t.Fatalf("planner is not deterministic:\n%+v\n%+v", res, again)
	}
	if os.Getenv("SIM_TRACE") != "" && (c.Status.Phase != res.Status.Phase || c.Generation != c.Status.ObservedGeneration || len(res.Update) > 0) {
		var ups []string
		for _, u := range res.Update {
			ups = append(ups, u.Name+"="+string(u.Spec.DesiredMode))
		}
		deg := meta.FindStatusCondition(res.Status.Conditions, v1alpha1.ConditionDegraded)
		s.t.Logf("step %d gen %d paused=%v mode=%s: %s -> %s (%s) start=%v updates=%v", s.step, c.Generation, c.Spec.Rollout.Paused, c.Spec.Mode,
			c.Status.Phase, res.Status.Phase, deg.Reason, res.Status.StartTime, ups)
	}
	c.Status = res.Status
	s.events = append(s.events, res.Events...)
	if ph := res.Status.Phase; ph != v1alpha1.RolloutRollingBack && ph != v1alpha1.RolloutFailed && res.Status.StartTime != nil {
		rid := RolloutID(c.Name, res.Status.StartTime.Time)
		for _, pn := range s.pns {
			if pn.Annotations[AnnotationRolledBack] == rid {
				s.t.Fatalf("step %d: phase %s while %s was rolled back by the current rollout\n%s", s.step, ph, pn.Name, s.dump())
			}
		}
	}
	for _, pn := range res.Delete {
		delete(s.pns, pn.Name)
	}
	for _, pn := range res.Create {
		if s.pns[pn.Name] != nil {
			s.t.Fatalf("create of existing ProxyNode %s", pn.Name)
		}
		pn = pn.DeepCopy()
		pn.CreationTimestamp = metav1.NewTime(s.now)
		s.pns[pn.Name] = pn
		if a := s.agents[pn.Name]; a != nil {
			a.working = "" // a new object: the agent starts over
		}
		s.writes[pn.Name]++
	}
	if s.dropNodeWrites != nil && s.dropNodeWrites(s.step) {
		return res
	}
	for _, pn := range res.Update {
		old := s.pns[pn.Name]
		if old == nil {
			s.t.Fatalf("update of missing ProxyNode %s", pn.Name)
		}
		if !apiequality.Semantic.DeepEqual(old.Status, pn.Status) {
			s.t.Fatalf("planner changed the status of ProxyNode %s", pn.Name)
		}
		s.pns[pn.Name] = pn.DeepCopy()
		s.writes[pn.Name]++
		s.specLog = append(s.specLog, pn.Name+"="+string(pn.Spec.DesiredMode))
	}
	return res
}

// inTransition counts the nodes in transition a config answers for
// (its non-conflicting selected nodes, and the nodes it moved that it no
// longer selects alone), and resolves its maxUnavailable.
func (s *sim) inTransition(c *v1alpha1.ProxyConfig) (int, int) {
	sel, err := Selector(c)
	if err != nil {
		return 0, 1
	}
	selected, inTrans := 0, 0
	for _, n := range s.nodes {
		if n.Deleting {
			continue
		}
		pn := s.pns[n.Name]
		selectedAlone := sel.Matches(labels.Set(n.Labels))
		if selectedAlone {
			selected++
			selectedAlone = !s.conflicting(c, n)
		}
		if pn != nil && InTransition(pn) && (selectedAlone || movedBy(pn) == c.Name) {
			inTrans++
		}
	}
	mu, _ := MaxUnavailable(c.Spec.Rollout.MaxUnavailable, selected)
	return inTrans, mu
}

// planChecked plans for a config and asserts the safety invariant: the
// planner never brings more than maxUnavailable nodes into transition.
// (The count may stand above the limit without the planner's doing, when
// deleted nodes shrink a percentage; then it must not grow.)
func (s *sim) planChecked(c *v1alpha1.ProxyConfig) {
	before, _ := s.inTransition(c)
	s.plan(c)
	after, mu := s.inTransition(c)
	if after > s.maxSeen[c.Name] {
		s.maxSeen[c.Name] = after
	}
	if after > before && after > mu {
		s.t.Fatalf("step %d: config %s went from %d to %d nodes in transition, maxUnavailable %d\n%s", s.step, c.Name, before, after, mu, s.dump())
	}
}

func (s *sim) conflicting(c *v1alpha1.ProxyConfig, n Node) bool {
	for _, o := range s.cfgs {
		if o.Name == c.Name {
			continue
		}
		if sel, err := Selector(o); err == nil && sel.Matches(labels.Set(n.Labels)) {
			return true
		}
	}
	return false
}

// run advances the world until done says stop, failing after max steps.
func (s *sim) run(max int, done func() bool) {
	s.t.Helper()
	for i := 0; i < max; i++ {
		s.step++
		s.runAgents()
		for _, c := range s.cfgs {
			s.planChecked(c)
		}
		if done() {
			return
		}
		s.now = s.now.Add(s.tick)
	}
	s.t.Fatalf("not done after %d steps\n%s", max, s.dump())
}

func (s *sim) phaseIs(name string, ph v1alpha1.RolloutPhase) func() bool {
	return func() bool { return s.cfg(name).Status.Phase == ph }
}

func (s *sim) dump() string {
	var b strings.Builder
	for _, c := range s.cfgs {
		fmt.Fprintf(&b, "config %s gen %d: phase %s nodes %+v failed %+v\n", c.Name, c.Generation, c.Status.Phase, c.Status.Nodes, c.Status.FailedNodes)
		for _, cd := range c.Status.Conditions {
			fmt.Fprintf(&b, "  %s=%s %s: %s\n", cd.Type, cd.Status, cd.Reason, cd.Message)
		}
	}
	names := make([]string, 0, len(s.pns))
	for n := range s.pns {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		pn := s.pns[n]
		fmt.Fprintf(&b, "  %s desired=%s ref=%v active=%s phase=%s obs=%v ann=%v\n", n, pn.Spec.DesiredMode, pn.Spec.ConfigRef,
			pn.Status.ActiveMode, pn.Status.Phase, pn.Status.ObservedConfig, pn.Annotations)
	}
	return b.String()
}

func (s *sim) eventReasons() []string {
	var out []string
	for _, e := range s.events {
		out = append(out, e.Reason)
	}
	return out
}

func (s *sim) hasEvent(reason string) bool {
	for _, e := range s.events {
		if e.Reason == reason {
			return true
		}
	}
	return false
}

func (s *sim) cond(name, typ string) metav1.Condition {
	c := meta.FindStatusCondition(s.cfg(name).Status.Conditions, typ)
	if c == nil {
		s.t.Fatalf("config %s has no %s condition", name, typ)
	}
	return *c
}

func maxU(v intstr.IntOrString) func(*v1alpha1.ProxyConfig) {
	return func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.MaxUnavailable = &v }
}

func canary(n int32, pause v1alpha1.Duration) func(*v1alpha1.ProxyConfig) {
	return func(c *v1alpha1.ProxyConfig) {
		c.Spec.Rollout.Canary = v1alpha1.CanaryPolicy{Nodes: ptr.To(n), Pause: pause}
	}
}

func autoRollback(b bool) func(*v1alpha1.ProxyConfig) {
	return func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.AutoRollback = ptr.To(b) }
}

func selector(lbl map[string]v1alpha1.LabelValue) func(*v1alpha1.ProxyConfig) {
	return func(c *v1alpha1.ProxyConfig) { c.Spec.NodeSelector = &v1alpha1.NodeSelector{MatchLabels: lbl} }
}

// steps advances the world n steps (and the clock), whatever happens.
func (s *sim) steps(n int) {
	s.t.Helper()
	for i := 0; i < n; i++ {
		s.step++
		s.runAgents()
		for _, c := range s.cfgs {
			s.planChecked(c)
		}
		s.now = s.now.Add(s.tick)
	}
}
