package syncloop

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// fakeSource hands out a fixed model and change sets named by the test.
type fakeSource struct {
	mu      sync.Mutex
	changed chan struct{}
	pending model.ChangeSet
	// snapshots counts the Snapshots taken; synced holds that count at
	// each call of Synced.
	snapshots int
	synced    []int
}

func newFakeSource() *fakeSource {
	return &fakeSource{changed: make(chan struct{}, 1), pending: model.ChangeSet{}}
}

func (s *fakeSource) change(name string) {
	s.mu.Lock()
	s.pending[model.ServicePortName{Namespace: "ns", Name: name}] = struct{}{}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *fakeSource) Changed() <-chan struct{} { return s.changed }

func (s *fakeSource) Snapshot() (*model.Snapshot, model.ChangeSet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.pending
	s.pending = model.ChangeSet{}
	s.snapshots++
	select { // like model.Tracker: taking the changes takes the signal
	case <-s.changed:
	default:
	}
	return &model.Snapshot{}, c
}

func (s *fakeSource) Synced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synced = append(s.synced, s.snapshots)
}

func (s *fakeSource) syncedAt() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.synced...)
}

// recordingBackend records each sync request and fails the first failN.
type recordingBackend struct {
	mu    sync.Mutex
	syncs []dataplane.SyncRequest
	times []time.Time
	failN int
}

func (b *recordingBackend) Mode() string { return "nftables" }
func (b *recordingBackend) Sync(_ context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.syncs = append(b.syncs, req)
	b.times = append(b.times, time.Now())
	if b.failN > 0 {
		b.failN--
		return dataplane.Counts{}, errors.New("injected failure")
	}
	return dataplane.Counts{Services: 1, Endpoints: 2}, nil
}
func (b *recordingBackend) Programmed(context.Context) (dataplane.Counts, error) {
	return dataplane.Counts{}, nil
}
func (b *recordingBackend) Cleanup(context.Context) ([]string, error) { return nil, nil }

