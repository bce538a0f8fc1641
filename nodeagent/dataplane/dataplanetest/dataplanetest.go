// Package dataplanetest holds what every backend's tests share: the
// Service builders (builders.go), the golden scenarios every backend
// renders (scenarios.go) and the check of its golden files, and the model
// and loops of the sync benchmarks, so that the backends are described,
// compared and measured the same way. It is imported by tests only.
package dataplanetest

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from what the test rendered")

// Golden compares got with testdata/<name>.golden, or rewrites the file
// when the test runs with -update.
func Golden(t testing.TB, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("rendered %s differs from %s (rerun with -update if the change is intended):\n%s", name, path, LineDiff(string(want), got))
	}
}

// LineDiff lists the lines only want has ("- ") and those only got has
// ("+ "), each in its text's order.
func LineDiff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		count[l]--
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if count[l] > 0 {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if count[l] < 0 {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// FullSyncs benchmarks full syncs of m by be (which should already hold
// m, for a resync). Besides time and allocations it reports live-MB: the
// live heap after the last sync and a collection, which holds m and
// what the backend keeps between syncs (its state), and so what a
// program serving m keeps at least.
func FullSyncs(b *testing.B, be dataplane.Backend, m *model.Snapshot) {
	for b.Loop() {
		if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/1e6, "live-MB")
	runtime.KeepAlive(be)
	runtime.KeepAlive(m)
}

// EndpointChanges benchmarks incremental syncs after one endpoint of one
// IPv4 service port changed (its tenth endpoint's port, ports in turn);
// be must already hold m, whose ports have ten endpoints or more.
func EndpointChanges(b *testing.B, be dataplane.Backend, m *model.Snapshot) {
	ports := m.Ports[corev1.IPv4Protocol]
	names := model.SortedNames(ports)
	i := 0
	for b.Loop() {
		name := names[i%len(names)]
		sp := *ports[name]
		sp.Endpoints = append([]model.Endpoint(nil), sp.Endpoints...)
		sp.Endpoints[9].Port += 1000
		ports[name] = &sp
		if _, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{name: {}}}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
