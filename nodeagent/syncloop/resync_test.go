package syncloop

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// slowResyncBackend's periodic resyncs read for up to resyncTime, the way
// a verifying backend reads the kernel, and stop when their context ends;
// its other syncs return at once.
type slowResyncBackend struct {
	recordingBackend
	resyncTime time.Duration

	mu2       sync.Mutex
	started   int
	preempted int
	finished  int
}

func (b *slowResyncBackend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	if req.Resync {
		b.mu2.Lock()
		b.started++
		b.mu2.Unlock()
		select {
		case <-ctx.Done():
			b.mu2.Lock()
			b.preempted++
			b.mu2.Unlock()
			return dataplane.Counts{}, ctx.Err()
		case <-time.After(b.resyncTime):
			b.mu2.Lock()
			b.finished++
			b.mu2.Unlock()
		}
	}
	return b.recordingBackend.Sync(ctx, req)
}

func (b *slowResyncBackend) counts() (preempted, finished int) {
	b.mu2.Lock()
	defer b.mu2.Unlock()
	return b.preempted, b.finished
}

// TestResyncYieldsToChange: a change signalled while a periodic resync
// runs preempts it, is synced on its own (partial) without waiting for
// the resync's reading to end, and the resync runs again afterwards; a
// preempted resync is no failure (no full sync follows it).
func TestResyncYieldsToChange(t *testing.T) {
	src := newFakeSource()
	be := &slowResyncBackend{resyncTime: time.Hour}
	results := make(chan Result, 100)
	ctx, cancel := context.WithCancel(context.Background())
	l := New(Config{SyncPeriod: 50 * time.Millisecond}, src, be, nil)
	l.OnSync = func(r Result) { results <- r }
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	if r := <-results; !r.Full || r.Resync || r.Err != nil {
		t.Fatalf("first sync: %+v; want a full sync (not a resync) that succeeded", r)
	}
	// The resync is due 50 ms after the first sync and never finishes on
	// its own; a change must get through all the same.
	time.Sleep(150 * time.Millisecond)
	src.change("a")
	var r Result
	select {
	case r = <-results:
	case <-time.After(5 * time.Second):
		t.Fatal("the change was not synced within 5 s: a resync held it up")
	}
	if r.Full || r.Resync || r.Err != nil {
		t.Fatalf("sync after the change: %+v; want a partial sync that succeeded", r)
	}
	if _, ok := be.snapshotLast().Changed[model.ServicePortName{Namespace: "ns", Name: "a"}]; !ok {
		t.Fatal("the partial sync did not carry the change")
	}
	waitFor(t, "the resync to run again after the change", func() bool {
		be.mu2.Lock()
		defer be.mu2.Unlock()
		return be.started >= 2
	})
	if p, _ := be.counts(); p < 1 {
		t.Errorf("preempted resyncs = %d; want at least 1", p)
	}
	for _, s := range func() []dataplane.SyncRequest { s, _ := be.snapshot(); return s }()[1:] {
		if s.Full && !s.Resync {
			t.Fatalf("a full sync followed a preempted resync: preemption was taken for a failure")
		}
	}
}

// TestResyncThatFinishesIsRecorded: a resync that is not preempted is
// recorded as a full sync that repairs drift, and the next one comes a
// SyncPeriod later.
func TestResyncThatFinishesIsRecorded(t *testing.T) {
	src := newFakeSource()
	be := &slowResyncBackend{resyncTime: 10 * time.Millisecond}
	results := make(chan Result, 100)
	ctx, cancel := context.WithCancel(context.Background())
	l := New(Config{SyncPeriod: 100 * time.Millisecond}, src, be, nil)
	l.OnSync = func(r Result) { results <- r }
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	<-results
	for i := range 2 {
		r := <-results
		if !r.Full || !r.Resync || r.Err != nil {
			t.Fatalf("sync %d without changes: %+v; want a periodic resync that succeeded", i+1, r)
		}
	}
	if p, f := be.counts(); p != 0 || f < 2 {
		t.Errorf("preempted %d, finished %d resyncs; want 0 and at least 2", p, f)
	}
}

func (b *recordingBackend) snapshotLast() dataplane.SyncRequest {
	s, _ := b.snapshot()
	return s[len(s)-1]
}

// TestOverdueResyncRunsToItsEnd: changes that keep coming preempt a
// resync for one SyncPeriod at most; then it runs without yielding, and
// the changes that arrived meanwhile are synced right after it.
func TestOverdueResyncRunsToItsEnd(t *testing.T) {
	src := newFakeSource()
	be := &slowResyncBackend{resyncTime: 150 * time.Millisecond}
	const period = 300 * time.Millisecond
	run(t, Config{SyncPeriod: period}, src, be, nil)
	stop := make(chan struct{})
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				src.change("churn")
			}
		}
	}()
	waitFor(t, "a resync that finished despite the churn", func() bool { _, f := be.counts(); return f >= 1 })
	close(stop)
	<-churned
	if p, _ := be.counts(); p == 0 {
		t.Error("no resync was preempted by a change every 20 ms")
	}
	src.change("last")
	waitFor(t, "the last change synced", func() bool {
		s, _ := be.snapshot()
		_, ok := s[len(s)-1].Changed[model.ServicePortName{Namespace: "ns", Name: "last"}]
		return ok
	})
}

// TestResyncIsNotPaced: MinSyncPeriod paces writes, not the periodic
// resync, which starts when it is due even right after a sync (here the
// pacing would hold it for an hour), so that it gets all the time between
// two changes.
func TestResyncIsNotPaced(t *testing.T) {
	src := newFakeSource()
	be := &slowResyncBackend{resyncTime: time.Millisecond}
	run(t, Config{MinSyncPeriod: time.Hour, SyncPeriod: 50 * time.Millisecond}, src, be, nil)
	waitFor(t, "a resync within the hour of MinSyncPeriod", func() bool { _, f := be.counts(); return f >= 2 })
}
