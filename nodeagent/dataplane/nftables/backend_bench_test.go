package nftables

import (
	"context"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
)

// The benchmarks program a real kernel, in a network namespace of their
// own, with n ClusterIP services of 10 endpoints each (as root only).

// benchmarkFullSync measures a full resync of a table already holding
// the model: every chain and map flushed and written again.
func benchmarkFullSync(b *testing.B, n int) {
	ns, _ := kernelNS(b)
	be := newBackend(b, ns)
	m := dt.BenchModel(n)
	if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		b.Fatal(err)
	}
	dt.FullSyncs(b, be, m)
}

// benchmarkOneEndpointChange measures an incremental sync after one
// endpoint of one service changed.
func benchmarkOneEndpointChange(b *testing.B, n int) {
	ns, _ := kernelNS(b)
	be := newBackend(b, ns)
	m := dt.BenchModel(n)
	if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		b.Fatal(err)
	}
	dt.EndpointChanges(b, be, m)
}

// benchmarkResync measures a periodic resync of a table that holds the
// model: read back and compared, nothing written.
func benchmarkResync(b *testing.B, n int) {
	ns, _ := kernelNS(b)
	be := newBackend(b, ns)
	m := dt.BenchModel(n)
	if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true, Resync: true}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchmarkProgrammed measures Programmed on a table that holds the
// model: what a mode switch's Verifying phase reads back before it
// probes.
func benchmarkProgrammed(b *testing.B, n int) {
	ns, _ := kernelNS(b)
	be := newBackend(b, ns)
	m := dt.BenchModel(n)
	synced, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if got, err := be.Programmed(context.Background()); err != nil || got != synced {
			b.Fatalf("programmed %+v, %v; synced %+v", got, err, synced)
		}
	}
}

func BenchmarkProgrammed10k(b *testing.B) { benchmarkProgrammed(b, 10000) }

func BenchmarkResync1k(b *testing.B)  { benchmarkResync(b, 1000) }
func BenchmarkResync10k(b *testing.B) { benchmarkResync(b, 10000) }

func BenchmarkFullSync1k(b *testing.B)           { benchmarkFullSync(b, 1000) }
func BenchmarkFullSync10k(b *testing.B)          { benchmarkFullSync(b, 10000) }
func BenchmarkOneEndpointChange1k(b *testing.B)  { benchmarkOneEndpointChange(b, 1000) }
func BenchmarkOneEndpointChange10k(b *testing.B) { benchmarkOneEndpointChange(b, 10000) }
