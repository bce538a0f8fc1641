package iptables

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// The benchmarks program a real kernel, in a network namespace of their
// own, with n ClusterIP services of 10 endpoints each (as root only), for
// each iptables variant.

var benchSizes = []int{1000, 10000}

// forEachSize runs fn as a sub-benchmark per variant and size.
func forEachSize(b *testing.B, fn func(b *testing.B, v Variant, n int)) {
	for _, v := range variants {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%s/%dk", v, n/1000), func(b *testing.B) { fn(b, v, n) })
		}
	}
}

// BenchmarkFullSync measures a full sync of a node already holding the
// model (the first sync after an agent restart, a resync that found
// drift):
// iptables-save, then every chain flushed and written again. The first
// sync, into empty tables, is reported as first-sync-s.
func BenchmarkFullSync(b *testing.B) {
	forEachSize(b, func(b *testing.B, v Variant, n int) {
		ns := kernelNS(b, v)
		be := newKernelBackend(b, ns, v)
		m := dt.BenchModel(n)
		ctx := context.Background()
		start := time.Now()
		if _, err := be.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
			b.Fatal(err)
		}
		first := time.Since(start)
		for b.Loop() {
			if _, err := be.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(first.Seconds(), "first-sync-s")
	})
}

// BenchmarkOneEndpointChange measures an incremental sync after one
// endpoint of one service changed.
func BenchmarkOneEndpointChange(b *testing.B) {
	forEachSize(b, func(b *testing.B, v Variant, n int) {
		be, m := syncedBenchBackend(b, v, n)
		dt.EndpointChanges(b, be, m)
	})
}

// BenchmarkResync measures a periodic resync of a node holding the
// model: the tables read back and compared, nothing written.
func BenchmarkResync(b *testing.B) {
	forEachSize(b, func(b *testing.B, v Variant, n int) {
		be, m := syncedBenchBackend(b, v, n)
		for b.Loop() {
			if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true, Resync: true}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkVerify measures the periodic resync's verification of both
// families of a node holding the model: what a resync reads when the
// ruleset generation moved since the last one (BenchmarkResync's later
// rounds find it quiet and read nothing).
func BenchmarkVerify(b *testing.B) {
	forEachSize(b, func(b *testing.B, v Variant, n int) {
		be, _ := syncedBenchBackend(b, v, n)
		for b.Loop() {
			for _, f := range families {
				if why, err := be.verify(context.Background(), f, be.state[f]); err != nil || why != "" {
					b.Fatalf("%s: %q, %v", f.tool, why, err)
				}
			}
		}
	})
}

// BenchmarkProgrammed measures Programmed on a node holding the model:
// what a mode switch's Verifying phase reads back before it probes.
func BenchmarkProgrammed(b *testing.B) {
	forEachSize(b, func(b *testing.B, v Variant, n int) {
		be, _ := syncedBenchBackend(b, v, n)
		for b.Loop() {
			if _, err := be.Programmed(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCleanup measures Cleanup of a node holding the model: what a
// switch out of iptables does in its CleaningUp phase. Each round's full
// sync, which puts the model back, is not timed.
func BenchmarkCleanup(b *testing.B) {
	forEachSize(b, func(b *testing.B, v Variant, n int) {
		be, m := syncedBenchBackend(b, v, n)
		ctx := context.Background()
		for b.Loop() {
			removed, err := be.Cleanup(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(removed) < n {
				b.Fatalf("cleanup removed %d objects of %d services", len(removed), n)
			}
			b.StopTimer()
			if _, err := be.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
}

// syncedBenchBackend is a backend of variant v in a namespace of its own,
// holding the benchmark model of n services after one full sync.
func syncedBenchBackend(b *testing.B, v Variant, n int) (*Backend, *model.Snapshot) {
	m := dt.BenchModel(n)
	_, be := syncedBackend(b, v, m)
	return be, m
}

// BenchmarkKernelFacts measures the nft variant's probe (its kernel
// facts, gathered every minute; detection, at New) of a node programmed
// in iptables mode, read as it is (netlink) and with iptables-nft-save,
// as it was.
func BenchmarkKernelFacts(b *testing.B) {
	for _, n := range benchSizes {
		ns, _ := syncedBackend(b, NFT, dt.BenchModel(n))
		ctx := context.Background()
		for _, c := range []struct {
			name string
			read func() VariantFacts
		}{
			{"netlink", func() VariantFacts { return facts(probeNFT(ctx, ns.NS())) }},
			{"iptables-nft-save", func() VariantFacts { return facts(probeVariant(ctx, NFT, ns.NS())) }},
		} {
			b.Run(fmt.Sprintf("%dk/%s", n/1000, c.name), func(b *testing.B) {
				for b.Loop() {
					if f := c.read(); !f.HoldsRules || f.Err != nil {
						b.Fatalf("facts of a programmed node: %+v", f)
					}
				}
			})
		}
	}
}

// BenchmarkDetect measures the detection New runs (both variants, both
// families) on a node programmed in iptables mode (nft variant), as when
// the agent restarts there.
func BenchmarkDetect(b *testing.B) {
	for _, n := range benchSizes {
		ns, _ := syncedBackend(b, NFT, dt.BenchModel(n))
		ctx := context.Background()
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			for b.Loop() {
				if v, err := Detect(ctx, WithNetNS(ns.NS())); v != NFT || err != nil {
					b.Fatalf("Detect = %q, %v; want nft", v, err)
				}
			}
		})
	}
}
