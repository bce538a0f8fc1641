package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/controlplane"
)

// Program is one of the two service proxies under test.
type Program struct {
	// Name is "kube-proxy" or "proxyshift".
	Name string
	// Path is the binary.
	Path string
	// args returns the command line for mode, given the run directory
	// (holding "kubeconfig") where it may write its configuration.
	args func(mode, dir string) ([]string, error)
	// syncMetric names the histogram of every sync's duration.
	syncMetric string
	// readyLine, if set, is the metrics line (with %s for the mode) that
	// says the program has finished starting up.
	readyLine string
	// metricsAddr is where its metrics answer in the node namespace.
	metricsAddr string
	// FollowsProxyNode says the program takes its mode from the node's
	// ProxyNode, which the benchmark creates before starting it.
	FollowsProxyNode bool
}

// kube-proxy's metrics and health endpoints: the lab sets its
// metricsBindAddress (default 127.0.0.1:10249) and healthzBindAddress
// (default 0.0.0.0:10256) to the node namespace's loopback, where the
// benchmark reads them.
const (
	kubeProxyMetricsAddr = "127.0.0.1:10249"
	kubeProxyHealthzAddr = "127.0.0.1:10256"
)

// proxyshiftMetricsAddr is the agent's default --metrics-bind-address.
const proxyshiftMetricsAddr = "127.0.0.1:10265"

// Both programs run with their shipped sync pacing: no minSyncPeriod and
// no syncPeriod is passed, so each uses its default (1 s and 30 s for
// both), periodic resyncs included. The benchmark measures the product
// as it ships.
const (
	// DefaultMinSyncPeriod is both programs' default least time between
	// two syncs; the endpoint changes are spaced further apart.
	DefaultMinSyncPeriod = time.Second
	// DefaultSyncPeriod is both programs' default time between periodic
	// resyncs; the endpoint changes span several of them.
	DefaultSyncPeriod = 30 * time.Second
)

