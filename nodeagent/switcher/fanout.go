package switcher

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// Fanout is the dataplane.Backend the sync loop drives: it syncs every
// backend the node holds at the moment, the serving one (the primary)
// first. Outside a switch it holds one backend; during a switch the old
// and the new one, so the old keeps following Service changes while the
// new is programmed and verified. It remembers the last model, so a backend
// added in the middle starts from exactly what the others have.
//
// A switch's steps come before the periodic resync: while one runs, a
// resync is skipped, and a step that begins stops the resync running (see
// step). Verifying a large node takes long (iptables-nft at 10 000
// services: 24 s, every sync period), and a step would otherwise wait
// for it, and Check read again after it.
type Fanout struct {
	mu      sync.Mutex
	members []*member
	// keys maps each member's mode to the key of its settings; it is
	// replaced under mu whenever members change and read without it
	// (Keys), so that a status report neither waits for a sync nor stops
	// a periodic resync.
	keys    atomic.Pointer[map[v1alpha1.ProxyMode]string]
	primary v1alpha1.ProxyMode
	// model is the last model synced; it is written under mu and read
	// without it (Model), so that a switch's probes do not wait for a sync.
	model atomic.Pointer[model.Snapshot]
	ready chan struct{}
	// served is the primary's counts after its last successful sync: what
	// a skipped resync returns.
	served atomic.Pointer[dataplane.Counts]
	// afterSync runs after every successful sync of the primary and
	// after Add without one, under the lock (see SetAfterSync).
	afterSync func(ctx context.Context, snap *model.Snapshot, changed model.ChangeSet, full bool)
	// onPrimary receives every sync of the primary (of every member
	// while there is none: on a node that served no mode, the mode being
	// programmed is what will serve), and the last one of a member that
	// replaces another as primary.
	onPrimary func(PrimarySync)
	// adding serialises Add; joining, while Add fully syncs a new mode's
	// member without the lock, gathers what the members' syncs meanwhile
	// changed, for the member to catch up on before it joins.
	adding  sync.Mutex
	joining *joining
	// stepMu guards steps, the switch steps running, and cancelResync,
	// which stops the periodic resync running (nil when none is).
	stepMu       sync.Mutex
	steps        int
	cancelResync context.CancelFunc
	// collect follows every full sync but the periodic resyncs
	// (collectInBackground).
	collect func()
}

// step begins a switch step and returns the function that ends it. It
// stops the periodic resync that is running, whose members stop reading
// the kernel as their ctx ends (a repair already writing finishes), and
// no resync runs until the step ends: the step waits for change syncs
// only, and Check's read is not made void by a resync.
func (f *Fanout) step() (end func()) {
	f.stepMu.Lock()
	f.steps++
	if f.cancelResync != nil {
		f.cancelResync()
	}
	f.stepMu.Unlock()
	return func() {
		f.stepMu.Lock()
		f.steps--
		f.stepMu.Unlock()
	}
}

// resyncContext returns the context a periodic resync runs with, which
// ends with ctx or when a switch step begins, and the function to call
// when the resync is over; ok is false while a step runs.
func (f *Fanout) resyncContext(ctx context.Context) (rctx context.Context, over func(), ok bool) {
	f.stepMu.Lock()
	defer f.stepMu.Unlock()
	if f.steps > 0 {
		return nil, nil, false
	}
	rctx, cancel := context.WithCancel(ctx)
	f.cancelResync = cancel
	return rctx, func() {
		f.stepMu.Lock()
		f.cancelResync = nil
		f.stepMu.Unlock()
		cancel()
	}, true
}

// servedCounts is what the primary's last successful sync programmed.
func (f *Fanout) servedCounts() dataplane.Counts {
	if c := f.served.Load(); c != nil {
		return *c
	}
	return dataplane.Counts{}
}

// joining is what the syncs during an Add changed: the ports in changed,
// or everything (full).
type joining struct {
	changed model.ChangeSet
	full    bool
}

