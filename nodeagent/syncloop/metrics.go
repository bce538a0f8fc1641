package syncloop

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// families are the IP families one sync programs: the model of both, in
// one transaction. kube-proxy runs one proxier per family (both, on a host
// that supports IPv6), so its families are recorded once per family.
var families = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}

// Metrics are the sync loop's Prometheus metrics: the proxyshift_*
// families, and the kube-proxy families of the same names, types, labels
// and meaning as kube-proxy v1.37's, which existing dashboards and alerts
// read. Every method records both.
type Metrics struct {
	SyncDuration        *prometheus.HistogramVec
	NetworkProgramming  prometheus.Histogram
	LastSyncTimestamp   prometheus.Gauge
	SyncFailures        *prometheus.CounterVec
	ProgrammedServices  prometheus.Gauge
	ProgrammedEndpoints prometheus.Gauge

	// KubeProxy holds kube-proxy's families.
	KubeProxy KubeProxyMetrics
}

// KubeProxyMetrics are the kube-proxy metrics the agent exposes (see
// k8s.io/kubernetes/pkg/proxy/metrics), labelled by ip_family where
// kube-proxy labels them.
type KubeProxyMetrics struct {
	// SyncDuration is kubeproxy_sync_proxy_rules_duration_seconds.
	SyncDuration *prometheus.HistogramVec
	// LastSyncTimestamp is kubeproxy_sync_proxy_rules_last_timestamp_seconds.
	LastSyncTimestamp *prometheus.GaugeVec
	// LastQueued is kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds.
	LastQueued *prometheus.GaugeVec
	// NetworkProgramming is kubeproxy_network_programming_duration_seconds.
	NetworkProgramming *prometheus.HistogramVec
	// EndpointChanges is kubeproxy_sync_proxy_rules_endpoint_changes_total.
	EndpointChanges prometheus.Counter
	// ServiceChanges is kubeproxy_sync_proxy_rules_service_changes_total.
	ServiceChanges prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	kp := KubeProxyMetrics{
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeproxy_sync_proxy_rules_duration_seconds",
			Help:    "SyncProxyRules latency in seconds",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"ip_family"}),
		LastSyncTimestamp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced",
		}, []string{"ip_family"}),
		LastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued",
		}, []string{"ip_family"}),
		NetworkProgramming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeproxy_network_programming_duration_seconds",
			Help:    "In Cluster Network Programming Latency in seconds",
			Buckets: networkProgrammingBuckets(),
		}, []string{"ip_family"}),
		EndpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes",
		}),
		ServiceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes",
		}),
	}
	m := &Metrics{
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "proxyshift_sync_proxy_rules_duration_seconds",
			Help:    "Time one sync of the proxy rules took, by kind (full or partial).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"kind"}),
		NetworkProgramming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "proxyshift_network_programming_duration_seconds",
			Help:    "Time from the agent learning of a Service or EndpointSlice change to the change being in the kernel.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		LastSyncTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxyshift_sync_proxy_rules_last_timestamp_seconds",
			Help: "Unix time of the last successful sync of the proxy rules.",
		}),
		SyncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyshift_sync_proxy_rules_failures_total",
			Help: "Syncs of the proxy rules that failed, by kind (full or partial).",
		}, []string{"kind"}),
		ProgrammedServices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxyshift_programmed_services",
			Help: "Service ports programmed into the dataplane.",
		}),
		ProgrammedEndpoints: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxyshift_programmed_endpoints",
			Help: "Endpoints programmed into the dataplane.",
		}),
		KubeProxy: kp,
	}
	reg.MustRegister(m.SyncDuration, m.NetworkProgramming, m.LastSyncTimestamp, m.SyncFailures, m.ProgrammedServices, m.ProgrammedEndpoints,
		kp.SyncDuration, kp.LastSyncTimestamp, kp.LastQueued, kp.NetworkProgramming, kp.EndpointChanges, kp.ServiceChanges)
	return m
}

// networkProgrammingBuckets are kube-proxy's buckets for network
// programming latency: 0.25 s and 0.5 s, every second to 59 s, every 5 s
// to 115 s, every 30 s to 5 min.
func networkProgrammingBuckets() []float64 {
	b := prometheus.LinearBuckets(0.25, 0.25, 2)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// RecordSync records one sync of the rules that serve traffic: its
// duration by kind, or a failure, and on success what is programmed. The
// agent calls it for every sync of the serving backend, wherever it
// happens (the loop's syncs, and the full sync that programs a mode before
// it starts serving), so the first sync after start-up is counted too.
// Like kube-proxy, kubeproxy_sync_proxy_rules_duration_seconds counts
// failed syncs too.
func (m *Metrics) RecordSync(full bool, d time.Duration, counts dataplane.Counts, err error) {
	kind := "partial"
	if full {
		kind = "full"
	}
	for _, f := range families {
		m.KubeProxy.SyncDuration.WithLabelValues(string(f)).Observe(d.Seconds())
	}
	if err != nil {
		m.SyncFailures.WithLabelValues(kind).Inc()
		return
	}
	m.SyncDuration.WithLabelValues(kind).Observe(d.Seconds())
	m.LastSyncTimestamp.SetToCurrentTime()
	for _, f := range families {
		m.KubeProxy.LastSyncTimestamp.WithLabelValues(string(f)).SetToCurrentTime()
	}
	m.ProgrammedServices.Set(float64(counts.Services))
	m.ProgrammedEndpoints.Set(float64(counts.Endpoints))
}

// RecordProgrammed records, at the end of a successful sync, the network
// programming latency of the changes it programmed: from pendingFrom, when
// the agent learned of the first of them (unless zero), and from each of
// their EndpointSlices' trigger times.
func (m *Metrics) RecordProgrammed(pendingFrom time.Time, triggers []model.Trigger) {
	if !pendingFrom.IsZero() {
		m.NetworkProgramming.Observe(time.Since(pendingFrom).Seconds())
	}
	for _, tr := range triggers {
		m.KubeProxy.NetworkProgramming.WithLabelValues(string(tr.Family)).Observe(time.Since(tr.Time).Seconds())
	}
}

// ServiceChange counts a Service event (model.Observer).
func (m *Metrics) ServiceChange() { m.KubeProxy.ServiceChanges.Inc() }

// EndpointSliceChange counts an EndpointSlice event (model.Observer).
func (m *Metrics) EndpointSliceChange() { m.KubeProxy.EndpointChanges.Inc() }

// Queued records that changes were queued for sync (model.Observer).
func (m *Metrics) Queued() {
	for _, f := range families {
		m.KubeProxy.LastQueued.WithLabelValues(string(f)).SetToCurrentTime()
	}
}
