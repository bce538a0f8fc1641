package nftables

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// The benchmarks program a real kernel, in a network namespace of their
// own, with n ClusterIP services of 10 endpoints each (as root only).

func benchModel(n int) *model.Snapshot {
	return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: manyPorts(n, 10),
		corev1.IPv6Protocol: {},
	}}
}

// benchmarkFullSync measures a full resync of a table already holding
// the model: every chain and map flushed and written again.
func benchmarkFullSync(b *testing.B, n int) {
	ns, _ := kernelNS(b)
	be := newBackend(b, ns)
	m := benchModel(n)
	if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		b.Fatal(err)
	}
	dataplanetest.FullSyncs(b, be, m)
}

// benchmarkOneEndpointChange measures an incremental sync after one
// endpoint of one service changed.
func benchmarkOneEndpointChange(b *testing.B, n int) {
	ns, _ := kernelNS(b)
	be := newBackend(b, ns)
	m := benchModel(n)
	if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		b.Fatal(err)
	}
	dataplanetest.EndpointChanges(b, be, m)
}

func BenchmarkFullSync1k(b *testing.B)           { benchmarkFullSync(b, 1000) }
func BenchmarkFullSync10k(b *testing.B)          { benchmarkFullSync(b, 10000) }
func BenchmarkOneEndpointChange1k(b *testing.B)  { benchmarkOneEndpointChange(b, 1000) }
func BenchmarkOneEndpointChange10k(b *testing.B) { benchmarkOneEndpointChange(b, 10000) }