// KubeProxy is kube-proxy at path, configured by a KubeProxyConfiguration
// file that sets only what the lab needs: the mode, hostnameOverride (the
// bench Node), the cluster CIDR with detectLocalMode ClusterCIDR, metrics
// and healthz on the namespace's loopback, no conntrack sysctl changes
// (nf_conntrack_max is not per namespace), and enableProfiling (Go's
// profiles on the metrics address, read for the heap figures; they cost
// nothing until asked for). Everything else, the sync periods included,
// is kube-proxy's default.
func KubeProxy(path string) Program {
	return Program{Name: "kube-proxy", Path: path, syncMetric: "kubeproxy_sync_proxy_rules_duration_seconds", metricsAddr: kubeProxyMetricsAddr,
		args: func(mode, dir string) ([]string, error) {
			cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: %s
hostnameOverride: %s
clusterCIDR: %s
detectLocalMode: ClusterCIDR
metricsBindAddress: %s
healthzBindAddress: %s
enableProfiling: true
conntrack:
  maxPerCore: 0
  min: 0
`, filepath.Join(dir, "kubeconfig"), mode, NodeName, EndpointCIDR, kubeProxyMetricsAddr, kubeProxyHealthzAddr)
			file := filepath.Join(dir, "kube-proxy.yaml")
			if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
				return nil, err
			}
			return []string{"--config", file, "--v=1"}, nil
		}}
}

// Proxyshift is proxyshift's agent at path as it ships: following the
// node's ProxyNode (the default --proxynode=true), whose spec the
// benchmark writes as the operator would (desiredMode, a configRef), and
// whose status the agent writes. It gets only what the lab needs, the
// same as kube-proxy: --kubeconfig, --node-name, --mode (the same mode
// the ProxyNode asks for), --cluster-cidr, -v=1, and --profiling (Go's
// profiles on the metrics address, as kube-proxy's enableProfiling).
// Everything else is the agent's default: the sync periods, its metrics
// on 127.0.0.1:10265, its health endpoints on 0.0.0.0:10266 and, as
// kube-proxy's stand-in, 0.0.0.0:10256 (all inside the node namespace).
func Proxyshift(path string) Program {
	return Program{Name: "proxyshift", Path: path, syncMetric: "proxyshift_sync_proxy_rules_duration_seconds",
		metricsAddr: proxyshiftMetricsAddr, FollowsProxyNode: true,
		// The agent verifies a mode before it calls the switch done.
		readyLine: `proxyshift_node_phase{mode="%s",phase="Active"} 1`,
		args: func(mode, dir string) ([]string, error) {
			return []string{
				"--kubeconfig", filepath.Join(dir, "kubeconfig"), "--node-name", NodeName,
				"--mode", mode, "--cluster-cidr", EndpointCIDR.String(), "-v=1", "--profiling",
			}, nil
		}}
}

// Flags is the command line the program runs with in mode (the
// configuration file's path as "<dir>"), for the report.
func (p Program) Flags(mode string) string {
	dir, err := os.MkdirTemp("", "proxyshift-bench-flags-")
	if err != nil {
		return "?"
	}
	defer os.RemoveAll(dir)
	args, err := p.args(mode, dir)
	if err != nil {
		return "?"
	}
	out := strings.Join(args, " ")
	// A configuration file the program is given is shown too.
	for _, a := range args {
		if strings.HasPrefix(a, dir) {
			if b, err := os.ReadFile(a); err == nil {
				out += "\n" + strings.TrimRight(string(b), "\n")
			}
		}
	}
	return strings.ReplaceAll(out, dir, "<dir>")
}

// Running is a program started in a node namespace.
type Running struct {
	Program Program
	mode    string
	node    *Node
	proc    *cluster.Process
	http    *http.Client
}

// Start writes a kubeconfig reaching the API server through the node's
// relay, and starts the program in the node namespace, logging to
// dir/<name>-<mode>.log.
func (p Program) Start(node *Node, mode, dir, adminKubeconfig string) (*Running, error) {
	if err := writeRelayKubeconfig(adminKubeconfig, filepath.Join(dir, "kubeconfig"), node.APIServer); err != nil {
		return nil, err
	}
	args, err := p.args(mode, dir)
	if err != nil {
		return nil, err
	}
	proc := &cluster.Process{Name: p.Name, NS: node.NS, Path: p.Path, Args: args, Log: filepath.Join(dir, p.Name+"-"+mode+".log")}
	if err := proc.Start(); err != nil {
		return nil, err
	}
	return &Running{Program: p, mode: mode, node: node, proc: proc,
		http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: node.NS.DialContext}}}, nil
}

// writeRelayKubeconfig copies the administrator's kubeconfig with its
// server set to the relay (the API server's certificate names 127.0.0.1).
func writeRelayKubeconfig(from, to, relay string) error {
	cfg, err := clientcmd.LoadFromFile(from)
	if err != nil {
		return err
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + relay
	}
	return clientcmd.WriteToFile(*cfg, to)
}

// Exited reports whether the program has stopped, with its exit error.
func (r *Running) Exited() (bool, error) {
	done, errOf := r.proc.Exited()
	select {
	case <-done:
		return true, errOf()
	default:
		return false, nil
	}
}

// Stop ends the program (SIGTERM, then SIGKILL).
func (r *Running) Stop() error { return r.proc.Stop(15 * time.Second) }

// PeakRSS is the program's peak resident set size so far (VmHWM).
func (r *Running) PeakRSS() (int64, error) {
	pid := r.proc.Pid()
	if pid == 0 {
		return 0, fmt.Errorf("%s is not running", r.Program.Name)
	}
	return controlplane.PeakRSS(pid)
}

// Histogram is a histogram's running count and sum.
type Histogram struct {
	Count uint64
	Sum   float64
}

// Sub is the histogram of the observations made since old.
func (h Histogram) Sub(old Histogram) Histogram {
	return Histogram{Count: h.Count - old.Count, Sum: h.Sum - old.Sum}
}

// Mean is the mean observation (0 without any).
func (h Histogram) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return time.Duration(h.Sum / float64(h.Count) * float64(time.Second))
}

// metrics fetches the program's metrics page.
func (r *Running) metrics(ctx context.Context) ([]byte, error) {
	return httpGet(ctx, r.http, "http://"+r.Program.metricsAddr+"/metrics")
}

// Heap reads the program's Go heap through its metrics and its pprof
// handlers, both on the metrics address (both programs are started with
// profiling on).
func (r *Running) Heap() goHeap {
	base := "http://" + r.Program.metricsAddr
	return goHeap{client: r.http, pprof: base, metrics: base + "/metrics"}
}

// Syncs reads the program's sync-duration histogram from its metrics,
// summed over its labels (sync kind, IP family), and whether the program
// says it has finished starting up.
func (r *Running) Syncs(ctx context.Context) (Histogram, bool, error) {
	b, err := r.metrics(ctx)
	if err != nil {
		return Histogram{}, false, err
	}
	ready := r.Program.readyLine == "" || bytes.Contains(b, []byte(fmt.Sprintf(r.Program.readyLine, r.mode)))
	h, err := histogram(bytes.NewReader(b), r.Program.syncMetric)
	return h, ready, err
}

// metricFamilies parses a Prometheus text exposition (a metrics page).
func metricFamilies(body io.Reader) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(body)
}

// histogram sums the histogram called name in a Prometheus text exposition.
func histogram(body io.Reader, name string) (Histogram, error) {
	families, err := metricFamilies(body)
	if err != nil {
		return Histogram{}, err
	}
	f, ok := families[name]
	if !ok {
		return Histogram{}, nil // no sync yet
	}
	var h Histogram
	for _, m := range f.GetMetric() {
		if f.GetType() != dto.MetricType_HISTOGRAM {
			return Histogram{}, fmt.Errorf("%s is a %s, not a histogram", name, f.GetType())
		}
		h.Count += m.GetHistogram().GetSampleCount()
		h.Sum += m.GetHistogram().GetSampleSum()
	}
	return h, nil
}
