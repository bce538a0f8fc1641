package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
	"github.com/proxyshift/proxyshift/nodeagent/syncloop"
)

// agentState turns the ProxyNode (or, standalone, the flags) into what
// the switcher and the sync loop run with.
type agentState struct {
	opts       Options
	ns         nsexec.NS
	nodeLister corelisters.NodeLister
	pnStore    cache.Store
	tracker    *model.Tracker
	sw         *switcher.Switcher
	loops      *loopRunner
	// kick receives when the Node or the ProxyNode changed.
	kick chan struct{}

	// held and heldGen: the previous agent reported the switch of this
	// generation failed.
	held                    bool
	heldGen                 int64
	heldReason, heldMessage string
	// heldMode and heldSettings are the mode that served when the
	// previous agent reported the failure and the settings it ran with
	// (status.activeMode, status.activeSettings; nil unknown): while the
	// failure is held, backends are built from them, not from the spec
	// whose change failed.
	heldMode     v1alpha1.ProxyMode
	heldSettings *v1alpha1.ProxySettings
	resume       bool
	// served is what the previous agent reported serving, kept when the
	// spec changed while no agent ran: the first desire is that, so the
	// rules the kernel holds keep serving as they are, and the spec's
	// change then goes through the switcher (verified, and rolled back
	// if it fails) as it does while an agent runs. The first resolve
	// consumes it; the caller then resolves the spec (kickAfterStart).
	served *servedSpec
	// switchedFrom is the mode a switch interrupted by the previous
	// agent's end was switching from, with the settings it served with
	// (status activeMode and activeSettings in a switching phase), for
	// the spec of resumeGen: the resumed switch rebuilds that mode as it
	// served, not with the spec's reading of the settings, so the rules it
	// keeps serving (and a rollback restores) do not change unverified.
	switchedFrom *servedSpec
	resumeGen    int64

	mu  sync.Mutex
	cur *effective
}

// servedSpec is what a previous agent reported serving: status
// activeMode and activeSettings, and the spec they came from.
type servedSpec struct {
	mode       v1alpha1.ProxyMode
	settings   *v1alpha1.ProxySettings
	config     *v1alpha1.ConfigReference
	generation int64
}

// effective is the resolved desire: the mode and the settings the
// backends and the loop run with.
type effective struct {
	desire   switcher.Desire
	cfg      dataplane.NodeConfig
	settings v1alpha1.ProxySettings
	sync     syncloop.Config
	// from builds the mode a resumed switch switches from (see
	// switchedFrom); nil otherwise.
	from *builtMode
}

// builtMode is how one mode's backend is built: its node configuration,
// its settings and their key.
type builtMode struct {
	mode     v1alpha1.ProxyMode
	cfg      dataplane.NodeConfig
	settings v1alpha1.ProxySettings
	key      string
}

func (a *agentState) current() *effective {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur
}

// proxyNode is this node's ProxyNode from the informer (nil if none).
func (a *agentState) proxyNode() *v1alpha1.ProxyNode {
	if a.pnStore == nil {
		return nil
	}
	o, ok, err := a.pnStore.GetByKey(a.opts.NodeName)
	if err != nil || !ok {
		return nil
	}
	pn, _ := o.(*v1alpha1.ProxyNode)
	return pn
}

// node is the agent's Node from the informer (nil if unknown).
func (a *agentState) node() *corev1.Node {
	n, err := a.nodeLister.Get(a.opts.NodeName)
	if err != nil {
		return nil
	}
	return n
}

