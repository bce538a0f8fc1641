package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// retained keeps what retainHeap allocates alive until the test reads it.
var retained [][]byte

// retainHeap allocates n MiB in pieces of 1 MiB and keeps them: the heap
// profile names this function as where they were allocated.
//
//go:noinline
func retainHeap(n int) {
	for range n {
		retained = append(retained, make([]byte, 1<<20))
	}
}

// TestGoHeapReadsThisProcess serves this test process's own metrics
// (client_golang's Go collector, as the agent's) and pprof handlers (as
// the agent's --profiling does) and reads its heap through them: the
// in-use and allocated figures grow by what the test allocates, the
// watcher saves a profile at the peak, and the profile's top names the
// allocating function.
func TestGoHeapReadsThisProcess(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	h := goHeap{pprof: srv.URL, metrics: srv.URL + "/metrics"}
	ctx := context.Background()

	before, err := h.stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	retainHeap(32)
	defer func() { retained = nil }()
	runtime.GC() // the heap profile shows the heap as of the last collection
	after, err := h.stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew < 32<<20 {
		t.Errorf("TotalAlloc grew by %d bytes over an allocation of 32 MiB", grew)
	}
	if after.HeapInuse < 32<<20 {
		t.Errorf("HeapInuse %d bytes with 32 MiB retained", after.HeapInuse)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "heap-peak.pprof")
	wctx, stop := context.WithCancel(ctx)
	peak := h.watch(wctx, 10*time.Millisecond, path)
	time.Sleep(50 * time.Millisecond)
	stop()
	if got := <-peak; got < 32<<20 {
		t.Errorf("watched peak %d bytes with 32 MiB retained", got)
	}
	peakProfile, err := readProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	top, total, err := topFunctions(peakProfile, "inuse_space", 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(top) == 0 || !strings.HasSuffix(top[0].Func, ".retainHeap") || top[0].Bytes < 16<<20 || total < top[0].Bytes {
		t.Errorf("heap profile's top (of %d bytes) = %+v, want retainHeap first with about 32 MiB", total, top)
	}

	allocs := filepath.Join(dir, "allocs.pprof")
	if err := h.save(ctx, "allocs", allocs); err != nil {
		t.Fatal(err)
	}
	allocProfile, err := readProfile(allocs)
	if err != nil {
		t.Fatal(err)
	}
	// Allocations count from the process's start: the package's other
	// tests may have allocated more than retainHeap, so it is looked for
	// among every function, not only the top few.
	if top, _, err := topFunctions(allocProfile, "alloc_space", 1<<20); err != nil || !slices.ContainsFunc(top, func(f FuncBytes) bool { return strings.HasSuffix(f.Func, ".retainHeap") && f.Bytes >= 16<<20 }) {
		t.Errorf("allocation profile = %+v, %v; want retainHeap in it with about 32 MiB", top, err)
	}
	if _, err := (goHeap{pprof: srv.URL, metrics: srv.URL + "/debug/pprof/"}).stats(ctx); err == nil {
		t.Error("a page without the Go collector's figures read as heap figures")
	}
	if _, _, err := topFunctions(allocProfile, "no_such_type", 5); err == nil {
		t.Error("a sample type the profile lacks gave a top")
	}
	if err := h.save(ctx, "nonesuch", filepath.Join(dir, "x")); err == nil {
		t.Error("an unknown profile was saved")
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
		t.Error("a failed save wrote a file")
	}
}

// TestTopFunctionsFlat checks the top against a profile built here: bytes
// go to each sample's innermost function (the first line of its first
// location), summed, largest first, ties by name, cut to n.
func TestTopFunctionsFlat(t *testing.T) {
	fn := func(name string) *profile.Location {
		return &profile.Location{Line: []profile.Line{{Function: &profile.Function{Name: name}}}}
	}
	a, b, c, outer := fn("a"), fn("b"), fn("c"), fn("outer")
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "inuse_objects", Unit: "count"}, {Type: "inuse_space", Unit: "bytes"}},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{a, outer}, Value: []int64{1, 100}},
			{Location: []*profile.Location{b, outer}, Value: []int64{1, 300}},
			{Location: []*profile.Location{a}, Value: []int64{1, 250}},
			{Location: []*profile.Location{c, a}, Value: []int64{1, 350}},
			{Location: []*profile.Location{outer}, Value: []int64{9, 1}},
		},
	}
	top, total, err := topFunctions(p, "inuse_space", 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []FuncBytes{{"a", 350}, {"c", 350}, {"b", 300}}
	if total != 1001 || len(top) != 3 || top[0] != want[0] || top[1] != want[1] || top[2] != want[2] {
		t.Errorf("top = %+v of %d, want %+v of 1001", top, total, want)
	}
}
