// Package agent wires one node's service proxy together: informers for
// Services, EndpointSlices and the agent's own Node feed the model tracker,
// the sync loop programs the model into the chosen dataplane, and HTTP
// endpoints expose health and metrics. It holds no proxy logic of its own.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/nodeagent/cleanup"
	"github.com/proxyshift/proxyshift/nodeagent/conntrack"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/ipvs"
	"github.com/proxyshift/proxyshift/nodeagent/events"
	"github.com/proxyshift/proxyshift/nodeagent/facts"
	"github.com/proxyshift/proxyshift/nodeagent/healthcheck"
	"github.com/proxyshift/proxyshift/nodeagent/kmod"
	"github.com/proxyshift/proxyshift/nodeagent/kubeproxy"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/nodeagent/probe"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
	"github.com/proxyshift/proxyshift/nodeagent/syncloop"
)

// Options configure one agent.
type Options struct {
	// NodeName is the node this agent proxies for.
	NodeName string
	// Mode is the dataplane to run when no ProxyNode says otherwise (a
	// standalone agent, or a ProxyNode without spec.desiredMode).
	Mode v1alpha1.ProxyMode
	// Backends maps each supported mode to its constructor
	// (backends.Factories).
	Backends map[v1alpha1.ProxyMode]backends.Factory
	// ClusterCIDRs are the pod networks (for masquerading decisions);
	// ProxyNode spec.settings.clusterCIDRs overrides them.
	ClusterCIDRs []netip.Prefix
	// NodePortAddresses are CIDRs or "primary"; empty means every address.
	// ProxyNode spec.settings.nodePortAddresses overrides them.
	NodePortAddresses []string
	// MasqueradeAll and MasqueradeBit tune SNAT marking; in iptables mode
	// ProxyNode spec.settings.iptables overrides them.
	MasqueradeAll bool
	MasqueradeBit int
	// MinSyncPeriod and SyncPeriod pace the sync loop; the mode's section
	// of ProxyNode spec.settings overrides them.
	MinSyncPeriod, SyncPeriod time.Duration
	// MetricsAddr and HealthzAddr are listen addresses; empty disables.
	MetricsAddr, HealthzAddr string
	// Profiling serves Go's runtime profiles (net/http/pprof) and its
	// execution trace under /debug/pprof/ on MetricsAddr: where the
	// memory and the time go, and what waited for what.
	Profiling bool
	// KubeProxyHealthzAddr is kube-proxy's healthzBindAddress
	// (0.0.0.0:10256): while proxyshift serves the node, /healthz and
	// /livez answer there as kube-proxy's do, in the node's namespace.
	// Empty serves them nowhere (the Services' health-check node ports
	// are served either way).
	KubeProxyHealthzAddr string
	// NetNS is the network namespace of the node: its addresses are the
	// node's, and facts, probes, conntrack and cleanup work there (the
	// backends get it from Backends). The zero value is the agent's own.
	NetNS nsexec.NS

	// RESTConfig, when set, makes the agent follow its ProxyNode (named
	// NodeName): spec.desiredMode and spec.settings, and write its status.
	// Nil runs standalone on Mode.
	RESTConfig *rest.Config
	// Kernel is where kernel modules are probed and loaded from (zero:
	// the running kernel's /proc/modules, /lib/modules, /sys/module).
	Kernel kmod.Kernel
	// KubeProxyMetricsURL is kube-proxy's metrics endpoint on the node
	// (kubeproxy.DefaultMetricsURL); handing the node back, the agent
	// keeps serving until it says kube-proxy synced. Empty trusts
	// kube-proxy's rules being in the kernel alone.
	KubeProxyMetricsURL string
	// SyncGrace is how long the informers' first list may take before
	// the agent reports itself Degraded (default 15s); it waits for them
	// however long it takes.
	SyncGrace time.Duration
	// FactsInterval is how often kernel facts are gathered again
	// (default 1m).
	FactsInterval time.Duration
	// StatusSyncInterval bounds how often status is written when only
	// the last sync's time changed (default 1m).
	StatusSyncInterval time.Duration
	// TestStopAtPhase makes the agent hang once a switch finished this
	// phase's work (for tests that kill it there). TestFailVerify makes
	// every Verifying fail. TestFailHandBackInto makes handing the node
	// back to kube-proxy in that mode fail.
	TestStopAtPhase      v1alpha1.NodePhase
	TestFailVerify       bool
	TestFailHandBackInto v1alpha1.ProxyMode
}