// note adds a sync's changes.
func (j *joining) note(req dataplane.SyncRequest) {
	switch {
	case req.Resync:
		// A periodic resync carries no change: the loop syncs pending
		// changes before it resyncs.
	case req.Full:
		j.full = true
	default:
		for name := range req.Changed {
			j.changed[name] = struct{}{}
		}
	}
}

// PrimarySync is one sync of the primary (the serving backend).
type PrimarySync struct {
	Mode     v1alpha1.ProxyMode
	Time     time.Time
	Duration time.Duration
	// Full says the sync rewrote everything (false: only changed ports).
	Full   bool
	Counts dataplane.Counts
	Err    error
	// Warning, when Err is nil, is what the sync left alone
	// (dataplane.Warning): the sync is done, and the warning reported.
	Warning error
}

// SetOnPrimary sets the function that receives the primary's syncs (for
// status); it is called with the lock held, so it must not call back.
func (f *Fanout) SetOnPrimary(fn func(PrimarySync)) {
	f.mu.Lock()
	f.onPrimary = fn
	f.mu.Unlock()
}

// syncMember syncs one member and records the outcome. A sync that only
// warns (dataplane.Warning) succeeded: its warning is returned apart.
func (f *Fanout) syncMember(ctx context.Context, m *member, req dataplane.SyncRequest) (warning, err error) {
	start := time.Now()
	c, err := m.b.Sync(ctx, req)
	return f.record(ctx, m, req, start, c, err)
}

// record records the outcome of m's sync req, started at start, which
// returned c and err; see syncMember. The lock must be held.
func (f *Fanout) record(ctx context.Context, m *member, req dataplane.SyncRequest, start time.Time, c dataplane.Counts, err error) (warning, _ error) {
	if dataplane.Preempted(ctx, req, err) {
		// A periodic resync that yielded to a change: not a sync, nothing
		// to record; the loop runs it again.
		return nil, err
	}
	if req.Full && !req.Resync {
		f.collect()
	}
	if _, rest := dataplane.SplitWarnings(err); rest == nil {
		warning, err = err, nil
	}
	m.syncs++
	m.last = PrimarySync{Mode: m.mode, Time: start, Duration: time.Since(start), Full: req.Full, Counts: c, Err: err, Warning: warning}
	if err != nil {
		m.full = true
	} else {
		m.counts, m.valid, m.full = c, true, false
	}
	if (m.mode == f.primary || f.primary == "") && f.onPrimary != nil {
		f.onPrimary(m.last)
	}
	return warning, err
}

// collectInBackground starts a garbage collection in the background: the
// Fanout's collect, which follows every full sync but the periodic
// resyncs. A full sync renders the whole ruleset and its transaction (at
// 10 000 services some 100 MB allocated, tens of them live at once),
// garbage once it returns. Go's collector sets its next heap goal at
// twice the heap it found live, and a collection during the sync finds
// those structures live: the goal it set (200 MB at 10 000 services,
// against 78 MB live once the sync was over) is what the heap then grew
// to, the agent's peak RSS. Collected when the sync is over, the goal is
// set from what stays. In the background, so that the changes waiting
// behind the sync do not wait for it too.
func collectInBackground() { go runtime.GC() }

type member struct {
	mode v1alpha1.ProxyMode
	b    dataplane.Backend
	key  string
	// counts are what the last successful sync programmed; valid is
	// false until one succeeded.
	counts dataplane.Counts
	valid  bool
	// full says the next sync must be a full one (the backend was added
	// before any model existed, or its last sync failed).
	full bool
	// last is the last sync's outcome, syncs how many it has had (Check
	// reads back without the lock and looks whether one came meanwhile).
	last  PrimarySync
	syncs uint64
}

var (
	_ dataplane.Backend          = (*Fanout)(nil)
	_ dataplane.SettingsReporter = (*Fanout)(nil)
)

// NewFanout returns an empty Fanout.
func NewFanout() *Fanout { return &Fanout{ready: make(chan struct{}), collect: collectInBackground} }

