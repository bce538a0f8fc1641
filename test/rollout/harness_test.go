package rollout

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers"
	"github.com/proxyshift/proxyshift/test/testenv"
	"github.com/proxyshift/proxyshift/test/testlog"
)

func init() { testlog.Init() }

// world is one test's API server with its agents, watch recorder and
// operator.
type world struct {
	t      testing.TB
	env    *testenv.Env
	c      client.WithWatch
	ctx    context.Context
	agents *agents
	rec    *recorder
	op     *operator
}

func newWorld(t testing.TB) *world {
	t.Helper()
	env := testenv.Start(t)
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &world{t: t, env: env, c: c, ctx: ctx}
	w.rec = startRecorder(t, ctx, c)
	w.agents = startAgents(t, ctx, c)
	return w
}

// operator is one running manager with the ProxyConfig reconciler.
type operator struct {
	r      *controllers.ProxyConfigReconciler
	cancel context.CancelFunc
	done   chan error
}

type opOptions struct {
	leaderElection bool
}

func (w *world) startOperator(o opOptions) *operator {
	w.t.Helper()
	mgr, err := ctrl.NewManager(w.env.Config, ctrl.Options{
		Scheme:                        w.env.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		Cache:                         controllers.CacheOptions(controllers.Options{KubeProxyDaemonSet: controllers.DefaultKubeProxyDaemonSet}),
		LeaderElection:                o.leaderElection,
		LeaderElectionID:              "proxyshift-operator.proxyshift.io",
		LeaderElectionNamespace:       "default",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 ptr.To(4 * time.Second),
		RenewDeadline:                 ptr.To(3 * time.Second),
		RetryPeriod:                   ptr.To(500 * time.Millisecond),
		Controller:                    ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		w.t.Fatal(err)
	}
	r, err := controllers.SetupWithManager(mgr, controllers.Options{KubeProxyDaemonSet: controllers.DefaultKubeProxyDaemonSet})
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	op := &operator{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { op.done <- mgr.Start(ctx) }()
	w.op = op
	w.t.Cleanup(func() { op.stop(w.t) })
	return op
}

func (o *operator) stop(t testing.TB) {
	if o.cancel == nil {
		return
	}
	o.cancel()
	o.cancel = nil
	select {
	case err := <-o.done:
		if err != nil {
			t.Errorf("manager: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("manager did not stop")
	}
	if e := o.r.Totals().Errors; e != 0 {
		t.Errorf("%d reconciles returned an error", e)
	}
}

// ---- objects ----

func (w *world) createNodes(prefix string, n int, lbl map[string]string) []string {
	w.t.Helper()
	var names []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-%02d", prefix, i)
		w.createNode(name, lbl)
		names = append(names, name)
	}
	return names
}

func (w *world) createNode(name string, lbl map[string]string) {
	w.t.Helper()
	l := map[string]string{}
	for k, v := range lbl {
		l[k] = v
	}
	if err := w.c.Create(w.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}); err != nil {
		w.t.Fatal(err)
	}
}

func newConfig(name string, mode v1alpha1.ProxyMode, mu intstr.IntOrString) *v1alpha1.ProxyConfig {
	return &v1alpha1.ProxyConfig{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ProxyConfigSpec{
			Mode: mode,
			Rollout: v1alpha1.RolloutPolicy{
				MaxUnavailable: &mu,
				NodeTimeout:    "20s",
			},
		},
	}
}

func (w *world) create(obj client.Object) {
	w.t.Helper()
	if err := w.c.Create(w.ctx, obj); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) config(name string) *v1alpha1.ProxyConfig {
	w.t.Helper()
	c := &v1alpha1.ProxyConfig{}
	if err := w.c.Get(w.ctx, types.NamespacedName{Name: name}, c); err != nil {
		w.t.Fatal(err)
	}
	return c
}

// edit changes a ProxyConfig's spec, retrying on conflicts.
func (w *world) edit(name string, f func(*v1alpha1.ProxyConfig)) {
	w.t.Helper()
	for i := 0; ; i++ {
		c := w.config(name)
		f(c)
		err := w.c.Update(w.ctx, c)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 20 {
			w.t.Fatal(err)
		}
	}
}

func (w *world) proxyNode(name string) *v1alpha1.ProxyNode {
	w.t.Helper()
	pn := &v1alpha1.ProxyNode{}
	if err := w.c.Get(w.ctx, types.NamespacedName{Name: name}, pn); err != nil {
		w.t.Fatalf("ProxyNode %s: %v", name, err)
	}
	return pn
}

// waitFor polls until cond holds, failing with the world's state.
func (w *world) waitFor(what string, timeout time.Duration, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out after %s waiting for %s\n%s", timeout, what, w.dump())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (w *world) waitPhase(name string, phase v1alpha1.RolloutPhase, timeout time.Duration) *v1alpha1.ProxyConfig {
	w.t.Helper()
	var c *v1alpha1.ProxyConfig
	w.waitFor(fmt.Sprintf("%s phase %s", name, phase), timeout, func() bool {
		c = w.config(name)
		return c.Status.Phase == phase && c.Status.ObservedGeneration == c.Generation
	})
	return c
}

func cond(c *v1alpha1.ProxyConfig, typ string) metav1.Condition {
	if x := meta.FindStatusCondition(c.Status.Conditions, typ); x != nil {
		return *x
	}
	return metav1.Condition{}
}

func (w *world) dump() string {
	var b strings.Builder
	var cl v1alpha1.ProxyConfigList
	_ = w.c.List(w.ctx, &cl)
	for _, c := range cl.Items {
		fmt.Fprintf(&b, "ProxyConfig %s gen %d: phase %s %+v failed %+v\n", c.Name, c.Generation, c.Status.Phase, c.Status.Nodes, c.Status.FailedNodes)
		for _, x := range c.Status.Conditions {
			fmt.Fprintf(&b, "  %s=%s %s: %s\n", x.Type, x.Status, x.Reason, x.Message)
		}
	}
	var pl v1alpha1.ProxyNodeList
	_ = w.c.List(w.ctx, &pl)
	for _, p := range pl.Items {
		fmt.Fprintf(&b, "  %s desired=%s ref=%v active=%s phase=%s observed=%v\n", p.Name, p.Spec.DesiredMode, p.Spec.ConfigRef, p.Status.ActiveMode, p.Status.Phase, p.Status.ObservedConfig)
	}
	return b.String()
}

// events returns the reasons of the events about a ProxyConfig, by reason.
func (w *world) events(config string) map[string][]string {
	w.t.Helper()
	var l eventsv1.EventList
	if err := w.c.List(w.ctx, &l); err != nil {
		w.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, e := range l.Items {
		if e.Regarding.Kind == "ProxyConfig" && e.Regarding.Name == config {
			out[e.Reason] = append(out[e.Reason], e.Note)
		}
	}
	return out
}

func (w *world) waitEvent(config, reason string) {
	w.t.Helper()
	w.waitFor(fmt.Sprintf("event %s on %s", reason, config), 20*time.Second, func() bool {
		return len(w.events(config)[reason]) > 0
	})
}

// ---- agents ----

// behavior is how one simulated agent acts.
type behavior struct {
	facts   *v1alpha1.KernelFacts // nil: never reports anything
	initial v1alpha1.ProxyMode
	// kubeProxyMode is the mode of the kube-proxy rules reported until
	// the node moves to a proxyshift mode.
	kubeProxyMode v1alpha1.ProxyMode
	delay         time.Duration
	jitter        time.Duration                 // up to this much is added to delay
	failOn        map[v1alpha1.ProxyMode]string // mode -> failure message
	hang          bool
}

func allFacts() *v1alpha1.KernelFacts {
	return &v1alpha1.KernelFacts{
		Version: "6.12.0",
		Modules: []v1alpha1.KernelModule{
			{Name: "ip_vs", State: v1alpha1.ModuleLoadable},
			{Name: "ip_vs_rr", State: v1alpha1.ModuleLoadable},
			{Name: "nf_conntrack", State: v1alpha1.ModuleLoaded},
		},
		NFTables:         v1alpha1.CapabilityYes,
		IPTablesBackends: []v1alpha1.IPTablesBackend{{Name: "nft", Available: v1alpha1.CapabilityYes, HasRules: v1alpha1.CapabilityYes}},
	}
}

// agents plays every node's agent: it watches ProxyNodes and answers each
// spec change by writing status (Programming, then Active in the desired
// mode, or Failed), after a configurable delay.
type agents struct {
	t      testing.TB
	c      client.Client
	ctx    context.Context
	mu     sync.Mutex
	def    behavior
	per    map[string]behavior
	acting map[string]string // node -> spec key being worked on
	writes int64
}

func startAgents(t testing.TB, ctx context.Context, c client.WithWatch) *agents {
	a := &agents{t: t, c: c, ctx: ctx, per: map[string]behavior{}, acting: map[string]string{},
		def: behavior{facts: allFacts(), initial: v1alpha1.ModeIPTables, delay: 300 * time.Millisecond}}
	started := make(chan struct{})
	go watchProxyNodes(ctx, c, func(_ watch.EventType, pn *v1alpha1.ProxyNode) { a.on(pn) }, started)
	<-started
	return a
}

func (a *agents) set(node string, b behavior) {
	a.mu.Lock()
	a.per[node] = b
	a.mu.Unlock()
}

func (a *agents) behavior(node string) behavior {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b, ok := a.per[node]; ok {
		return b
	}
	return a.def
}

func specKey(pn *v1alpha1.ProxyNode) string {
	ref := "-"
	if pn.Spec.ConfigRef != nil {
		ref = fmt.Sprintf("%s/%d", pn.Spec.ConfigRef.Name, pn.Spec.ConfigRef.Generation)
	}
	return fmt.Sprintf("%s|%s|%s", pn.UID, pn.Spec.DesiredMode, ref)
}

func (a *agents) on(pn *v1alpha1.ProxyNode) {
	b := a.behavior(pn.Name)
	if b.facts == nil {
		return
	}
	if pn.Status.Kernel == nil {
		a.patchStatus(pn.Name, func(st *v1alpha1.ProxyNodeStatus) {
			st.Kernel = b.facts.DeepCopy()
			st.Kernel.ReportedTime = ptr.To(metav1.Now())
			st.ActiveMode, st.KubeProxyMode = b.initial, b.kubeProxyMode
			st.Phase = v1alpha1.NodeActive
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Synced"})
		})
		return
	}
	if pn.Spec.DesiredMode == "" || pn.Spec.ConfigRef == nil {
		return
	}
	st := pn.Status
	if st.ObservedConfig != nil && *st.ObservedConfig == *pn.Spec.ConfigRef {
		return // already acted on this spec
	}
	key := specKey(pn)
	a.mu.Lock()
	if a.acting[pn.Name] == key {
		a.mu.Unlock()
		return
	}
	a.acting[pn.Name] = key
	a.mu.Unlock()
	go a.act(pn.Name, key, pn.Spec.DesiredMode, *pn.Spec.ConfigRef, b)
}

func (a *agents) act(node, key string, mode v1alpha1.ProxyMode, ref v1alpha1.ConfigReference, b behavior) {
	a.patchStatus(node, func(st *v1alpha1.ProxyNodeStatus) { st.Phase = v1alpha1.NodeProgramming })
	if b.hang {
		return
	}
	d := b.delay
	if b.jitter > 0 {
		d += time.Duration(rand.Int64N(int64(b.jitter)))
	}
	select {
	case <-time.After(d):
	case <-a.ctx.Done():
		return
	}
	a.mu.Lock()
	current := a.acting[node] == key
	a.mu.Unlock()
	if !current {
		return // a newer spec superseded this one
	}
	a.patchStatus(node, func(st *v1alpha1.ProxyNodeStatus) {
		st.ObservedConfig = ref.DeepCopy()
		if msg, fail := b.failOn[mode]; fail {
			st.Phase = v1alpha1.NodeFailed
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "VerifyFailed", Message: msg})
			return
		}
		st.Phase = v1alpha1.NodeActive
		st.ActiveMode = mode
		if mode != v1alpha1.ModeKubeProxy {
			st.KubeProxyMode = "" // taking over removes kube-proxy's rules
		}
		st.LastSyncTime = ptr.To(metav1.Now())
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Synced"})
	})
}

func (a *agents) patchStatus(node string, f func(*v1alpha1.ProxyNodeStatus)) {
	for i := 0; i < 50; i++ {
		pn := &v1alpha1.ProxyNode{}
		if err := a.c.Get(a.ctx, types.NamespacedName{Name: node}, pn); err != nil {
			return
		}
		f(&pn.Status)
		err := a.c.Status().Update(a.ctx, pn)
		if err == nil {
			a.mu.Lock()
			a.writes++
			a.mu.Unlock()
			return
		}
		if !apierrors.IsConflict(err) {
			if a.ctx.Err() == nil {
				a.t.Logf("agent %s: %v", node, err)
			}
			return
		}
	}
}

// ---- the watch recorder ----

// watchProxyNodes calls f for every ProxyNode change, in order, from a
// list followed by a watch, re-established from the last seen version if
// the server ends it.
func watchProxyNodes(ctx context.Context, c client.WithWatch, f func(watch.EventType, *v1alpha1.ProxyNode), started chan<- struct{}) {
	rv := ""
	for ctx.Err() == nil {
		if rv == "" {
			var l v1alpha1.ProxyNodeList
			if err := c.List(ctx, &l); err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for i := range l.Items {
				f(watch.Added, &l.Items[i])
			}
			rv = l.ResourceVersion
			if started != nil {
				close(started)
				started = nil
			}
		}
		wi, err := c.Watch(ctx, &v1alpha1.ProxyNodeList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Error {
				rv = "" // expired: list again
				break
			}
			pn, ok := ev.Object.(*v1alpha1.ProxyNode)
			if !ok {
				continue
			}
			rv = pn.ResourceVersion
			if ev.Type == watch.Bookmark {
				continue
			}
			f(ev.Type, pn)
		}
		wi.Stop()
	}
}

// recorder keeps the latest state of every ProxyNode from one watch, and
// after every change counts, per group of nodes, how many are in
// transition: spec.desiredMode set and not reflected by status (active
// mode, phase Active, same config generation, Ready not False).
type recorder struct {
	mu       sync.Mutex
	state    map[string]*v1alpha1.ProxyNode
	groups   map[string]*group
	changes  int
	specLog  []string // "node=mode" for each change of spec.desiredMode
	lastSpec map[string]string
}

type group struct {
	nodes map[string]bool
	limit int
	max   int
	bad   []string
}

func startRecorder(t testing.TB, ctx context.Context, c client.WithWatch) *recorder {
	r := &recorder{state: map[string]*v1alpha1.ProxyNode{}, groups: map[string]*group{}, lastSpec: map[string]string{}}
	started := make(chan struct{})
	go watchProxyNodes(ctx, c, r.observe, started)
	<-started
	return r
}

// track makes the recorder check, from now on, that at most limit of
// these nodes are in transition at once.
func (r *recorder) track(name string, nodes []string, limit int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := &group{nodes: map[string]bool{}, limit: limit}
	for _, n := range nodes {
		g.nodes[n] = true
	}
	r.groups[name] = g
	r.recount()
}

func (r *recorder) addToGroup(name, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups[name].nodes[node] = true
}

func (r *recorder) removeFromGroup(name, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.groups[name].nodes, node)
}