// Run starts the agent and blocks until ctx ends or startup fails. It never
// removes programmed rules on its way out: the kernel keeps serving. Only a
// wrong configuration (no node name, an unsupported mode) or a kernel it
// cannot read makes it return early; the API server being away, or the
// spec's settings not resolving on this node yet, make it wait (see
// startup.go).
func Run(ctx context.Context, client kubernetes.Interface, opts Options) error {
	if opts.NodeName == "" {
		return errors.New("the node name is not set: pass --node-name or set NODE_NAME")
	}
	if !slices.Contains(opts.modes(), opts.Mode) && opts.Mode != "" {
		return fmt.Errorf("mode %q is not supported by this agent (supported: %v)", opts.Mode, opts.modes())
	}
	ns := opts.NetNS

	// Health and metrics first: /livez answers while the rest starts.
	healthTimeout := 2 * opts.SyncPeriod
	if healthTimeout < time.Minute {
		healthTimeout = time.Minute
	}
	hs := &health{timeout: healthTimeout}
	hs.wait("informers starting")
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if opts.HealthzAddr != "" {
		go serve(ctx, &http.Server{Addr: opts.HealthzAddr, Handler: hs.mux(), ReadHeaderTimeout: 5 * time.Second})
	}
	if opts.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		if opts.Profiling {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		go serve(ctx, &http.Server{Addr: opts.MetricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second})
	}

	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trimObject))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", opts.NodeName).String()
	}))
	refusals := newRefusalReporter(ctx, client, factory.Core().V1().Services().Lister(), opts.NodeName)
	tracker := model.NewTracker(opts.NodeName, refusals.report)
	// The first lists are built once, at the first sync's Snapshot.
	tracker.DeferUntilSnapshot()
	metrics := syncloop.NewMetrics(reg)
	tracker.Observe(metrics)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "proxyshift_refused_external_addresses",
		Help: "External addresses (externalIPs, load-balancer IPs) of Services not routed because another Service's cluster IP, the node, or an earlier Service owns them.",
	}, func() float64 { return float64(tracker.Refused()) }))
	trackerSynced, err := wireTracker(factory, tracker)
	if err != nil {
		return err
	}
	a := &agentState{opts: opts, ns: ns, tracker: tracker, kick: make(chan struct{}, 1)}
	nodeInformer := nodeFactory.Core().V1().Nodes()
	a.nodeLister = nodeInformer.Lister()
	if _, err := nodeInformer.Informer().AddEventHandler(a.handler()); err != nil {
		return err
	}

	var pnClient *report.Client
	var pnInformer cache.SharedIndexInformer
	if opts.RESTConfig != nil {
		if pnClient, err = report.NewClient(opts.RESTConfig); err != nil {
			return err
		}
		pnInformer = cache.NewSharedIndexInformer(pnClient.ListWatch(opts.NodeName), &v1alpha1.ProxyNode{}, 0, cache.Indexers{})
		a.pnStore = pnInformer.GetStore()
		if _, err := pnInformer.AddEventHandler(a.handler()); err != nil {
			return err
		}
	}
	reporter := report.New(pnClient, opts.NodeName)
	if opts.StatusSyncInterval > 0 {
		reporter.SyncEvery = opts.StatusSyncInterval
	}
	if pnInformer != nil {
		// A ProxyNode deleted and recreated gets the whole status at once.
		if _, err := pnInformer.AddEventHandler(reporter.Follow()); err != nil {
			return err
		}
	}
	go reporter.Run(ctx)

	factory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())
	// The tracker's registrations, not the informers: an informer has
	// synced once its cache holds the first list, its handlers (the
	// tracker) once they received all of it, so the first sync programs
	// every Service, not the part of them delivered so far.
	waitFor := []informer{
		{"Services", trackerSynced[0]},
		{"EndpointSlices", trackerSynced[1]},
		{"its Node", nodeInformer.Informer().HasSynced},
	}
	if pnInformer != nil {
		go pnInformer.Run(ctx.Done())
		waitFor = append(waitFor, informer{"its ProxyNode", pnInformer.HasSynced})
	}
	grace := opts.SyncGrace
	if grace <= 0 {
		grace = 15 * time.Second
	}
	if !waitSynced(ctx, reporter, hs, grace, waitFor...) {
		return nil
	}

	startPN := a.proxyNode()
	reporter.Seed(startPN)
	a.readPrevious(startPN)
	if !a.resolveFirst(ctx, reporter, hs) {
		return nil
	}

	fanout := switcher.NewFanout()
	gatherer := &facts.Gatherer{Kernel: &opts.Kernel, NS: ns, Settings: fanout}
	rec := &conntrack.Reconciler{NS: ns, NodeIPs: func() []netip.Addr { return a.current().cfg.NodeIPs }}
	checks := &healthcheck.Server{NS: ns, ProxyAddr: opts.KubeProxyHealthzAddr, Health: hs.healthy, Node: a.node, OnBindFailure: refusals.healthCheckNotBound}
	go checks.Run(ctx)
	fanout.SetAfterSync(func(ctx context.Context, snap *model.Snapshot, changed model.ChangeSet, full bool) {
		checks.Update(healthcheck.Checks(snap), a.current().cfg.NodeIPs)
		n, err := rec.Reconcile(ctx, snap, changed, full)
		if err != nil {
			klog.ErrorS(err, "Could not delete stale conntrack entries", "deleted", n)
		} else if n > 0 {
			klog.V(2).InfoS("Deleted stale conntrack entries", "count", n)
		}
	})
	phases := newPhaseReporter(&servingReporter{
		Reporter: reporter, checks: checks, programmed: fanout.Model,
		kubeProxyStopped: func() bool { return a.current().desire.KubeProxyStopped },
		nodeIPs:          func() []netip.Addr { return a.current().cfg.NodeIPs },
	})
	var told switcher.Events
	if pnClient != nil {
		// Events about the ProxyNode the agent follows (none standalone).
		told = events.New(ctx, client, opts.NodeName, func() types.UID {
			if pn := a.proxyNode(); pn != nil {
				return pn.UID
			}
			return ""
		})
	}
	sw := switcher.New(switcher.Config{
		Fanout:           fanout,
		Backend:          a.backend,
		Modes:            opts.modes(),
		Prepare:          gatherer,
		Prober:           &probe.Prober{NS: ns, Attempts: 2},
		NodeIPs:          a.probeIPs,
		KubeProxy:        &kubeproxy.Node{NS: ns, MetricsURL: opts.KubeProxyMetricsURL},
		Report:           phases,
		Events:           told,
		StopAt:           opts.TestStopAtPhase,
		FailVerify:       opts.TestFailVerify,
		FailHandBackInto: opts.TestFailHandBackInto,
	}, a.current().desire)
	a.sw = sw
	st, step, err := sw.Init(ctx)
	if err != nil {
		return fmt.Errorf("read what the kernel holds: %w", err)
	}

	reg.MustRegister(phases.phase)
	regather := newServingWatch()
	fanout.SetOnPrimary(func(p switcher.PrimarySync) {
		reporter.SetSync(report.Sync{Time: p.Time, Duration: p.Duration, Counts: p.Counts, Err: p.Err, Warning: p.Warning})
		metrics.RecordSync(p.Full, p.Duration, p.Counts, p.Err)
		regather.synced(p)
	})
	loops := &loopRunner{source: tracker, backend: fanout, metrics: metrics}
	loops.start(ctx, a.current().sync)
	defer loops.stop()
	a.loops = loops
	hs.started(loops)

	go a.follow(ctx, reporter)
	a.kickAfterStart()
	go gatherFacts(ctx, gatherer, reporter, opts.FactsInterval, regather.kick)

	klog.InfoS("proxyshift-agent running", "node", opts.NodeName, "desired", a.current().desire.Mode, "nodePortIPs", a.current().cfg.NodeIPs, "followsProxyNode", pnInformer != nil)
	return sw.Run(ctx, st, step)
}

