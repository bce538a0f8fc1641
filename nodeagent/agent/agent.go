// Package agent wires one node's service proxy together: informers for
// Services, EndpointSlices and the agent's own Node feed the model tracker,
// the sync loop programs the model into the chosen dataplane, and HTTP
// endpoints expose health and metrics. It holds no proxy logic of its own.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/syncloop"
)

// BackendFactory builds a dataplane for the node's settings.
type BackendFactory func(cfg dataplane.NodeConfig) (dataplane.Backend, error)

// Options configure one agent.
type Options struct {
	// NodeName is the node this agent proxies for.
	NodeName string
	// Mode is the dataplane to run.
	Mode v1alpha1.ProxyMode
	// Backends maps each supported mode to its constructor.
	Backends map[v1alpha1.ProxyMode]BackendFactory
	// ClusterCIDRs are the pod networks (for masquerading decisions).
	ClusterCIDRs []netip.Prefix
	// NodePortAddresses are CIDRs or "primary"; empty means every address.
	NodePortAddresses []string
	// MasqueradeAll and MasqueradeBit tune SNAT marking.
	MasqueradeAll bool
	MasqueradeBit int
	// MinSyncPeriod and SyncPeriod pace the sync loop.
	MinSyncPeriod, SyncPeriod time.Duration
	// MetricsAddr and HealthzAddr are listen addresses; empty disables.
	MetricsAddr, HealthzAddr string
	// NetNS, if valid, is the network namespace whose addresses are the
	// node's (the backends get their own namespace option from Backends).
	NetNS netns.NsHandle
}

// Run starts the agent and blocks until ctx ends or startup fails. It never
// removes programmed rules on its way out: the kernel keeps serving.
func Run(ctx context.Context, client kubernetes.Interface, opts Options) error {
	if opts.NodeName == "" {
		return errors.New("the node name is not set: pass --node-name or set NODE_NAME")
	}
	newBackend, ok := opts.Backends[opts.Mode]
	if !ok {
		return fmt.Errorf("mode %q is not supported by this agent (supported: %v)", opts.Mode, supportedModes(opts.Backends))
	}

	factory := informers.NewSharedInformerFactory(client, 0)
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", opts.NodeName).String()
	}))
	tracker := model.NewTracker(opts.NodeName, func(err error) {
		klog.ErrorS(err, "Skipped a malformed part of a Service or EndpointSlice; the rest is programmed")
	})
	if err := wireTracker(factory, tracker); err != nil {
		return err
	}
	nodeInformer := nodeFactory.Core().V1().Nodes()
	nodeLister := nodeInformer.Lister()
	nodeInformer.Informer() // register before Start

	factory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())
	for typ, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return fmt.Errorf("informer cache for %v did not sync", typ)
		}
	}
	nodeFactory.WaitForCacheSync(ctx.Done())

	node, err := nodeLister.Get(opts.NodeName)
	if apierrors.IsNotFound(err) {
		klog.InfoS("This node's Node object does not exist (yet); endpoints are local only when their nodeName matches", "node", opts.NodeName)
		node = nil
	} else if err != nil {
		return err
	}
	local, err := localAddrs(opts.NetNS)
	if err != nil {
		return fmt.Errorf("list the node's addresses: %w", err)
	}
	nodeIPs, err := NodePortIPs(opts.NodePortAddresses, node, local)
	if err != nil {
		return err
	}
	backend, err := newBackend(dataplane.NodeConfig{
		NodeName:      opts.NodeName,
		NodeIPs:       nodeIPs,
		ClusterCIDRs:  opts.ClusterCIDRs,
		MasqueradeAll: opts.MasqueradeAll,
		MasqueradeBit: opts.MasqueradeBit,
	})
	if err != nil {
		return fmt.Errorf("start the %s dataplane: %w", opts.Mode, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	loop := syncloop.New(syncloop.Config{MinSyncPeriod: opts.MinSyncPeriod, SyncPeriod: opts.SyncPeriod}, tracker, backend, syncloop.NewMetrics(reg))

	healthTimeout := 2 * opts.SyncPeriod
	if healthTimeout < time.Minute {
		healthTimeout = time.Minute
	}
	servers := []*http.Server{}
	if opts.HealthzAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if err := loop.Healthy(healthTimeout); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		})
		mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		servers = append(servers, &http.Server{Addr: opts.HealthzAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second})
	}
	if opts.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		servers = append(servers, &http.Server{Addr: opts.MetricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second})
	}
	for _, srv := range servers {
		l, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", srv.Addr, err)
		}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
	}

	klog.InfoS("proxyshift-agent running", "node", opts.NodeName, "mode", opts.Mode, "nodePortIPs", nodeIPs)
	loop.Run(ctx)
	return nil
}

// wireTracker feeds Service and EndpointSlice events into the tracker.
func wireTracker(factory informers.SharedInformerFactory, t *model.Tracker) error {
	if _, err := factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { t.OnServiceAdd(o.(*corev1.Service)) },
		UpdateFunc: func(_, o any) { t.OnServiceUpdate(o.(*corev1.Service)) },
		DeleteFunc: func(o any) {
			if svc, ok := unwrapDeleted(o).(*corev1.Service); ok {
				t.OnServiceDelete(svc)
			}
		},
	}); err != nil {
		return err
	}
	_, err := factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { t.OnEndpointSliceAdd(o.(*discoveryv1.EndpointSlice)) },
		UpdateFunc: func(_, o any) { t.OnEndpointSliceUpdate(o.(*discoveryv1.EndpointSlice)) },
		DeleteFunc: func(o any) {
			if s, ok := unwrapDeleted(o).(*discoveryv1.EndpointSlice); ok {
				t.OnEndpointSliceDelete(s)
			}
		},
	})
	return err
}

func unwrapDeleted(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

// localAddrs lists the addresses of the node's namespace (the current one
// when ns is not valid).
func localAddrs(ns netns.NsHandle) ([]netip.Addr, error) {
	h := &netlink.Handle{}
	if ns.IsOpen() {
		var err error
		if h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE); err != nil {
			return nil, err
		}
		defer h.Close()
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func supportedModes(b map[v1alpha1.ProxyMode]BackendFactory) []v1alpha1.ProxyMode {
	var modes []v1alpha1.ProxyMode
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS} {
		if _, ok := b[m]; ok {
			modes = append(modes, m)
		}
	}
	return modes
}
