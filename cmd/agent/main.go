// Command proxyshift-agent is the per-node service proxy: it watches
// Services and EndpointSlices and programs them into the node's dataplane,
// follows its ProxyNode's desired mode (switching make-before-break) and
// reports the node's state in the ProxyNode's status.
//
// `proxyshift-agent --cleanup` removes everything proxyshift owns from the
// node, says what it removed, and exits (for uninstall).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/internal/gcpercent"
	"github.com/proxyshift/proxyshift/nodeagent/agent"
	"github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/nodeagent/kubeproxy"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// hiddenFlags are for tests and left out of -help.
var hiddenFlags = map[string]bool{"netns": true, "test-stop-at-phase": true, "test-fail-verify": true, "test-fail-hand-back-into": true}

func main() {
	klog.InitFlags(nil)
	var (
		kubeconfig        = flag.String("kubeconfig", "", "Path to a kubeconfig; in-cluster configuration when empty.")
		nodeName          = flag.String("node-name", os.Getenv("NODE_NAME"), "Name of the node this agent proxies for (default $NODE_NAME).")
		mode              = flag.String("mode", string(v1alpha1.ModeNFTables), "Dataplane to run when no ProxyNode asks for one: standalone, always; following a ProxyNode without spec.desiredMode, only on a node that nothing serves (no kube-proxy rules, no proxyshift mode in the kernel).")
		followProxyNode   = flag.Bool("proxynode", true, "Follow this node's ProxyNode (spec.desiredMode and settings) and write its status; false runs standalone on --mode (no proxyshift CRDs needed).")
		clusterCIDRs      = flag.String("cluster-cidr", "", "Comma-separated pod CIDRs; service traffic from outside them is masqueraded.")
		nodePortAddresses = flag.String("nodeport-addresses", "", "Comma-separated CIDRs, or \"primary\", whose node addresses serve NodePorts; empty means all.")
		masqueradeAll     = flag.Bool("masquerade-all", false, "Masquerade all service traffic.")
		masqueradeBit     = flag.Int("masquerade-bit", 14, "Packet mark bit (0-31) flagging packets for masquerading.")
		minSyncPeriod     = flag.Duration("min-sync-period", time.Second, "Least time between two syncs of the rules.")
		syncPeriod        = flag.Duration("sync-period", 30*time.Second, "Time between two full resyncs, which repair drift.")
		metricsAddr       = flag.String("metrics-bind-address", "127.0.0.1:10265", "Address of the Prometheus /metrics endpoint; empty disables it. Not kube-proxy's 10249: both run on a node until it is taken over.")
		watchList         = flag.Bool("watch-list", false, "Stream the informers' first lists of Services and EndpointSlices as watch events (client-go's WatchListClient) instead of listing them: less API-server memory per list, a slower start (the stream waits for a consistent snapshot; 0.4 to 1 s more at 10 000 Services).")
		gcPct             = gcpercent.Bind(flag.CommandLine, defaultGCPercent, "Go's GOGC for the agent: how far its heap may grow past what is live before a collection, in percent; 50 by default, where Go's is 100: the agent's memory on every node, for a little more CPU in its bursts of work.")
		profiling         = flag.Bool("profiling", false, "Serve Go's runtime profiles (heap, allocations, CPU, goroutines) under /debug/pprof/ on the metrics address, like kube-proxy's enableProfiling.")
		healthzAddr       = flag.String("healthz-bind-address", "0.0.0.0:10266", "Address of the /healthz and /livez endpoints; empty disables them. Not kube-proxy's 10256: both run on a node until it is taken over.")
		kubeProxyHealthz  = flag.String("kube-proxy-healthz-bind-address", "0.0.0.0:10256", "kube-proxy's health address (its healthzBindAddress), IP:port: while proxyshift serves the node in kube-proxy's place, /healthz and /livez answer there as kube-proxy's do, for load balancers and kubelets that probe it. Bound only once kube-proxy is gone, released before the node is handed back. Empty disables it; Services' health-check node ports are served either way.")
		modulesDir        = flag.String("modules-dir", "", "Kernel modules directory (modules.dep, modules.builtin and the modules); /lib/modules/$(uname -r) when empty.")
		procModules       = flag.String("proc-modules", "", "File listing the loaded modules; /proc/modules when empty.")
		sysModule         = flag.String("sys-module", "", "sysfs module directory; /sys/module when empty.")
		procSys           = flag.String("proc-sys-dir", "", "Where the IPVS mode reads and writes its sysctls; /proc/sys when empty. An unprivileged container's /proc/sys is read-only: mount the host's /proc/sys/net read-write at DIR/net and pass DIR.")
		kubeProxyMetrics  = flag.String("kube-proxy-metrics-url", kubeproxy.DefaultMetricsURL, "kube-proxy's metrics endpoint on this node (its metricsBindAddress): handing the node back, proxyshift keeps serving until it says kube-proxy has synced. Empty trusts kube-proxy's rules being in the kernel alone.")
		doCleanup         = flag.Bool("cleanup", false, "Remove everything proxyshift owns from this node (both iptables backends, nftables, ipsets, dummy interface, IPVS services on it), print what was removed, and exit.")
		netnsName         = flag.String("netns", "", "Testing only: program the network namespace /run/netns/NAME instead of the agent's own.")
		stopAt            = flag.String("test-stop-at-phase", "", "Testing only: hang once a switch has done this phase's work (Preparing, Programming, Verifying, CleaningUp).")
		failVerify        = flag.Bool("test-fail-verify", false, "Testing only: make every Verifying phase fail.")
		failHandBackInto  = flag.String("test-fail-hand-back-into", "", "Testing only: make handing the node back to kube-proxy fail while kube-proxy runs in this mode.")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage of %s:\n", filepath.Base(os.Args[0]))
		flag.VisitAll(func(f *flag.Flag) {
			if hiddenFlags[f.Name] {
				return
			}
			fmt.Fprintf(flag.CommandLine.Output(), "  -%s\n    \t%s (default %q)\n", f.Name, f.Usage, f.DefValue)
		})
	}
	flag.Parse()
	useWatchList(*watchList)
	gcPct.Apply()

	opts := agent.Options{
		NodeName:             *nodeName,
		Mode:                 v1alpha1.ProxyMode(*mode),
		NodePortAddresses:    splitList(*nodePortAddresses),
		MasqueradeAll:        *masqueradeAll,
		MasqueradeBit:        *masqueradeBit,
		MinSyncPeriod:        *minSyncPeriod,
		SyncPeriod:           *syncPeriod,
		MetricsAddr:          *metricsAddr,
		Profiling:            *profiling,
		HealthzAddr:          *healthzAddr,
		KubeProxyHealthzAddr: *kubeProxyHealthz,
		KubeProxyMetricsURL:  *kubeProxyMetrics,
		TestStopAtPhase:      v1alpha1.NodePhase(*stopAt),
		TestFailVerify:       *failVerify,
		TestFailHandBackInto: v1alpha1.ProxyMode(*failHandBackInto),
	}
	opts.Kernel.ModulesDir, opts.Kernel.ProcModules, opts.Kernel.SysModule = *modulesDir, *procModules, *sysModule
	if *netnsName != "" {
		h, err := netns.GetFromName(*netnsName)
		if err != nil {
			klog.ErrorS(err, "Cannot open the network namespace", "netns", *netnsName)
			os.Exit(1)
		}
		opts.NetNS = nsexec.NS(h)
	}
	opts.Backends = backends.Factories(backends.Env{NS: opts.NetNS, ProcSys: *procSys})
	if *doCleanup {
		os.Exit(runCleanup(opts))
	}
	if err := run(*kubeconfig, *followProxyNode, opts, *clusterCIDRs); err != nil {
		klog.ErrorS(err, "proxyshift-agent stopped")
		os.Exit(1)
	}
}