// gatherFacts reports the kernel facts now, every interval and whenever
// kick receives; the reporter writes them only when they changed.
func gatherFacts(ctx context.Context, g *facts.Gatherer, r *report.Reporter, interval time.Duration, kick <-chan struct{}) {
	if interval <= 0 {
		interval = time.Minute
	}
	for {
		r.SetKernel(g.Gather(ctx))
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		case <-kick:
		}
	}
}

// servingWatch asks for the kernel facts to be gathered again when the
// serving mode's first successful sync is done, so the settings that sync
// set are reported at once, not an interval later.
type servingWatch struct {
	kick chan struct{}
	// mode is the serving mode of the last successful sync (only touched
	// by synced, under the Fanout's lock).
	mode v1alpha1.ProxyMode
}

func newServingWatch() *servingWatch { return &servingWatch{kick: make(chan struct{}, 1)} }

// synced takes one sync of the serving backend; it never blocks.
func (w *servingWatch) synced(p switcher.PrimarySync) {
	if p.Err != nil || p.Mode == w.mode {
		return
	}
	w.mode = p.Mode
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// wireTracker feeds Service and EndpointSlice events into the tracker. It
// returns whether the tracker has received the first list of Services and
// of EndpointSlices.
func wireTracker(factory informers.SharedInformerFactory, t *model.Tracker) ([2]cache.InformerSynced, error) {
	var synced [2]cache.InformerSynced
	svcReg, err := factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { t.OnServiceAdd(o.(*corev1.Service)) },
		UpdateFunc: func(_, o any) { t.OnServiceUpdate(o.(*corev1.Service)) },
		DeleteFunc: func(o any) {
			if svc, ok := unwrapDeleted(o).(*corev1.Service); ok {
				t.OnServiceDelete(svc)
			}
		},
	})
	if err != nil {
		return synced, err
	}
	sliceReg, err := factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { t.OnEndpointSliceAdd(o.(*model.Slice)) },
		UpdateFunc: func(_, o any) { t.OnEndpointSliceUpdate(o.(*model.Slice)) },
		DeleteFunc: func(o any) {
			if s, ok := unwrapDeleted(o).(*model.Slice); ok {
				t.OnEndpointSliceDelete(s)
			}
		},
	})
	if err != nil {
		return synced, err
	}
	return [2]cache.InformerSynced{svcReg.HasSynced, sliceReg.HasSynced}, nil
}

