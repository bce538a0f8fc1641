package ipvs

import (
	"context"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The benchmarks program IPVS in a network namespace of their own with n
// ClusterIP services of 10 endpoints each, the model the nftables
// backend's benchmarks use. They need the test VM: make bench-vm. Under
// TCG emulation their times are not comparable with anything measured on
// the host; compare them with each other.

// benchBackend returns a backend in a fresh namespace, synced with m.
func benchBackend(b *testing.B, m *model.Snapshot) *Backend {
	b.Helper()
	loadVMModules(b)
	ns := netlab.NewNetNS(b, "ipvs-bench")
	be, err := New(labConfig, WithNetNS(ns.NS()))
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	c, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("the first sync into an empty namespace programmed %+v in %v", c, time.Since(start).Round(time.Millisecond))
	return be
}

// benchmarkFullSync measures a full resync of a kernel already holding
// the model: every virtual service and real server read back and
// compared, the helper table rewritten.
func benchmarkFullSync(b *testing.B, n int) {
	m := dt.BenchModel(n)
	be := benchBackend(b, m)
	dt.FullSyncs(b, be, m)
}

// benchmarkOneEndpointChange measures an incremental sync after one
// endpoint of one service changed.
func benchmarkOneEndpointChange(b *testing.B, n int) {
	m := dt.BenchModel(n)
	be := benchBackend(b, m)
	dt.EndpointChanges(b, be, m)
}

func BenchmarkFullSync1k(b *testing.B)           { benchmarkFullSync(b, 1000) }
func BenchmarkFullSync10k(b *testing.B)          { benchmarkFullSync(b, 10000) }
func BenchmarkOneEndpointChange1k(b *testing.B)  { benchmarkOneEndpointChange(b, 1000) }
func BenchmarkOneEndpointChange10k(b *testing.B) { benchmarkOneEndpointChange(b, 10000) }