func run(kubeconfig string, followProxyNode bool, opts agent.Options, clusterCIDRs string) error {
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return fmt.Errorf("--masquerade-bit must be between 0 and 31, got %d", opts.MasqueradeBit)
	}
	switch opts.TestStopAtPhase {
	case "", v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeCleaningUp:
	default:
		return fmt.Errorf("--test-stop-at-phase must be Preparing, Programming, Verifying or CleaningUp, got %q", opts.TestStopAtPhase)
	}
	for _, s := range splitList(clusterCIDRs) {
		p, err := v1alpha1.CIDR(s).Parse()
		if err != nil {
			return fmt.Errorf("--cluster-cidr: %w", err)
		}
		opts.ClusterCIDRs = append(opts.ClusterCIDRs, p)
	}
	if a := opts.KubeProxyHealthzAddr; a != "" {
		if _, err := netip.ParseAddrPort(a); err != nil {
			return fmt.Errorf("--kube-proxy-healthz-bind-address must be IP:port or empty: %w", err)
		}
	}
	if err := agent.ValidNodePortAddresses(opts.NodePortAddresses); err != nil {
		return fmt.Errorf("--nodeport-addresses: %w", err)
	}
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("no Kubernetes client configuration (pass --kubeconfig outside a cluster): %w", err)
	}
	// Services and EndpointSlices come as protobuf, as kube-proxy asks
	// for them: at 10k Services the first list decodes several times
	// faster, with a fraction of the garbage of JSON. The ProxyNode client
	// (a custom resource, JSON only) gets cfg as it is.
	client, err := kubernetes.NewForConfig(protobuf(cfg))
	if err != nil {
		return err
	}
	if followProxyNode {
		opts.RESTConfig = cfg
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx, client, opts)
}

// protobuf is a copy of cfg asking for protobuf, JSON where a type has none.
func protobuf(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return c
}

// runCleanup removes everything proxyshift owns (agent.Cleanup) and
// prints one line per removed object.
func runCleanup(opts agent.Options) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep := agent.Cleanup(ctx, opts)
	for _, n := range rep.Notes {
		fmt.Fprintln(os.Stderr, n)
	}
	for _, l := range rep.Removed {
		fmt.Printf("removed %s\n", l)
	}
	if len(rep.Removed) == 0 {
		fmt.Println("nothing of proxyshift's was found on this node")
	}
	if rep.Incomplete {
		fmt.Fprintln(os.Stderr, "cleanup incomplete: see the errors above; run it again once fixed")
		return 1
	}
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