// SetAfterSync sets a function to run with the model that was synced
// after every successful sync of the primary, and after Add programmed a
// member while there was no primary (a full sync): the conntrack
// reconciler.
func (f *Fanout) SetAfterSync(fn func(ctx context.Context, snap *model.Snapshot, changed model.ChangeSet, full bool)) {
	f.mu.Lock()
	f.afterSync = fn
	f.mu.Unlock()
}

// Mode is the primary's mode ("" when there is none).
func (f *Fanout) Mode() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return string(f.primary)
}

// Sync syncs every member, the primary first. It returns the primary's
// counts and every member's error and warning (dataplane.Warning), each
// prefixed with its mode. A member that only warns synced.
//
// A periodic resync (req.Resync) gives way to a switch's steps: while one
// runs it is skipped, and when one begins it stops. Either way it returns
// the primary's last counts and no error: the switch verifies the mode it
// programs itself, and the loop resyncs again a sync period later. Drift
// in the serving mode waits that long, once per switch.
func (f *Fanout) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	syncCtx := ctx
	if req.Resync {
		rctx, over, ok := f.resyncContext(ctx)
		if !ok {
			klog.V(2).InfoS("Periodic resync skipped: a switch step runs")
			return f.servedCounts(), nil
		}
		defer over()
		syncCtx = rctx
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.model.Store(req.Model)
	if f.joining != nil {
		f.joining.note(req)
	}
	select {
	case <-f.ready:
	default:
		close(f.ready)
	}
	var errs []error
	var counts dataplane.Counts
	primaryOK, stopped := false, false
	for _, m := range f.ordered() {
		r := req
		if m.full {
			r.Full, r.Changed = true, nil
		}
		warning, err := f.syncMember(syncCtx, m, r)
		if err != nil && syncCtx.Err() != nil && ctx.Err() == nil {
			// A switch step began: the resync stops here.
			klog.V(2).InfoS("Periodic resync stopped: a switch step begins", "mode", m.mode)
			stopped = true
			break
		}
		if warning != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.mode, warning))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.mode, err))
			continue
		}
		if m.mode == f.primary {
			counts, primaryOK = m.counts, true
			f.served.Store(&counts)
		}
	}
	if primaryOK && f.afterSync != nil {
		f.afterSync(ctx, req.Model, req.Changed, req.Full)
	}
	if stopped && !primaryOK {
		counts = f.servedCounts()
	}
	return counts, errors.Join(errs...)
}

// ordered lists the members, the primary first.
func (f *Fanout) ordered() []*member {
	out := slices.Clone(f.members)
	slices.SortStableFunc(out, func(a, b *member) int {
		switch {
		case a.mode == f.primary && b.mode != f.primary:
			return -1
		case b.mode == f.primary && a.mode != f.primary:
			return 1
		}
		return 0
	})
	return out
}

// Programmed reads back the primary's objects.
func (f *Fanout) Programmed(ctx context.Context) (dataplane.Counts, error) {
	f.mu.Lock()
	m := f.find(f.primary)
	f.mu.Unlock()
	if m == nil {
		return dataplane.Counts{}, nil
	}
	return m.b.Programmed(ctx)
}

// KernelSettings reads back the kernel settings the primary (the serving
// backend) sets: none when there is no primary, or it sets none
// (dataplane.SettingsReporter).
func (f *Fanout) KernelSettings() ([]dataplane.KernelSetting, error) {
	f.mu.Lock()
	m := f.find(f.primary)
	f.mu.Unlock()
	if m == nil {
		return nil, nil
	}
	return dataplane.KernelSettings(m.b)
}

// Cleanup is not how a Fanout's members go: the switcher removes them one
// by one. It fails without touching anything.
func (f *Fanout) Cleanup(context.Context) ([]string, error) {
	return nil, errors.New("switcher: a Fanout is not cleaned up as a whole; remove its members")
}

