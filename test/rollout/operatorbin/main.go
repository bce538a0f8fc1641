// Command operatorbin runs the ProxyConfig reconciler on its own, for the
// scale benchmark in test/rollout: it counts its API writes by method and
// resource and writes them, with its reconcile counts and memory, to a JSON
// file twice a second and once more when it stops. It is a measuring
// stand-in for cmd/operator, with no leader election and no metrics port.
package main

import (
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers"
)

// Stats is what the benchmark reads.
type Stats struct {
	Writes       map[string]int64 `json:"writes"` // "POST proxynodes" -> count
	Reconciles   int64            `json:"reconciles"`
	Errors       int64            `json:"errors"`
	StatusWrites int64            `json:"statusWrites"`
	PeakRSSKiB   int64            `json:"peakRSSKiB"`
	PeakHeapMiB  float64          `json:"peakHeapMiB"`
}

type counter struct {
	mu     sync.Mutex
	writes map[string]int64
}

// counting is one client's transport, counting into the shared counter.
type counting struct {
	c    *counter
	next http.RoundTripper
}

func (t *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		t.c.mu.Lock()
		t.c.writes[req.Method+" "+resourceOf(req.URL.Path)]++
		t.c.mu.Unlock()
	}
	return t.next.RoundTrip(req)
}

// resourceOf turns /apis/g/v/[namespaces/ns/]resource[/name[/sub]] into
// resource[/sub].
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) > 0 && parts[0] == "api" {
		parts = parts[2:]
	} else if len(parts) > 2 {
		parts = parts[3:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "?"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
	}
	return 0
}

func main() {
	statsFile := flag.String("stats", "", "file to write stats to")
	heapProfile := flag.String("heap-profile", "", "write a heap profile here each time the heap in use reaches a new peak")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))

	cfg, err := ctrl.GetConfig() // --kubeconfig; client-side throttling off (API priority and fairness)
	if err != nil {
		panic(err)
	}
	cnt := &counter{writes: map[string]int64{}}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &counting{c: cnt, next: rt} })

	scheme := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  controllers.CacheOptions(controllers.Options{KubeProxyDaemonSet: controllers.DefaultKubeProxyDaemonSet}),
	})
	if err != nil {
		panic(err)
	}
	r, err := controllers.SetupWithManager(mgr, controllers.Options{KubeProxyDaemonSet: controllers.DefaultKubeProxyDaemonSet})
	if err != nil {
		panic(err)
	}
	var peakHeap uint64
	write := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > peakHeap {
			peakHeap = ms.HeapInuse
			if *heapProfile != "" {
				if f, err := os.Create(*heapProfile); err == nil {
					_ = pprof.WriteHeapProfile(f)
					_ = f.Close()
				}
			}
		}
		cnt.mu.Lock()
		s := Stats{Writes: map[string]int64{}, PeakRSSKiB: peakRSS(), PeakHeapMiB: float64(peakHeap) / (1 << 20)}
		for k, v := range cnt.writes {
			s.Writes[k] = v
		}
		cnt.mu.Unlock()
		t := r.Totals()
		s.Reconciles, s.Errors = t.Reconciles, t.Errors
		s.StatusWrites = r.Stats("scale").StatusWrites
		b, _ := json.Marshal(s)
		_ = os.WriteFile(*statsFile+".tmp", b, 0o644)
		_ = os.Rename(*statsFile+".tmp", *statsFile)
	}
	ctx := ctrl.SetupSignalHandler()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
				write()
			}
		}
	}()
	if err := mgr.Start(ctx); err != nil {
		panic(err)
	}
	write()
}
