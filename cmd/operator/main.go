// Command proxyshift-operator reconciles ProxyConfigs: it selects nodes,
// checks they can run the desired mode, and moves them over in safe batches
// by writing their ProxyNode specs.
//
// It reconciles only when it holds the leader election Lease.
package main

import (
	"crypto/tls"
	"flag"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	proxyv1alpha1 "github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers"
	"github.com/proxyshift/proxyshift/internal/gcpercent"
)

func main() {
	var (
		metricsAddr   string
		metricsSecure bool
		metricsCerts  string
		probeAddr     string
		pprofAddr     string
		leaderElect   bool
		leaderElectNS string
		leaderElectID string
		kubeProxyDS   string
		kubeProxyCM   string
		kubeProxyKey  string
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "Address the Prometheus metrics endpoint binds to; 0 disables it.")
	flag.BoolVar(&metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS to authenticated callers only: a bearer token the API server accepts (TokenReview) whose owner may get the /metrics URL (SubjectAccessReview; see the proxyshift-metrics-reader ClusterRole). false serves plain HTTP to anyone.")
	flag.StringVar(&metricsCerts, "metrics-cert-dir", "", "Directory with tls.crt and tls.key for the metrics endpoint; empty uses a self-signed certificate.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address the /healthz and /readyz endpoints bind to.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "", "Address to serve Go's profiles on (/debug/pprof/, plain HTTP, no authentication: bind it to 127.0.0.1); empty disables them.")
	flag.BoolVar(&leaderElect, "leader-elect", true, "Elect a leader so only one operator replica acts at a time.")
	flag.StringVar(&leaderElectNS, "leader-election-namespace", "", "Namespace of the leader election Lease; defaults to the pod's namespace in-cluster.")
	flag.StringVar(&leaderElectID, "leader-election-id", "proxyshift-operator.proxyshift.io", "Name of the leader election Lease.")
	flag.StringVar(&kubeProxyDS, "kube-proxy-daemonset", controllers.DefaultKubeProxyDaemonSet.String(), "kube-proxy's DaemonSet, namespace/name: nodes proxyshift takes over are excluded from it with a node label (its node affinity is extended once, and restored when no node needs it), and mode kube-proxy hands nodes back to it. Empty means this cluster has no kube-proxy: nothing is stopped and mode kube-proxy is refused.")
	flag.StringVar(&kubeProxyCM, "kube-proxy-configmap", controllers.DefaultKubeProxyConfigMap.String(), "kube-proxy's ConfigMap, namespace/name, whose mode a ProxyConfig with spec.kubeProxy changes (the operator's ClusterRole allows ConfigMaps named kube-proxy only). Empty refuses spec.kubeProxy.")
	flag.StringVar(&kubeProxyKey, "kube-proxy-config-key", controllers.DefaultKubeProxyConfigKey, "The key of kube-proxy's configuration file in --kube-proxy-configmap.")
	gcPct := gcpercent.Bind(flag.CommandLine, defaultGCPercent, "Go's GOGC for the operator: how far its heap may grow past what is live before a collection, in percent; 50 by default, where Go's is 100: the operator's memory in a large cluster, for a little more CPU.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	gcPct.Apply()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	kubeProxy, err := controllers.ParseNamespacedName(kubeProxyDS)
	if err != nil {
		log.Error(err, "invalid --kube-proxy-daemonset")
		os.Exit(1)
	}
	kubeProxyConfig, err := controllers.ParseNamespacedName(kubeProxyCM)
	if err != nil {
		log.Error(err, "invalid --kube-proxy-configmap")
		os.Exit(1)
	}
	ctlOpts := controllers.Options{KubeProxyDaemonSet: kubeProxy, KubeProxyConfigMap: kubeProxyConfig, KubeProxyConfigKey: kubeProxyKey}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(proxyv1alpha1.AddToScheme(scheme))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "no Kubernetes client configuration: set --kubeconfig or KUBECONFIG, or run in a cluster")
		os.Exit(1)
	}
	metrics := metricsserver.Options{BindAddress: metricsAddr}
	if metricsSecure {
		metrics.SecureServing = true
		metrics.CertDir = metricsCerts
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
		// HTTP/1.1 only: HTTP/2's stream resets (CVE-2023-44487) are
		// not worth having on a metrics endpoint.
		metrics.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metrics,
		HealthProbeBindAddress:        probeAddr,
		PprofBindAddress:              pprofAddr,
		LeaderElection:                leaderElect,
		LeaderElectionID:              leaderElectID,
		LeaderElectionNamespace:       leaderElectNS,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controllers.CacheOptions(ctlOpts),
	})
	if err != nil {
		log.Error(err, "unable to create the controller manager")
		os.Exit(1)
	}
	if _, err := controllers.SetupWithManager(mgr, ctlOpts); err != nil {
		log.Error(err, "unable to set up the controllers")
		os.Exit(1)
	}
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	utilruntime.Must(mgr.AddReadyzCheck("readyz", healthz.Ping))

	log.Info("starting proxyshift-operator", "leaderElection", leaderElect, "kubeProxyDaemonSet", kubeProxyDS, "kubeProxyConfigMap", kubeProxyCM)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "controller manager stopped with an error")
		os.Exit(1)
	}
}
