// Package syncloop drives a dataplane from the service model: it waits for
// changes, paces syncs (never more often than minSyncPeriod), resyncs
// every syncPeriod to repair drift, and retries failures with backoff. A
// failed sync leaves the kernel as it was (each sync is one transaction) and
// the next attempt is a full one, so no change is ever lost.
//
// The periodic resync must not hold changes up: it waits until no change
// is pending and is preempted by the next one (see Loop.Run), and the
// backends do it as verify-and-repair (dataplane.SyncRequest.Resync), so
// a change never waits for a rewrite of the whole ruleset it did not ask
// for. Which work is a resync, and when it yields, is decided here once;
// the backends only verify and repair.
package syncloop

import (
	"context"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// Source is where the loop takes the model from (a *model.Tracker).
type Source interface {
	Changed() <-chan struct{}
	Snapshot() (*model.Snapshot, model.ChangeSet)
	// Synced says that no sync runs until the next Snapshot: the loop
	// calls it whenever it is about to wait, so that work the source
	// does for the next change (the Tracker's copy of its model) does
	// not run beside a sync.
	Synced()
}

// Config paces the loop.
type Config struct {
	// MinSyncPeriod is the least time between the starts of two syncs.
	MinSyncPeriod time.Duration
	// SyncPeriod is the time between two full resyncs.
	SyncPeriod time.Duration
	// MaxBackoff bounds the wait before retrying a failed sync.
	MaxBackoff time.Duration
}

// Result is the outcome of one sync, handed to Loop.OnSync.
type Result struct {
	Full bool
	// Resync says the sync was a periodic resync (Full is set too).
	Resync   bool
	Start    time.Time
	Duration time.Duration
	Counts   dataplane.Counts
	Err      error
	// Warning is what a sync that succeeded left alone
	// (dataplane.Warning); such a sync is not retried.
	Warning error
}

// Loop runs syncs of one backend from one source.
type Loop struct {
	cfg     Config
	source  Source
	backend dataplane.Backend
	metrics *Metrics
	// OnSync, if set, is called after every sync attempt.
	OnSync func(Result)

	// triggers are the trigger times of the changes taken from the source
	// and not yet synced (only touched by Run).
	triggers []model.Trigger

	mu          sync.Mutex
	pendingFrom time.Time // when the oldest change not yet synced arrived
	lastSuccess time.Time
}

// New returns a loop; metrics may be nil. The loop records the network
// programming latency (and, like kube-proxy, that a sync is queued when it
// starts); sync durations are recorded with
// Metrics.RecordSync by whoever knows which backend serves traffic (the
// agent, from the Fanout's primary syncs).
func New(cfg Config, source Source, backend dataplane.Backend, metrics *Metrics) *Loop {
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	return &Loop{cfg: cfg, source: source, backend: backend, metrics: metrics}
}

// Run syncs until ctx ends. The first sync is a full one.
//
// Changes come first. A periodic resync (every SyncPeriod) waits for a
// moment without pending changes, and is preemptible: it runs with a
// context that ends as soon as a change is signalled, so a backend that
// verifies the kernel (dataplane.SyncRequest.Resync) stops reading, the
// change is synced at once, and the resync runs again afterwards. A
// resync overdue by another SyncPeriod runs to its end. A resync does not
// count for MinSyncPeriod: it normally writes nothing, and must not delay
// the next change. A full sync the loop needs for itself (the first one,
// or after a failure) is not preempted: the changes it takes are in it.
func (l *Loop) Run(ctx context.Context) {
	needFull := true   // the next sync rewrites everything
	resyncDue := false // a periodic resync waits for a moment without changes
	var dueSince time.Time
	signalled := false // a change was signalled while a resync ran
	lastFull := time.Time{}
	lastStart := time.Time{}
	backoff := time.Duration(0)
	l.markPending(time.Now())
	if l.metrics != nil {
		l.metrics.Queued()
	}

	for {
		l.source.Synced()
		// Wait for a reason to sync: a change, the resync timer, or a retry.
		if !needFull && !resyncDue && !signalled && backoff == 0 {
			resync := time.NewTimer(time.Until(lastFull.Add(l.cfg.SyncPeriod)))
			select {
			case <-ctx.Done():
				resync.Stop()
				return
			case <-l.source.Changed():
				l.markPending(time.Now())
			case <-resync.C:
				resyncDue, dueSince = true, time.Now()
				l.markPending(dueSince)
			}
			resync.Stop()
		}
		signalled = false
		// Pace writes: never start syncs closer than MinSyncPeriod (or the
		// backoff). A due resync starts at once when no change is
		// pending: it is read-only unless it finds drift, and the time
		// between two changes is all it gets.
		var snap *model.Snapshot
		var changes model.ChangeSet
		if resyncDue && !needFull && backoff == 0 {
			snap, changes = l.take(nil)
		}
		if snap == nil || len(changes) > 0 {
			if !l.pace(ctx, lastStart, backoff) {
				return
			}
			snap, changes = l.take(changes)
		}
		if !resyncDue && time.Since(lastFull) >= l.cfg.SyncPeriod {
			resyncDue, dueSince = true, time.Now()
		}
		var res Result
		switch {
		case needFull || len(changes) > 0:
			lastStart = time.Now()
			res = l.syncOnce(ctx, dataplane.SyncRequest{Model: snap, Changed: changes, Full: needFull})
		case resyncDue:
			// Changes preempt a resync for one SyncPeriod; after that it
			// runs to its end, so that constant churn cannot keep drift
			// from being repaired.
			var preempted bool
			res, preempted, signalled = l.resync(ctx, snap, time.Since(dueSince) < l.cfg.SyncPeriod)
			if preempted {
				continue
			}
		default:
			// The signal's changes were taken by the previous sync.
			l.mu.Lock()
			l.pendingFrom = time.Time{}
			l.mu.Unlock()
			continue
		}
		if res.Err != nil {
			// The kernel kept its previous state; the changes just taken
			// are covered by the full sync that the retry does.
			needFull = true
			backoff = nextBackoff(backoff, l.cfg.MaxBackoff)
			klog.ErrorS(res.Err, "Sync of proxy rules failed; retrying with a full sync", "backend", l.backend.Mode(), "retryIn", backoff)
			continue
		}
		backoff = 0
		if res.Full {
			lastFull = res.Start
			resyncDue = false
		}
		needFull = false
	}
}

// pace waits until MinSyncPeriod after lastStart, and at least backoff;
// false when ctx ended first.
func (l *Loop) pace(ctx context.Context, lastStart time.Time, backoff time.Duration) bool {
	wait := time.Until(lastStart.Add(l.cfg.MinSyncPeriod))
	if backoff > wait {
		wait = backoff
	}
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// take takes the model and the changes since the last take from the
// source, with the changes already taken (nil for none).
func (l *Loop) take(taken model.ChangeSet) (*model.Snapshot, model.ChangeSet) {
	snap, changes := l.source.Snapshot()
	l.triggers = append(l.triggers, snap.Triggers...)
	for name := range taken {
		if changes == nil {
			changes = model.ChangeSet{}
		}
		changes[name] = struct{}{}
	}
	return snap, changes
}

// resync runs a periodic resync of snap, preempted by the first change
// signalled meanwhile if preemptible. It reports whether the resync was
// preempted (the backend stopped; nothing is recorded) and whether a
// change was signalled (the resync may have finished all the same).
func (l *Loop) resync(ctx context.Context, snap *model.Snapshot, preemptible bool) (res Result, preempted, signalled bool) {
	req := dataplane.SyncRequest{Model: snap, Full: true, Resync: true}
	if !preemptible {
		klog.V(2).InfoS("Periodic resync overdue; not yielding to changes this time", "backend", l.backend.Mode())
		return l.syncOnce(ctx, req), false, false
	}
	rctx, cancel := context.WithCancel(ctx)
	// arrived carries when a change was signalled (zero: none was).
	arrived := make(chan time.Time, 1)
	go func() {
		select {
		case <-l.source.Changed():
			now := time.Now()
			l.markPending(now)
			cancel()
			arrived <- now
		case <-rctx.Done():
			arrived <- time.Time{}
		}
	}()
	start := time.Now()
	counts, err := l.backend.Sync(rctx, req)
	preempted = dataplane.Preempted(rctx, req, err) && ctx.Err() == nil
	cancel()
	at := <-arrived
	signalled = !at.IsZero()
	if preempted {
		klog.V(2).InfoS("Periodic resync preempted by a change; resyncing after it", "backend", l.backend.Mode(), "after", time.Since(start), "yieldedIn", time.Since(at))
		return Result{}, true, signalled
	}
	return l.record(req, start, counts, err), false, signalled
}

// syncOnce runs one sync and records its outcome.
func (l *Loop) syncOnce(ctx context.Context, req dataplane.SyncRequest) Result {
	start := time.Now()
	counts, err := l.backend.Sync(ctx, req)
	return l.record(req, start, counts, err)
}

// record makes the Result of a sync that started at start, records it and
// hands it to OnSync.
func (l *Loop) record(req dataplane.SyncRequest, start time.Time, counts dataplane.Counts, err error) Result {
	kind := "partial"
	if req.Full {
		kind = "full"
	}
	res := Result{Full: req.Full, Resync: req.Resync, Start: start, Duration: time.Since(start), Counts: counts, Err: err}
	if _, rest := dataplane.SplitWarnings(err); err != nil && rest == nil {
		res.Err, res.Warning = nil, err
		klog.InfoS("Synced proxy rules, leaving other programs' objects alone", "backend", l.backend.Mode(), "warning", err.Error())
	}
	if res.Err == nil {
		l.mu.Lock()
		if l.metrics != nil {
			from := l.pendingFrom
			if len(req.Changed) == 0 {
				from = time.Time{}
			}
			l.metrics.RecordProgrammed(from, l.triggers)
		}
		l.triggers = nil
		l.pendingFrom = time.Time{}
		l.lastSuccess = time.Now()
		l.mu.Unlock()
		klog.V(2).InfoS("Synced proxy rules", "kind", kind, "resync", req.Resync, "duration", res.Duration, "changed", len(req.Changed), "services", counts.Services, "endpoints", counts.Endpoints)
	}
	if l.OnSync != nil {
		l.OnSync(res)
	}
	return res
}

func (l *Loop) markPending(now time.Time) {
	l.mu.Lock()
	if l.pendingFrom.IsZero() {
		l.pendingFrom = now
	}
	l.mu.Unlock()
}

// Healthy reports an error when work has been waiting longer than
// timeout: the loop has stopped making progress.
func (l *Loop) Healthy(timeout time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pendingFrom.IsZero() || time.Since(l.pendingFrom) < timeout {
		return nil
	}
	return &StalledError{Since: l.pendingFrom, LastSuccess: l.lastSuccess}
}

// StalledError says the loop has had work waiting for too long.
type StalledError struct {
	Since       time.Time
	LastSuccess time.Time
}

func (e *StalledError) Error() string {
	last := "never"
	if !e.LastSuccess.IsZero() {
		last = e.LastSuccess.Format(time.RFC3339)
	}
	return "proxy rules not synced since changes arrived at " + e.Since.Format(time.RFC3339) + "; last successful sync: " + last
}

func nextBackoff(cur, limit time.Duration) time.Duration {
	if cur == 0 {
		return 500 * time.Millisecond
	}
	if cur*2 > limit {
		return limit
	}
	return cur * 2
}