func unwrapDeleted(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

// serviceAddressInterfaces are the dummy interfaces IPVS modes bind
// service addresses to: proxyshift's own and kube-proxy's (still there
// while the agent takes a node over from kube-proxy's IPVS mode). Their
// addresses are cluster IPs and the like, local to the kernel but not
// the node's: counted as node addresses, a nodePortAddresses CIDR that
// covers the service range would give NodePorts every cluster IP.
var serviceAddressInterfaces = []string{ipvs.DummyInterface, cleanup.KubeProxyIPVSLink}

// localAddrs lists the addresses of the node's namespace, leaving out
// those of the serviceAddressInterfaces (as kube-proxy leaves out
// kube-ipvs0's).
func localAddrs(ns nsexec.NS) ([]netip.Addr, error) {
	h := &netlink.Handle{}
	if nh, ok := ns.Handle(); ok {
		var err error
		if h, err = netlink.NewHandleAt(nh, unix.NETLINK_ROUTE); err != nil {
			return nil, err
		}
		defer h.Close()
	}
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	skip := map[int]bool{}
	for _, l := range links {
		if slices.Contains(serviceAddressInterfaces, l.Attrs().Name) {
			skip[l.Attrs().Index] = true
		}
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if skip[a.LinkIndex] {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// modes lists the modes the agent has a backend for.
func (o *Options) modes() []v1alpha1.ProxyMode {
	var modes []v1alpha1.ProxyMode
	for _, m := range contract.Modes {
		if _, ok := o.Backends[m]; ok {
			modes = append(modes, m)
		}
	}
	return modes
}
