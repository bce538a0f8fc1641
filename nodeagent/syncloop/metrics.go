package syncloop

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
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

// RecordSync records one sync of the rules that serve traffic: its
// duration by kind, or a failure, and on success what is programmed. The
// agent calls it for every sync of the serving backend, wherever it
// happens (the loop's syncs, and the full sync that programs a mode before
// it starts serving), so the first sync after start-up is counted too.
func (m *Metrics) RecordSync(full bool, d time.Duration, counts dataplane.Counts, err error) {
	kind := "partial"
	if full {
		kind = "full"
	}
	if err != nil {
		m.SyncFailures.WithLabelValues(kind).Inc()
		return
	}
	m.SyncDuration.WithLabelValues(kind).Observe(d.Seconds())
	m.LastSyncTimestamp.SetToCurrentTime()
	m.ProgrammedServices.Set(float64(counts.Services))
	m.ProgrammedEndpoints.Set(float64(counts.Endpoints))
}