func inTransition(pn *v1alpha1.ProxyNode) bool {
	s, st := pn.Spec, pn.Status
	if s.DesiredMode == "" {
		return false
	}
	ok := st.ActiveMode == s.DesiredMode && st.Phase == v1alpha1.NodeActive &&
		s.ConfigRef != nil && st.ObservedConfig != nil && *s.ConfigRef == *st.ObservedConfig
	if c := meta.FindStatusCondition(st.Conditions, "Ready"); c != nil && c.Status == metav1.ConditionFalse {
		ok = false
	}
	return !ok
}

func (r *recorder) observe(typ watch.EventType, pn *v1alpha1.ProxyNode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes++
	if typ == watch.Deleted {
		delete(r.state, pn.Name)
	} else {
		r.state[pn.Name] = pn.DeepCopy()
		if m := string(pn.Spec.DesiredMode); m != r.lastSpec[pn.Name] {
			r.lastSpec[pn.Name] = m
			r.specLog = append(r.specLog, pn.Name+"="+m)
		}
	}
	r.recount()
}

func (r *recorder) recount() {
	for name, g := range r.groups {
		n := 0
		var moving []string
		for node := range g.nodes {
			if pn := r.state[node]; pn != nil && inTransition(pn) {
				n++
				moving = append(moving, node)
			}
		}
		if n > g.max {
			g.max = n
		}
		if n > g.limit {
			sort.Strings(moving)
			g.bad = append(g.bad, fmt.Sprintf("%s: %d nodes in transition (limit %d): %v", name, n, g.limit, moving))
		}
	}
}

// check fails the test if any group ever had more nodes in transition
// than its limit, and returns the most seen per group.
func (r *recorder) check(t testing.TB) map[string]int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for name, g := range r.groups {
		out[name] = g.max
		for _, b := range g.bad {
			t.Errorf("maxUnavailable exceeded: %s", b)
		}
	}
	return out
}

func (r *recorder) specChanges() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.specLog...)
}

func (r *recorder) desired(node string) v1alpha1.ProxyMode {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pn := r.state[node]; pn != nil {
		return pn.Spec.DesiredMode
	}
	return ""
}

func (r *recorder) countWhere(f func(*v1alpha1.ProxyNode) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, pn := range r.state {
		if f(pn) {
			n++
		}
	}
	return n
}

func (w *world) labelNode(name, key, value string) {
	w.t.Helper()
	n := &corev1.Node{}
	if err := w.c.Get(w.ctx, types.NamespacedName{Name: name}, n); err != nil {
		w.t.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[key] = value
	if err := w.c.Update(w.ctx, n); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) deleteNode(name string) {
	w.t.Helper()
	if err := w.c.Delete(w.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		w.t.Fatal(err)
	}
}