func (b *recordingBackend) snapshot() ([]dataplane.SyncRequest, []time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]dataplane.SyncRequest(nil), b.syncs...), append([]time.Time(nil), b.times...)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func run(t *testing.T, cfg Config, src Source, be dataplane.Backend, m *Metrics) *Loop {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := New(cfg, src, be, m)
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

func TestFirstSyncIsFullThenPartialWithChanges(t *testing.T) {
	src, be := newFakeSource(), &recordingBackend{}
	run(t, Config{SyncPeriod: time.Hour}, src, be, nil)
	waitFor(t, "first sync", func() bool { s, _ := be.snapshot(); return len(s) == 1 })
	src.change("a")
	waitFor(t, "second sync", func() bool { s, _ := be.snapshot(); return len(s) == 2 })
	s, _ := be.snapshot()
	if !s[0].Full || s[1].Full {
		t.Fatalf("want full then partial, got full=%v, %v", s[0].Full, s[1].Full)
	}
	if _, ok := s[1].Changed[model.ServicePortName{Namespace: "ns", Name: "a"}]; !ok || len(s[1].Changed) != 1 {
		t.Fatalf("partial sync did not carry exactly the change: %v", s[1].Changed)
	}
}

// The loop tells its source when a sync of the last Snapshot has ended,
// after each sync and never during one (the Tracker then copies its
// model for the next change).
func TestSyncedAfterEachSync(t *testing.T) {
	src := newFakeSource()
	be := &syncedCheckingBackend{src: src}
	run(t, Config{SyncPeriod: time.Hour}, src, be, nil)
	waitFor(t, "first sync", func() bool { s, _ := be.snapshot(); return len(s) == 1 })
	src.change("a")
	waitFor(t, "second sync", func() bool { s, _ := be.snapshot(); return len(s) == 2 })
	waitFor(t, "Synced after the second sync", func() bool { return slices.Contains(src.syncedAt(), 2) })
	if got := src.syncedAt(); !slices.Contains(got, 1) {
		t.Errorf("Synced was called after %v Snapshots, want after the first sync's too", got)
	}
	if be.during.Load() {
		t.Error("Synced was called while a sync ran")
	}
}

// syncedCheckingBackend is a recordingBackend that notes a call of its
// source's Synced while a Sync runs.
type syncedCheckingBackend struct {
	recordingBackend
	src    *fakeSource
	during atomic.Bool
}

func (b *syncedCheckingBackend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	before := len(b.src.syncedAt())
	time.Sleep(20 * time.Millisecond)
	c, err := b.recordingBackend.Sync(ctx, req)
	if len(b.src.syncedAt()) != before {
		b.during.Store(true)
	}
	return c, err
}

func TestMinSyncPeriodCoalescesChanges(t *testing.T) {
	src, be := newFakeSource(), &recordingBackend{}
	const minPeriod = 300 * time.Millisecond
	run(t, Config{MinSyncPeriod: minPeriod, SyncPeriod: time.Hour}, src, be, nil)
	waitFor(t, "first sync", func() bool { s, _ := be.snapshot(); return len(s) == 1 })
	for _, n := range []string{"a", "b", "c", "d"} {
		src.change(n)
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, "coalesced sync", func() bool { s, _ := be.snapshot(); return len(s) >= 2 })
	time.Sleep(minPeriod) // any further sync would show up now
	s, times := be.snapshot()
	if len(s) != 2 {
		t.Fatalf("4 quick changes became %d syncs after the first; want 1", len(s)-1)
	}
	if len(s[1].Changed) != 4 {
		t.Errorf("coalesced sync carried %d changes, want 4", len(s[1].Changed))
	}
	if gap := times[1].Sub(times[0]); gap < minPeriod {
		t.Errorf("syncs %s apart, want at least minSyncPeriod %s", gap, minPeriod)
	}
}

func TestFailedSyncRetriesAsFull(t *testing.T) {
	src, be := newFakeSource(), &recordingBackend{}
	run(t, Config{SyncPeriod: time.Hour}, src, be, nil)
	waitFor(t, "first sync", func() bool { s, _ := be.snapshot(); return len(s) == 1 })
	be.mu.Lock()
	be.failN = 1
	be.mu.Unlock()
	src.change("a")
	waitFor(t, "retry", func() bool { s, _ := be.snapshot(); return len(s) == 3 })
	s, _ := be.snapshot()
	if s[1].Full || !s[2].Full {
		t.Fatalf("want the failed partial sync retried as a full one, got full=%v then %v", s[1].Full, s[2].Full)
	}
}

func TestRecordSync(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	m.RecordSync(true, 2*time.Second, dataplane.Counts{Services: 3, Endpoints: 7}, nil)
	m.RecordSync(false, 10*time.Millisecond, dataplane.Counts{Services: 3, Endpoints: 6}, nil)
	m.RecordSync(false, time.Second, dataplane.Counts{}, errors.New("kernel said no"))
	if got := testutil.CollectAndCount(m.SyncDuration); got != 2 {
		t.Errorf("sync duration series = %d, want 2 (full and partial)", got)
	}
	if got := testutil.ToFloat64(m.SyncFailures.WithLabelValues("partial")); got != 1 {
		t.Errorf("failure counter = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.ProgrammedEndpoints); got != 6 {
		t.Errorf("programmed endpoints gauge = %v, want 6 (the last successful sync's)", got)
	}
}

func TestPeriodicFullResync(t *testing.T) {
	src, be := newFakeSource(), &recordingBackend{}
	run(t, Config{SyncPeriod: 100 * time.Millisecond}, src, be, nil)
	waitFor(t, "three syncs", func() bool { s, _ := be.snapshot(); return len(s) >= 3 })
	s, _ := be.snapshot()
	for i, r := range s[:3] {
		if !r.Full {
			t.Errorf("sync %d without changes was not a full resync", i)
		}
	}
}

func TestHealthyFailsWhenSyncsStall(t *testing.T) {
	src := newFakeSource()
	block := make(chan struct{})
	be := &blockingBackend{release: block}
	l := run(t, Config{SyncPeriod: time.Hour}, src, be, nil)
	defer close(block)
	time.Sleep(50 * time.Millisecond)
	if err := l.Healthy(time.Hour); err != nil {
		t.Fatalf("healthy within the timeout, got %v", err)
	}
	if err := l.Healthy(10 * time.Millisecond); err == nil {
		t.Fatal("a sync stuck for 50ms must be unhealthy with a 10ms timeout")
	}
}

// blockingBackend never finishes a sync until released.
type blockingBackend struct {
	recordingBackend
	release chan struct{}
}

func (b *blockingBackend) Sync(ctx context.Context, _ dataplane.SyncRequest) (dataplane.Counts, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return dataplane.Counts{}, nil
}

// warningBackend's syncs program everything but leave something alone.
type warningBackend struct{ recordingBackend }

type leftAlone struct{}

func (leftAlone) Error() string       { return "left alone: tcp/198.18.0.1:80" }
func (leftAlone) LeftAlone() []string { return []string{"tcp/198.18.0.1:80"} }

func (b *warningBackend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	c, _ := b.recordingBackend.Sync(ctx, req)
	return c, leftAlone{}
}

// TestWarningIsNotRetried: a sync that only warns is done: the loop does
// not retry it, and hands the warning on apart from the error.
func TestWarningIsNotRetried(t *testing.T) {
	src, be := newFakeSource(), &warningBackend{}
	results := make(chan Result, 10)
	ctx, cancel := context.WithCancel(context.Background())
	l := New(Config{SyncPeriod: time.Hour, MaxBackoff: 10 * time.Millisecond}, src, be, nil)
	l.OnSync = func(r Result) { results <- r }
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	r := <-results
	if r.Err != nil || r.Warning == nil || !r.Full {
		t.Fatalf("first sync: %+v; want a full sync that succeeded with a warning", r)
	}
	time.Sleep(200 * time.Millisecond) // a retry would show up now
	if s, _ := be.snapshot(); len(s) != 1 {
		t.Errorf("%d syncs; want the one", len(s))
	}
}