// readPrevious reads what the previous agent reported in pn's status (nil:
// nothing). A switch that failed for pn's current generation is not
// retried until the spec changes, and the mode that served keeps the
// settings it ran with meanwhile; one that was interrupted is finished.
func (a *agentState) readPrevious(pn *v1alpha1.ProxyNode) {
	if pn == nil {
		return
	}
	st := pn.Status
	if c := meta.FindStatusCondition(st.Conditions, contract.ConditionDegraded); st.Phase == v1alpha1.NodeFailed && c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == pn.Generation {
		a.heldGen, a.held = pn.Generation, true
		a.heldReason, a.heldMessage = c.Reason, c.Message
		a.heldMode, a.heldSettings = st.ActiveMode, st.ActiveSettings.DeepCopy()
	}
	a.resume = switcher.Switching(st.Phase)
	// A mode of proxyshift's served, with settings the status names.
	servedOurs := st.ActiveSettings != nil && st.ActiveMode != "" && st.ActiveMode != v1alpha1.ModeKubeProxy
	if a.resume && servedOurs {
		a.switchedFrom, a.resumeGen = &servedSpec{mode: st.ActiveMode, settings: st.ActiveSettings.DeepCopy()}, pn.Generation
	}
	if !a.held && st.Phase == v1alpha1.NodeActive && servedOurs &&
		(pn.Spec.DesiredMode != st.ActiveMode || !apiequality.Semantic.DeepEqual(pn.Spec.Settings, st.ActiveSettings)) {
		var gen int64
		if c := meta.FindStatusCondition(st.Conditions, contract.ConditionReady); c != nil {
			gen = c.ObservedGeneration
		}
		a.served = &servedSpec{mode: st.ActiveMode, settings: st.ActiveSettings.DeepCopy(), config: st.ObservedConfig.DeepCopy(), generation: gen}
	}
}

// kickAfterStart makes the agent resolve its spec once it runs: the first
// desire may have been what the previous agent served (see served).
func (a *agentState) kickAfterStart() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// resolve computes the effective desire from the ProxyNode, falling back
// to the flags for everything it does not set.
func (a *agentState) resolve() error {
	o := a.opts
	mode := o.Mode
	// Following a ProxyNode, --mode is only for a node nothing serves.
	byFlag := a.pnStore != nil && mode != ""
	var settings v1alpha1.ProxySettings
	var gen int64
	var ref *v1alpha1.ConfigReference
	stopped := false
	if pn := a.proxyNode(); pn != nil {
		gen, ref = pn.Generation, pn.Spec.ConfigRef.DeepCopy()
		stopped = pn.Spec.KubeProxyStopped
		if pn.Spec.DesiredMode != "" {
			mode, byFlag = pn.Spec.DesiredMode, false
			settings = *pn.Spec.Settings.DeepCopy()
		}
	}
	if sv := a.served; sv != nil {
		mode, byFlag, settings, gen, ref = sv.mode, false, *sv.settings.DeepCopy(), sv.generation, sv.config.DeepCopy()
	}
	held := a.held && gen == a.heldGen
	// What the backends are built with, and the mode it is read for.
	built, builtFor := settings, mode
	if held && a.heldSettings != nil {
		// The change to this spec failed and was rolled back: the mode
		// that serves keeps the settings it ran with, also across a
		// restart, until the spec changes.
		built, builtFor = *a.heldSettings.DeepCopy(), a.heldMode
	}
	s, err := contract.Interpret(builtFor, &built)
	if err != nil {
		return err
	}
	node, err := a.nodeLister.Get(o.NodeName)
	if apierrors.IsNotFound(err) {
		node = nil
	} else if err != nil {
		return err
	}
	local, err := localAddrs(o.NetNS)
	if err != nil {
		return fmt.Errorf("list the node's addresses: %w", err)
	}
	cfg, key, err := a.configure(s, node, local)
	a.tracker.SetNodeAddrs(OwnAddrs(node, cfg.NodeIPs))
	a.tracker.SetNodeZone(nodeZone(node))
	if err != nil {
		return err
	}
	sc := syncloop.Config{MinSyncPeriod: o.MinSyncPeriod, SyncPeriod: o.SyncPeriod}
	if s.MinSyncPeriod != nil {
		sc.MinSyncPeriod = *s.MinSyncPeriod
	}
	if s.SyncPeriod != nil {
		sc.SyncPeriod = *s.SyncPeriod
	}
	d := switcher.Desire{
		Mode: mode, Key: key, Settings: built.DeepCopy(), Scheduler: s.Scheduler, Config: ref, Generation: gen,
		Held: held, Resume: a.resume,
		KubeProxyStopped: stopped, Default: byFlag,
	}
	from := a.interruptedFrom(mode, gen, node, local)
	if from != nil {
		d.FromKey, d.FromSettings = from.key, from.settings.DeepCopy()
	}
	if d.Held {
		d.HeldReason, d.HeldMessage = a.heldReason, a.heldMessage
	}
	a.mu.Lock()
	a.cur = &effective{desire: d, cfg: cfg, settings: built, sync: sc, from: from}
	a.mu.Unlock()
	if a.served != nil {
		klog.InfoS("The spec changed while no agent ran: serving what the previous agent served first, then the spec through a switch", "served", a.served.mode)
		a.served = nil
	}
	return nil
}

