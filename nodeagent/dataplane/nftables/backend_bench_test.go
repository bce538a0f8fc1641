package nftables

import (
	"context"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// The benchmarks program a real kernel, in a network namespace of their
// own, with n ClusterIP services of 10 endpoints each (as root only).

// syncedBackend is a backend in a network namespace of its own, holding
// BenchModel(n) after one full sync.
func syncedBackend(b *testing.B, n int) (*Backend, *model.Snapshot) {
	ns, _ := kernelNS(b)
	be := newBackend(b, ns)
	m := dt.BenchModel(n)
	if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		b.Fatal(err)
	}
	return be, m
}

// benchmarkFullSync measures a full resync of a table already holding
// the model: every chain and map flushed and written again.
func benchmarkFullSync(b *testing.B, n int) {
	be, m := syncedBackend(b, n)
	dt.FullSyncs(b, be, m)
}

// benchmarkOneEndpointChange measures an incremental sync after one
// endpoint of one service changed.
func benchmarkOneEndpointChange(b *testing.B, n int) {
	be, m := syncedBackend(b, n)
	dt.EndpointChanges(b, be, m)
}

// benchmarkResync measures a periodic resync of a table that holds the
// model: read back and compared, nothing written.
func benchmarkResync(b *testing.B, n int) {
	be, m := syncedBackend(b, n)
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

// benchmarkNewFlow measures what a new connection costs where the
// namespace's nat hook holds either one empty chain (conntrack and NAT
// at work, nothing of proxyshift's) or the tables of BenchModel(n) ("n"
// > 0): one UDP datagram from a new socket to 127.0.0.1, an address no
// service has, so that the main table's chains run and every service
// table's lookup misses. Each datagram is a new conntrack entry, which
// the nat chains see; the difference between the two is what the tables
// add to a connection's first packet.
func benchmarkNewFlow(b *testing.B, n int) {
	ns, conn := kernelNS(b)
	if n > 0 {
		be := newBackend(b, ns)
		if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: dt.BenchModel(n), Full: true}); err != nil {
			b.Fatal(err)
		}
	} else {
		t := conn.AddTable(&nftables.Table{Name: "conntrack-only", Family: nftables.TableFamilyIPv4})
		conn.AddChain(&nftables.Chain{Name: "nat-output", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
		if err := conn.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	dst := &unix.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 1}}
	err := ns.NS().Do(func() error {
		b.ResetTimer()
		for range b.N {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			err = unix.Sendto(fd, []byte{0}, 0, dst)
			unix.Close(fd)
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

func BenchmarkNewFlowConntrackOnly(b *testing.B) { benchmarkNewFlow(b, 0) }
func BenchmarkNewFlow10k(b *testing.B)           { benchmarkNewFlow(b, 10000) }
