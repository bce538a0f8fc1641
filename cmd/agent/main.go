// Command proxyshift-agent is the per-node service proxy: it watches
// Services and EndpointSlices and programs them into the node's dataplane.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/agent"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/nftables"
)

func main() {
	klog.InitFlags(nil)
	var (
		kubeconfig        = flag.String("kubeconfig", "", "Path to a kubeconfig; in-cluster configuration when empty.")
		nodeName          = flag.String("node-name", os.Getenv("NODE_NAME"), "Name of the node this agent proxies for (default $NODE_NAME).")
		mode              = flag.String("mode", string(v1alpha1.ModeNFTables), "Dataplane to run when standalone: nftables.")
		clusterCIDRs      = flag.String("cluster-cidr", "", "Comma-separated pod CIDRs; service traffic from outside them is masqueraded.")
		nodePortAddresses = flag.String("nodeport-addresses", "", "Comma-separated CIDRs, or \"primary\", whose node addresses serve NodePorts; empty means all.")
		masqueradeAll     = flag.Bool("masquerade-all", false, "Masquerade all service traffic.")
		masqueradeBit     = flag.Int("masquerade-bit", 14, "Packet mark bit (0-31) flagging packets for masquerading.")
		minSyncPeriod     = flag.Duration("min-sync-period", time.Second, "Least time between two syncs of the rules.")
		syncPeriod        = flag.Duration("sync-period", 30*time.Second, "Time between two full resyncs, which repair drift.")
		metricsAddr       = flag.String("metrics-bind-address", "127.0.0.1:10249", "Address of the Prometheus /metrics endpoint; empty disables it.")
		healthzAddr       = flag.String("healthz-bind-address", "0.0.0.0:10256", "Address of the /healthz and /livez endpoints; empty disables them.")
	)
	flag.Parse()

	if err := run(*kubeconfig, agent.Options{
		NodeName: *nodeName,
		Mode:     v1alpha1.ProxyMode(*mode),
		Backends: map[v1alpha1.ProxyMode]agent.BackendFactory{
			v1alpha1.ModeNFTables: func(cfg dataplane.NodeConfig) (dataplane.Backend, error) { return nftables.New(cfg) },
		},
		NodePortAddresses: splitList(*nodePortAddresses),
		MasqueradeAll:     *masqueradeAll,
		MasqueradeBit:     *masqueradeBit,
		MinSyncPeriod:     *minSyncPeriod,
		SyncPeriod:        *syncPeriod,
		MetricsAddr:       *metricsAddr,
		HealthzAddr:       *healthzAddr,
	}, *clusterCIDRs); err != nil {
		klog.ErrorS(err, "proxyshift-agent stopped")
		os.Exit(1)
	}
}

func run(kubeconfig string, opts agent.Options, clusterCIDRs string) error {
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return fmt.Errorf("--masquerade-bit must be between 0 and 31, got %d", opts.MasqueradeBit)
	}
	for _, s := range splitList(clusterCIDRs) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("--cluster-cidr: %q is not a CIDR", s)
		}
		opts.ClusterCIDRs = append(opts.ClusterCIDRs, p.Masked())
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
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx, client, opts)
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
