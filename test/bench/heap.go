package bench

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// goHeap reads a Go program's heap: its figures from its metrics page
// (client_golang's Go collector), its profiles from its net/http/pprof
// handlers (the agent's --profiling and kube-proxy's enableProfiling
// serve them on the metrics address, the operator on its pprof address).
type goHeap struct {
	client *http.Client
	// pprof is "http://host:port", before /debug/pprof/; metrics the
	// metrics page's URL.
	pprof, metrics string
}

// memStats are the two figures of runtime.MemStats the benchmark
// reports, as the metrics page gives them.
type memStats struct {
	// HeapInuse is the bytes in spans holding objects: the heap the
	// process holds now, live objects and garbage not yet collected
	// (go_memstats_heap_inuse_bytes).
	HeapInuse uint64
	// TotalAlloc is every byte allocated since the process started
	// (go_memstats_alloc_bytes_total).
	TotalAlloc uint64
}

// stats reads HeapInuse and TotalAlloc from the metrics page: cheap for
// the program, unlike a profile, so sampling it does not slow what is
// measured.
func (h goHeap) stats(ctx context.Context) (memStats, error) {
	body, err := httpGet(ctx, h.client, h.metrics)
	if err != nil {
		return memStats{}, err
	}
	families, err := metricFamilies(bytes.NewReader(body))
	if err != nil {
		return memStats{}, err
	}
	value := func(name string) (uint64, error) {
		f, ok := families[name]
		if !ok || len(f.GetMetric()) != 1 {
			return 0, fmt.Errorf("%s: no %s", h.metrics, name)
		}
		m := f.GetMetric()[0]
		switch {
		case m.GetGauge() != nil:
			return uint64(m.GetGauge().GetValue()), nil
		case m.GetCounter() != nil:
			return uint64(m.GetCounter().GetValue()), nil
		}
		return 0, fmt.Errorf("%s: %s is a %s", h.metrics, name, f.GetType())
	}
	var s memStats
	if s.HeapInuse, err = value("go_memstats_heap_inuse_bytes"); err != nil {
		return memStats{}, err
	}
	if s.TotalAlloc, err = value("go_memstats_alloc_bytes_total"); err != nil {
		return memStats{}, err
	}
	return s, nil
}

// save writes the named profile ("heap", "allocs"), the form go tool
// pprof reads, to path.
func (h goHeap) save(ctx context.Context, name, path string) error {
	body, err := httpGet(ctx, h.client, h.pprof+"/debug/pprof/"+name)
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// watch samples HeapInuse every interval until ctx ends, and, when path
// is set, saves a heap profile there each time it reaches a new peak:
// the profile of the heap at its largest, where the peak RSS comes from
// (writing a profile costs the program CPU: the operator's run is long
// enough not to mind, a program's first sync is not). It sends the peak,
// in bytes, when ctx ends.
func (h goHeap) watch(ctx context.Context, interval time.Duration, path string) <-chan uint64 {
	var onPeak func()
	if path != "" {
		onPeak = func() { _ = h.save(ctx, "heap", path) }
	}
	return watchPeak(ctx, interval, func() (uint64, error) {
		s, err := h.stats(ctx)
		return s.HeapInuse, err
	}, onPeak)
}

// watchPeak calls sample every interval until ctx ends, then sends the
// largest value it returned (a failed sample is skipped). onPeak, when
// set, runs each time a sample is a new largest.
func watchPeak[T cmp.Ordered](ctx context.Context, interval time.Duration, sample func() (T, error), onPeak func()) <-chan T {
	out := make(chan T, 1)
	go func() {
		var peak T
		defer func() { out <- peak }()
		for {
			if v, err := sample(); err == nil && v > peak {
				peak = v
				if onPeak != nil {
					onPeak()
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
	}()
	return out
}

// httpGet is the body of a GET of url through c (nil: the default
// client), an error unless it answers 200 OK.
func httpGet(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	if c == nil {
		c = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.512s", url, resp.Status, body)
	}
	return body, err
}

// FuncBytes is one line of a profile's top: a function and the bytes of
// the samples whose innermost frame it is (pprof's "flat").
type FuncBytes struct {
	Func  string
	Bytes int64
}

// readProfile reads the profile at path (go tool pprof's format).
func readProfile(path string) (*profile.Profile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := profile.Parse(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// topFunctions returns the n functions of p with the most flat bytes of
// the sample type (inuse_space, alloc_space), the way `go tool pprof -top
// -sample_index=<type>` lists them, and the total of that sample type.
func topFunctions(p *profile.Profile, sampleType string, n int) ([]FuncBytes, int64, error) {
	idx := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == sampleType })
	if idx < 0 {
		return nil, 0, fmt.Errorf("no sample type %s in the profile", sampleType)
	}
	flat := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[idx]
		total += v
		name := "?"
		if len(s.Location) > 0 && len(s.Location[0].Line) > 0 {
			// A location's lines run from the innermost inlined call out.
			name = s.Location[0].Line[0].Function.Name
		}
		flat[name] += v
	}
	top := make([]FuncBytes, 0, len(flat))
	for f, v := range flat {
		top = append(top, FuncBytes{Func: f, Bytes: v})
	}
	slices.SortFunc(top, func(a, b FuncBytes) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), strings.Compare(a.Func, b.Func))
	})
	return top[:min(n, len(top))], total, nil
}
