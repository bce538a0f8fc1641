package nftables

import (
	"context"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// The benchmarks program a real kernel, in a network namespace of their
// own, with n ClusterIP services of 10 endpoints each (as root only).

// syncedBackend is a backend in a network namespace of its own, with a
// google/nftables connection that reads it, holding BenchModel(n) after
// one full sync.
func syncedBackend(b *testing.B, n int) (*nftables.Conn, *Backend, *model.Snapshot) {
	ns, conn := kernelNS(b)
	be := newBackend(b, ns)
	m := dt.BenchModel(n)
	if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		b.Fatal(err)
	}
	return conn, be, m
}

// benchmarkFullSync measures a full resync of a table already holding
// the model: every chain and map flushed and written again.
func benchmarkFullSync(b *testing.B, n int) {
	_, be, m := syncedBackend(b, n)
	dt.FullSyncs(b, be, m)
}

// benchmarkOneEndpointChange measures an incremental sync after one
// endpoint of one service changed.
func benchmarkOneEndpointChange(b *testing.B, n int) {
	_, be, m := syncedBackend(b, n)
	dt.EndpointChanges(b, be, m)
}

// benchmarkResync measures a periodic resync of a table that holds the
// model: read back and compared, nothing written.
func benchmarkResync(b *testing.B, n int) {
	_, be, m := syncedBackend(b, n)
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

// benchmarkReplaceServiceRule measures what an endpoint change would
// cost if a port's endpoints were written into its service chain's DNAT
// rule, as kube-proxy writes them (README, Ruleset size): one
// transaction that flushes one service chain of a table holding the
// model and adds a rule back, through google/nftables, outside the
// backend. "dnat" adds the chain's own DNAT rule back, which makes the
// kernel re-validate the table at the commit; "counter" adds a rule
// without NAT, which does not: the difference is the validation.
func benchmarkReplaceServiceRule(b *testing.B, n int) {
	conn, _, m := syncedBackend(b, n)
	table := &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}
	names := model.SortedNames(m.Ports[corev1.IPv4Protocol])[:100]
	chains := make([]*nftables.Chain, len(names))
	dnat := make([][]expr.Any, len(names))
	for i, name := range names {
		chains[i] = &nftables.Chain{Name: namesFor(name).service, Table: table}
		rules, err := conn.GetRules(table, chains[i])
		if err != nil || len(rules) != 1 {
			b.Fatalf("rules of %s: %d, %v", chains[i].Name, len(rules), err)
		}
		dnat[i] = rules[0].Exprs
	}
	counter := []expr.Any{&expr.Counter{}}
	for _, c := range []struct {
		name  string
		exprs func(i int) []expr.Any
	}{
		{"dnat", func(i int) []expr.Any { return dnat[i] }},
		{"counter", func(int) []expr.Any { return counter }},
	} {
		b.Run(c.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				k := i % len(chains)
				conn.FlushChain(chains[k])
				conn.AddRule(&nftables.Rule{Table: table, Chain: chains[k], Exprs: c.exprs(k)})
				if err := conn.Flush(); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		// Put the DNAT rules back, so that the next case starts from
		// the same table.
		for k := range chains {
			conn.FlushChain(chains[k])
			conn.AddRule(&nftables.Rule{Table: table, Chain: chains[k], Exprs: dnat[k]})
			if err := conn.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkReplaceServiceRule1k(b *testing.B)  { benchmarkReplaceServiceRule(b, 1000) }
func BenchmarkReplaceServiceRule10k(b *testing.B) { benchmarkReplaceServiceRule(b, 10000) }

func BenchmarkProgrammed10k(b *testing.B) { benchmarkProgrammed(b, 10000) }

func BenchmarkResync1k(b *testing.B)  { benchmarkResync(b, 1000) }
func BenchmarkResync10k(b *testing.B) { benchmarkResync(b, 10000) }

func BenchmarkFullSync1k(b *testing.B)           { benchmarkFullSync(b, 1000) }
func BenchmarkFullSync10k(b *testing.B)          { benchmarkFullSync(b, 10000) }
func BenchmarkOneEndpointChange1k(b *testing.B)  { benchmarkOneEndpointChange(b, 1000) }
func BenchmarkOneEndpointChange10k(b *testing.B) { benchmarkOneEndpointChange(b, 10000) }