func (f *Fanout) find(mode v1alpha1.ProxyMode) *member {
	for _, m := range f.members {
		if m.mode == mode {
			return m
		}
	}
	return nil
}

// Ready is closed once the loop synced for the first time: from then on
// the Fanout has a model.
func (f *Fanout) Ready() <-chan struct{} { return f.ready }

// Model is the last model synced (nil before the first sync).
func (f *Fanout) Model() *model.Snapshot { return f.model.Load() }

// Add makes b the member for mode, replacing (and returning) the one it
// had, and fully syncs it from the last model before it joins: when Add
// returns nil, b holds exactly what the other members hold. Without a
// model yet, b joins unsynced and the loop's first sync, a full one,
// programs it. A sync that only warns (dataplane.Warning) succeeded; the
// warning is reported by the syncs that follow. On a sync error b does not join, the previous member stays
// and the kernel keeps what b's failed transaction did not change.
//
// A new mode's full sync runs without the lock, so that the members keep
// following changes while it programs (a switch's Programming phase: a
// minute and more for iptables-nft at 10 000 services); b then catches up
// on what they synced meanwhile (the changed ports, or everything after a
// full sync) before it joins. A member that replaces one of its mode is
// synced holding the lock: the two must not write the same objects at
// once.
func (f *Fanout) Add(ctx context.Context, mode v1alpha1.ProxyMode, b dataplane.Backend, key string) (replaced dataplane.Backend, err error) {
	defer f.step()()
	f.adding.Lock()
	defer f.adding.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	nm := &member{mode: mode, b: b, key: key, full: true}
	switch {
	case f.model.Load() == nil:
	case f.find(mode) == nil:
		if err := f.programApart(ctx, nm); err != nil {
			return nil, err
		}
	default:
		if _, err := f.syncMember(ctx, nm, dataplane.SyncRequest{Model: f.model.Load(), Full: true}); err != nil {
			return nil, fmt.Errorf("%s: full sync: %w", mode, err)
		}
	}
	if snap := f.model.Load(); snap != nil && f.afterSync != nil && f.primary == "" {
		// No mode of ours served: its rules are the first to translate
		// (the start-up switch, a takeover from kube-proxy). Where one
		// does, its syncs have run it already.
		f.afterSync(ctx, snap, nil, true)
	}
	defer f.rememberKeys()
	for i, m := range f.members {
		if m.mode == mode {
			f.members[i] = nm
			return m.b, nil
		}
	}
	f.members = append(f.members, nm)
	return nil, nil
}

// rememberKeys records the members' keys for Keys; it is called with
// the lock held, after members changed.
func (f *Fanout) rememberKeys() {
	keys := make(map[v1alpha1.ProxyMode]string, len(f.members))
	for _, m := range f.members {
		keys[m.mode] = m.key
	}
	f.keys.Store(&keys)
}

// programApart fully syncs nm from the last model with the lock released
// meanwhile, then syncs it the changes the members' syncs made in the
// meantime. It is called, and returns, with the lock held.
func (f *Fanout) programApart(ctx context.Context, nm *member) error {
	req := dataplane.SyncRequest{Model: f.model.Load(), Full: true}
	f.joining = &joining{changed: model.ChangeSet{}}
	f.mu.Unlock()
	start := time.Now()
	c, err := nm.b.Sync(ctx, req)
	f.mu.Lock()
	j := f.joining
	f.joining = nil
	if _, err := f.record(ctx, nm, req, start, c, err); err != nil {
		return fmt.Errorf("%s: full sync: %w", nm.mode, err)
	}
	if !j.full && len(j.changed) == 0 {
		return nil
	}
	if _, err := f.syncMember(ctx, nm, dataplane.SyncRequest{Model: f.model.Load(), Changed: j.changed, Full: j.full}); err != nil {
		return fmt.Errorf("%s: sync the changes made while it was programmed: %w", nm.mode, err)
	}
	return nil
}

