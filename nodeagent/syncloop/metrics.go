package syncloop

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sync loop's Prometheus metrics, named like kube-proxy's
// so existing dashboards translate.
type Metrics struct {
	SyncDuration        *prometheus.HistogramVec
	NetworkProgramming  prometheus.Histogram
	LastSyncTimestamp   prometheus.Gauge
	SyncFailures        *prometheus.CounterVec
	ProgrammedServices  prometheus.Gauge
	ProgrammedEndpoints prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
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
	}
	reg.MustRegister(m.SyncDuration, m.NetworkProgramming, m.LastSyncTimestamp, m.SyncFailures, m.ProgrammedServices, m.ProgrammedEndpoints)
	return m
}