// interruptedFrom is how to build the mode the previous agent's
// interrupted switch was switching from, as it served (switchedFrom),
// while the desire is that switch's (mode, for the spec of generation
// gen); nil otherwise, and when those settings do not resolve (then the
// mode is built as the desired one's settings read for it).
func (a *agentState) interruptedFrom(mode v1alpha1.ProxyMode, gen int64, node *corev1.Node, local []netip.Addr) *builtMode {
	f := a.switchedFrom
	if f == nil || a.resumeGen != gen || f.mode == mode {
		return nil
	}
	settings := *f.settings.DeepCopy()
	s, err := contract.Interpret(f.mode, &settings)
	var cfg dataplane.NodeConfig
	var key string
	if err == nil {
		cfg, key, err = a.configure(s, node, local)
	}
	if err != nil {
		klog.ErrorS(err, "The settings the interrupted switch's old mode served with do not resolve; building it with the desired settings", "mode", f.mode)
		return nil
	}
	return &builtMode{mode: f.mode, cfg: cfg, settings: settings, key: key}
}

// configure is the backends' node configuration for settings s (as the
// contract reads them for a mode) on this node (node may be nil; local
// are its addresses), and the key that tells such configurations apart.
// Its NodeIPs, the NodePort addresses, are set even when err says they do
// not resolve.
func (a *agentState) configure(s contract.Settings, node *corev1.Node, local []netip.Addr) (dataplane.NodeConfig, string, error) {
	o := a.opts
	cidrs := o.ClusterCIDRs
	if len(s.ClusterCIDRs) > 0 {
		cidrs = s.ClusterCIDRs
	}
	npa := o.NodePortAddresses
	if len(s.NodePortAddresses) > 0 {
		npa = s.NodePortAddresses
	}
	nodeIPs, err := NodePortIPs(npa, node, local)
	cfg := dataplane.NodeConfig{NodeName: o.NodeName, NodeIPs: nodeIPs, PrimaryIPs: PrimaryIPs(node), ClusterCIDRs: cidrs, MasqueradeAll: o.MasqueradeAll, MasqueradeBit: o.MasqueradeBit}
	if err != nil {
		return cfg, "", err
	}
	if s.MasqueradeAll != nil {
		cfg.MasqueradeAll = *s.MasqueradeAll
	}
	if s.MasqueradeBit != nil {
		cfg.MasqueradeBit = *s.MasqueradeBit
	}
	key, _ := json.Marshal(struct {
		Cfg  dataplane.NodeConfig
		Mode any
	}{cfg, s.Section})
	return cfg, string(key), nil
}

// handler kicks the agent to follow a change of its Node or ProxyNode.
func (a *agentState) handler() cache.ResourceEventHandler {
	kick := func() {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(_, _ any) { kick() },
		DeleteFunc: func(any) { kick() },
	}
}

// resolveFirst resolves the desire the agent starts with, waiting for a
// Node or ProxyNode change (or retrying every 10 seconds) while it does
// not resolve: the kernel keeps its rules meanwhile, and the agent says
// why it waits (Degraded, /healthz). It returns false when ctx ends first.
func (a *agentState) resolveFirst(ctx context.Context, r *report.Reporter, h *health) bool {
	for {
		err := a.resolve()
		if err == nil {
			r.SetProblem("", "")
			return true
		}
		klog.ErrorS(err, "Cannot resolve this node's settings; the rules the kernel holds keep serving until they resolve")
		r.SetProblem(contract.ReasonSettingsUnresolved, err.Error()+"; the rules the kernel holds keep serving until they resolve")
		h.wait("settings that resolve on this node (" + err.Error() + ")")
		select {
		case <-ctx.Done():
			return false
		case <-a.kick:
		case <-time.After(10 * time.Second):
		}
	}
}