// Resync fully syncs mode's member from the last model.
func (f *Fanout) Resync(ctx context.Context, mode v1alpha1.ProxyMode) error {
	defer f.step()()
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.find(mode)
	if m == nil {
		return fmt.Errorf("%s is not programmed by this agent", mode)
	}
	if f.model.Load() == nil {
		m.full = true
		return nil
	}
	// A warning does not fail the sync: the primary's syncs report it.
	if _, err := f.syncMember(ctx, m, dataplane.SyncRequest{Model: f.model.Load(), Full: true}); err != nil {
		return fmt.Errorf("%s: full sync: %w", mode, err)
	}
	return nil
}

// Remove takes mode's member out, so no later sync touches it, and
// returns it (nil if there was none). Its objects stay in the kernel until
// the caller cleans them up.
func (f *Fanout) Remove(mode v1alpha1.ProxyMode) dataplane.Backend {
	defer f.step()()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, m := range f.members {
		if m.mode == mode {
			f.members = slices.Delete(f.members, i, i+1)
			f.rememberKeys()
			return m.b
		}
	}
	return nil
}

// Member returns mode's backend and the key of the settings it was built
// with.
func (f *Fanout) Member(mode v1alpha1.ProxyMode) (dataplane.Backend, string, bool) {
	defer f.step()()
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.find(mode); m != nil {
		return m.b, m.key, true
	}
	return nil, "", false
}

// Keys maps each member's mode to the key of the settings it was built
// with. Unlike Member it is not a switch step: it waits for no sync and
// stops no resync.
func (f *Fanout) Keys() map[v1alpha1.ProxyMode]string {
	if k := f.keys.Load(); k != nil {
		return *k
	}
	return nil
}

// SetPrimary makes mode the one synced first and reported.
func (f *Fanout) SetPrimary(mode v1alpha1.ProxyMode) {
	defer f.step()()
	f.mu.Lock()
	defer f.mu.Unlock()
	changed, had := f.primary != mode, f.primary != ""
	f.primary = mode
	if m := f.find(mode); changed && had && m != nil && !m.last.Time.IsZero() && f.onPrimary != nil {
		f.onPrimary(m.last)
	}
}

// checkUnlocked is how many times Check reads a member back without the
// Fanout's lock before it reads once holding it. Every member's syncs
// wait while the lock is held, and reading back a large node takes long
// (iptables-nft at 10 000 services: 28 s), so a switch's verification
// should not hold up the serving mode's changes; but a change sync of the
// member during a read leaves nothing to compare it with, so under
// constant churn the last read holds the lock. (Periodic resyncs do not
// run during a Check: it is a switch step.)
const checkUnlocked = 2

// Check compares what the kernel holds for mode with what its last
// successful sync programmed, with no sync of it in between.
func (f *Fanout) Check(ctx context.Context, mode v1alpha1.ProxyMode) error {
	defer f.step()()
	for attempt := 1; ; attempt++ {
		locked := attempt > checkUnlocked
		f.mu.Lock()
		m := f.find(mode)
		switch {
		case m == nil:
			f.mu.Unlock()
			return fmt.Errorf("%s is not programmed by this agent", mode)
		case !m.valid || m.full:
			f.mu.Unlock()
			return fmt.Errorf("%s has no successful sync to compare with", mode)
		}
		b, want, syncs := m.b, m.counts, m.syncs
		if !locked {
			f.mu.Unlock()
		}
		got, err := b.Programmed(ctx)
		if !locked {
			f.mu.Lock()
		}
		synced := f.find(mode) != m || m.syncs != syncs
		f.mu.Unlock()
		switch {
		case synced:
			continue // read again: what it read may be before or after
		case err != nil:
			return fmt.Errorf("read back %s: %w", mode, err)
		case got != want:
			return fmt.Errorf("the kernel holds %d service ports, %d endpoints and %d rules of %s, but its last sync programmed %d, %d and %d",
				got.Services, got.Endpoints, got.Rules, mode, want.Services, want.Endpoints, want.Rules)
		}
		return nil
	}
}