// follow applies every Node and ProxyNode change until ctx ends. A spec
// that does not resolve keeps the current one, is reported Degraded and
// retried every 10 seconds until it resolves or changes.
func (a *agentState) follow(ctx context.Context, r *report.Reporter) {
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-retry:
		}
		retry = nil
		if err := a.onChange(ctx); err != nil {
			klog.ErrorS(err, "Cannot follow the ProxyNode's spec; keeping the current one")
			r.SetProblem(contract.ReasonSettingsUnresolved, err.Error()+"; the agent keeps running with the settings it had")
			retry = time.After(10 * time.Second)
			continue
		}
		r.SetProblem("", "")
	}
}

// onChange follows a Node or ProxyNode change.
func (a *agentState) onChange(ctx context.Context) error {
	prev := a.current()
	if err := a.resolve(); err != nil {
		return err
	}
	cur := a.current()
	if cur.sync != prev.sync && a.loops != nil {
		a.loops.restart(ctx, cur.sync)
	}
	if a.sw != nil {
		a.sw.SetDesire(cur.desire)
	}
	return nil
}

// backend builds mode's backend with the current settings.
func (a *agentState) backend(mode v1alpha1.ProxyMode) (dataplane.Backend, string, error) {
	cur := a.current()
	f, ok := a.opts.Backends[mode]
	if !ok {
		return nil, "", fmt.Errorf("mode %q is not supported by this agent (supported: %v)", mode, a.opts.modes())
	}
	cfg, settings, key := cur.cfg, cur.settings, cur.desire.Key
	if from := cur.from; from != nil && mode == from.mode {
		cfg, settings, key = from.cfg, from.settings, from.key
	}
	b, err := f(cfg, *settings.DeepCopy())
	return b, key, err
}

// probeIPs are the node addresses NodePorts are probed on: the NodePort
// addresses, or every non-loopback address of the node.
func (a *agentState) probeIPs() []netip.Addr {
	if ips := a.current().cfg.NodeIPs; len(ips) > 0 {
		return ips
	}
	local, err := localAddrs(a.opts.NetNS)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, ip := range local {
		if !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			out = append(out, ip)
		}
	}
	return out
}

// loopRunner runs the sync loop and restarts it when its pacing changes.
type loopRunner struct {
	source  syncloop.Source
	backend dataplane.Backend
	metrics *syncloop.Metrics

	mu     sync.Mutex
	loop   *syncloop.Loop
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *loopRunner) start(ctx context.Context, cfg syncloop.Config) {
	lctx, cancel := context.WithCancel(ctx)
	l := syncloop.New(cfg, r.source, r.backend, r.metrics)
	done := make(chan struct{})
	go func() { l.Run(lctx); close(done) }()
	r.mu.Lock()
	r.loop, r.cancel, r.done = l, cancel, done
	r.mu.Unlock()
}

func (r *loopRunner) stop() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// restart stops the loop and starts one with cfg; the new loop's first
// sync is a full one, so no change is lost.
func (r *loopRunner) restart(ctx context.Context, cfg syncloop.Config) {
	r.stop()
	klog.InfoS("Sync pacing changed; restarting the sync loop", "minSyncPeriod", cfg.MinSyncPeriod, "syncPeriod", cfg.SyncPeriod)
	r.start(ctx, cfg)
}

func (r *loopRunner) healthy(timeout time.Duration) error {
	r.mu.Lock()
	l := r.loop
	r.mu.Unlock()
	return l.Healthy(timeout)
}

// nodeZone is the node's topology.kubernetes.io/zone label, which decides
// the endpoints topology hints send its traffic to; "" for no label or no
// Node (kube-proxy reads the same label).
func nodeZone(node *corev1.Node) string {
	if node == nil {
		return ""
	}
	return node.Labels[corev1.LabelTopologyZone]
}
