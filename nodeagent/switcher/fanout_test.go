package switcher

import (
	"context"
	"reflect"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// countingBackend reports as many services as syncs it has had.
type countingBackend struct {
	mode  v1alpha1.ProxyMode
	syncs int
}

func (b *countingBackend) Mode() string { return string(b.mode) }
func (b *countingBackend) Sync(context.Context, dataplane.SyncRequest) (dataplane.Counts, error) {
	b.syncs++
	return dataplane.Counts{Services: b.syncs}, nil
}
func (b *countingBackend) Programmed(context.Context) (dataplane.Counts, error) {
	return dataplane.Counts{Services: b.syncs}, nil
}
func (b *countingBackend) Cleanup(context.Context) ([]string, error) { return nil, nil }

// TestOnPrimaryReportsEachServingSyncOnce checks which syncs reach
// onPrimary: on a node that served nothing, the syncs of the mode being
// programmed (the first sync after start-up included); once it is
// primary, its syncs only, never the new member's during a switch; and
// the new member's last sync once, when it takes over.
func TestOnPrimaryReportsEachServingSyncOnce(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	var got []PrimarySync
	f.SetOnPrimary(func(p PrimarySync) { got = append(got, p) })
	snap := &model.Snapshot{}
	nft := &countingBackend{mode: v1alpha1.ModeNFTables}
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: snap, Full: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Add(ctx, v1alpha1.ModeNFTables, nft, "k"); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Mode != v1alpha1.ModeNFTables || !got[0].Full {
		t.Fatalf("programming a fresh node's mode reported %+v, want its full sync", got)
	}
	f.SetPrimary(v1alpha1.ModeNFTables)
	if len(got) != 1 {
		t.Fatalf("promoting the only mode reported its sync again: %+v", got)
	}
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: snap}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1].Full {
		t.Fatalf("a partial sync of the primary: got %+v", got)
	}

	ipt := &countingBackend{mode: v1alpha1.ModeIPTables}
	if _, err := f.Add(ctx, v1alpha1.ModeIPTables, ipt, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: snap}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[2].Mode != v1alpha1.ModeNFTables {
		t.Fatalf("during a switch only the primary's syncs count: got %+v", got)
	}
	f.SetPrimary(v1alpha1.ModeIPTables)
	if len(got) != 4 || got[3].Mode != v1alpha1.ModeIPTables || got[3].Counts.Services != ipt.syncs {
		t.Fatalf("the new primary's last sync is reported once when it takes over: got %+v", got)
	}
}

// settingBackend is a backend that sets kernel settings.
type settingBackend struct {
	countingBackend
	settings []dataplane.KernelSetting
}

func (b *settingBackend) KernelSettings() ([]dataplane.KernelSetting, error) { return b.settings, nil }

func TestKernelSettingsAreTheServingBackends(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	ipvsSettings := []dataplane.KernelSetting{{Name: "net.ipv4.vs.conntrack", Want: "1", Value: "1"}}
	ipvs := &settingBackend{countingBackend: countingBackend{mode: v1alpha1.ModeIPVS}, settings: ipvsSettings}
	nft := &countingBackend{mode: v1alpha1.ModeNFTables}

	if got, err := f.KernelSettings(); got != nil || err != nil {
		t.Errorf("empty Fanout: %v, %v; want none", got, err)
	}
	for _, m := range []struct {
		mode v1alpha1.ProxyMode
		b    dataplane.Backend
	}{{v1alpha1.ModeNFTables, nft}, {v1alpha1.ModeIPVS, ipvs}} {
		if _, err := f.Add(ctx, m.mode, m.b, ""); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := f.KernelSettings(); got != nil || err != nil {
		t.Errorf("no primary yet: %v, %v; want none", got, err)
	}
	f.SetPrimary(v1alpha1.ModeNFTables)
	if got, err := f.KernelSettings(); got != nil || err != nil {
		t.Errorf("nftables serving (ipvs programmed too): %v, %v; want none", got, err)
	}
	f.SetPrimary(v1alpha1.ModeIPVS)
	if got, err := f.KernelSettings(); !reflect.DeepEqual(got, ipvsSettings) || err != nil {
		t.Errorf("ipvs serving: %v, %v; want %v", got, err, ipvsSettings)
	}
}

// warningBackend's syncs program everything but leave something alone
// (a dataplane.Warning).
type warningBackend struct{ countingBackend }

type leftAlone struct{}

func (leftAlone) Error() string {
	return "ipvs: 1 virtual services exist that are not proxyshift's: tcp/198.18.0.1:80"
}
func (leftAlone) LeftAlone() []string { return []string{"tcp/198.18.0.1:80"} }

func (b *warningBackend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	c, _ := b.countingBackend.Sync(ctx, req)
	return c, leftAlone{}
}

// TestWarningIsASuccessfulSync: a member whose syncs only warn joins,
// resyncs and checks as one whose syncs succeed; its warning reaches
// onPrimary and the loop, apart from any error.
func TestWarningIsASuccessfulSync(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	var got []PrimarySync
	f.SetOnPrimary(func(p PrimarySync) { got = append(got, p) })
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: &model.Snapshot{}, Full: true}); err != nil {
		t.Fatal(err)
	}
	ipvs := &warningBackend{countingBackend{mode: v1alpha1.ModeIPVS}}
	if _, err := f.Add(ctx, v1alpha1.ModeIPVS, ipvs, "k"); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if err := f.Resync(ctx, v1alpha1.ModeIPVS); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	if err := f.Check(ctx, v1alpha1.ModeIPVS); err != nil {
		t.Fatalf("Check: %v", err)
	}
	f.SetPrimary(v1alpha1.ModeIPVS)
	c, err := f.Sync(ctx, dataplane.SyncRequest{Model: &model.Snapshot{}})
	if ws, rest := dataplane.SplitWarnings(err); len(ws) != 1 || rest != nil || c.Services != 3 {
		t.Errorf("Sync: %+v, %v; want the primary's counts and its warning only", c, err)
	}
	last := got[len(got)-1]
	if last.Err != nil || last.Warning == nil || last.Counts.Services != 3 {
		t.Errorf("onPrimary got %+v; want a successful sync with its warning", last)
	}
}

// slowReadBackend is a countingBackend whose first Programmed signals
// reading and waits for release: a read back that takes long.
type slowReadBackend struct {
	countingBackend
	reads            int
	reading, release chan struct{}
}

func (b *slowReadBackend) Programmed(ctx context.Context) (dataplane.Counts, error) {
	b.reads++
	if b.reads == 1 {
		close(b.reading)
		<-b.release
	}
	return b.countingBackend.Programmed(ctx)
}

// syncWithin syncs req through f, failing the test with stuck when the
// sync does not return within 10 s (it waits for something it should
// not).
func syncWithin(t *testing.T, f *Fanout, req dataplane.SyncRequest, stuck string) {
	t.Helper()
	synced := make(chan error, 1)
	go func() {
		_, err := f.Sync(context.Background(), req)
		synced <- err
	}()
	select {
	case err := <-synced:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(stuck)
	}
}

// TestCheckDoesNotHoldUpSyncs: while Check reads a member back, the
// Fanout's syncs go on (the serving mode keeps following changes during
// a switch's verification); a sync that came during the read makes Check
// read again and compare with that sync's counts.
func TestCheckDoesNotHoldUpSyncs(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: &model.Snapshot{}, Full: true}); err != nil {
		t.Fatal(err)
	}
	b := &slowReadBackend{countingBackend: countingBackend{mode: v1alpha1.ModeIPTables}, reading: make(chan struct{}), release: make(chan struct{})}
	if _, err := f.Add(ctx, v1alpha1.ModeIPTables, b, "k"); err != nil {
		t.Fatal(err)
	}
	checked := make(chan error, 1)
	go func() { checked <- f.Check(ctx, v1alpha1.ModeIPTables) }()
	<-b.reading
	syncWithin(t, f, dataplane.SyncRequest{Model: &model.Snapshot{}}, "a sync waited for Check's read back")
	close(b.release)
	if err := <-checked; err != nil {
		t.Errorf("Check after a sync during its read: %v", err)
	}
	if b.reads != 2 {
		t.Errorf("Check read back %d times; want 2 (the read during the sync, then one after it)", b.reads)
	}
}

// slowFirstSyncBackend records its syncs; the first one signals syncing
// and waits for release: a full sync that takes long.
type slowFirstSyncBackend struct {
	countingBackend
	reqs             []dataplane.SyncRequest
	syncing, release chan struct{}
}

func (b *slowFirstSyncBackend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	b.reqs = append(b.reqs, req)
	if len(b.reqs) == 1 {
		close(b.syncing)
		<-b.release
	}
	return b.countingBackend.Sync(ctx, req)
}

// TestAddDoesNotHoldUpSyncs: while Add fully syncs a new mode's member
// (a switch's Programming phase), the serving member keeps syncing
// changes; the new member then syncs the ports changed meanwhile, from
// the latest model, before it joins.
func TestAddDoesNotHoldUpSyncs(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	old := &countingBackend{mode: v1alpha1.ModeNFTables}
	first := &model.Snapshot{}
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: first, Full: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Add(ctx, v1alpha1.ModeNFTables, old, "k"); err != nil {
		t.Fatal(err)
	}
	f.SetPrimary(v1alpha1.ModeNFTables)

	b := &slowFirstSyncBackend{countingBackend: countingBackend{mode: v1alpha1.ModeIPTables}, syncing: make(chan struct{}), release: make(chan struct{})}
	added := make(chan error, 1)
	go func() {
		_, err := f.Add(ctx, v1alpha1.ModeIPTables, b, "k")
		added <- err
	}()
	<-b.syncing
	changed := model.ChangeSet{{Namespace: "default", Name: "web", Port: "http"}: {}}
	latest := &model.Snapshot{}
	syncWithin(t, f, dataplane.SyncRequest{Model: latest, Changed: changed}, "a sync of the serving member waited for the new member's full sync")
	if old.syncs != 2 {
		t.Errorf("the serving member synced %d times; want 2 (its full sync and the change)", old.syncs)
	}
	close(b.release)
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 2 {
		t.Fatalf("the new member synced %d times; want its full sync, then the changes made meanwhile", len(b.reqs))
	}
	if r := b.reqs[0]; !r.Full || r.Model != first {
		t.Errorf("first sync of the new member = %+v; want a full sync of the model it joined with", r)
	}
	if r := b.reqs[1]; r.Full || r.Model != latest || !reflect.DeepEqual(r.Changed, changed) {
		t.Errorf("catch-up sync of the new member = %+v; want the changed ports from the latest model", r)
	}
	if keys := f.Keys(); len(keys) != 2 {
		t.Errorf("members = %v; want both modes", keys)
	}
	// Once joined, it syncs with the others.
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: latest, Changed: changed}); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 3 {
		t.Errorf("the joined member synced %d times; want 3", len(b.reqs))
	}
}

// blockingResyncBackend is a countingBackend whose periodic resyncs
// signal resyncing and read until their ctx ends, as a backend verifying
// a large node does.
type blockingResyncBackend struct {
	countingBackend
	resyncing chan struct{}
	// resyncCtx is the resync's ctx, set before resyncing closes.
	resyncCtx context.Context
}

func (b *blockingResyncBackend) Sync(ctx context.Context, req dataplane.SyncRequest) (dataplane.Counts, error) {
	if !req.Resync {
		return b.countingBackend.Sync(ctx, req)
	}
	b.resyncCtx = ctx
	close(b.resyncing)
	<-ctx.Done()
	return dataplane.Counts{}, ctx.Err()
}

// TestKeysIsNoSwitchStep: Keys, which every status report reads,
// answers while a periodic resync holds the lock and leaves that resync
// running; it follows Add and Remove.
func TestKeysIsNoSwitchStep(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	if keys := f.Keys(); len(keys) != 0 {
		t.Errorf("keys of an empty Fanout = %v; want none", keys)
	}
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: &model.Snapshot{}, Full: true}); err != nil {
		t.Fatal(err)
	}
	serving := &blockingResyncBackend{countingBackend: countingBackend{mode: v1alpha1.ModeIPTables}, resyncing: make(chan struct{})}
	if _, err := f.Add(ctx, v1alpha1.ModeIPTables, serving, "ipt-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Add(ctx, v1alpha1.ModeNFTables, &countingBackend{mode: v1alpha1.ModeNFTables}, "nft-1"); err != nil {
		t.Fatal(err)
	}
	f.SetPrimary(v1alpha1.ModeIPTables)
	rctx, cancel := context.WithCancel(ctx)
	resynced := make(chan error, 1)
	go func() {
		_, err := f.Sync(rctx, dataplane.SyncRequest{Model: &model.Snapshot{}, Full: true, Resync: true})
		resynced <- err
	}()
	<-serving.resyncing
	keys := make(chan map[v1alpha1.ProxyMode]string, 1)
	go func() { keys <- f.Keys() }()
	select {
	case got := <-keys:
		want := map[v1alpha1.ProxyMode]string{v1alpha1.ModeIPTables: "ipt-1", v1alpha1.ModeNFTables: "nft-1"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Keys = %v; want %v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Keys waited for the periodic resync")
	}
	if err := serving.resyncCtx.Err(); err != nil {
		t.Errorf("Keys stopped the periodic resync: %v", err)
	}
	cancel()
	<-resynced
	f.Remove(v1alpha1.ModeNFTables)
	if got := f.Keys(); !reflect.DeepEqual(got, map[v1alpha1.ProxyMode]string{v1alpha1.ModeIPTables: "ipt-1"}) {
		t.Errorf("Keys after Remove = %v; want iptables alone", got)
	}
}

// TestResyncGivesWayToSwitchSteps: a switch step that begins stops the
// periodic resync running (it does not wait for the verification to
// end), the resync returns the primary's last counts without an error
// and without being recorded as a sync, and while a step runs a resync
// is skipped, so Check's read is not made void by it.
func TestResyncGivesWayToSwitchSteps(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: &model.Snapshot{}, Full: true}); err != nil {
		t.Fatal(err)
	}
	serving := &blockingResyncBackend{countingBackend: countingBackend{mode: v1alpha1.ModeIPTables}, resyncing: make(chan struct{})}
	if _, err := f.Add(ctx, v1alpha1.ModeIPTables, serving, "k"); err != nil {
		t.Fatal(err)
	}
	f.SetPrimary(v1alpha1.ModeIPTables)
	syncWithin(t, f, dataplane.SyncRequest{Model: &model.Snapshot{}}, "a change sync got stuck")
	want := dataplane.Counts{Services: serving.syncs}

	type result struct {
		c   dataplane.Counts
		err error
	}
	resynced := make(chan result, 1)
	go func() {
		c, err := f.Sync(ctx, dataplane.SyncRequest{Model: &model.Snapshot{}, Full: true, Resync: true})
		resynced <- result{c, err}
	}()
	<-serving.resyncing
	stepped := make(chan struct{})
	go func() { f.Member(v1alpha1.ModeIPTables); close(stepped) }()
	select {
	case <-stepped:
	case <-time.After(10 * time.Second):
		t.Fatal("a switch step waited for the periodic resync to end")
	}
	r := <-resynced
	if r.err != nil || r.c != want {
		t.Errorf("stopped resync returned %+v, %v; want the primary's last counts %+v and no error", r.c, r.err, want)
	}
	if err := f.Check(ctx, v1alpha1.ModeIPTables); err != nil {
		t.Errorf("a stopped resync was recorded as a sync: Check: %v", err)
	}

	nft := &slowReadBackend{countingBackend: countingBackend{mode: v1alpha1.ModeNFTables}, reading: make(chan struct{}), release: make(chan struct{})}
	if _, err := f.Add(ctx, v1alpha1.ModeNFTables, nft, "k"); err != nil {
		t.Fatal(err)
	}
	checked := make(chan error, 1)
	go func() { checked <- f.Check(ctx, v1alpha1.ModeNFTables) }()
	<-nft.reading
	before := nft.syncs
	c, err := f.Sync(ctx, dataplane.SyncRequest{Model: &model.Snapshot{}, Full: true, Resync: true})
	if err != nil || c != want {
		t.Errorf("resync during a step returned %+v, %v; want %+v and no error", c, err, want)
	}
	if nft.syncs != before {
		t.Errorf("a resync ran during a switch step (%d syncs, had %d)", nft.syncs, before)
	}
	close(nft.release)
	if err := <-checked; err != nil {
		t.Fatal(err)
	}
	if nft.reads != 1 {
		t.Errorf("Check read back %d times; want 1 (a skipped resync leaves its read valid)", nft.reads)
	}
}

// TestAfterSyncFollowsEveryProgramming: the conntrack reconciler runs
// after a member is programmed while no mode of ours serves (Add: the
// node's first mode serves from there, before any sync of a primary), and
// after each sync of the primary, with what that sync changed; not after
// a switch's new mode is programmed beside the primary.
func TestAfterSyncFollowsEveryProgramming(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	type call struct {
		snap *model.Snapshot
		full bool
	}
	var got []call
	f.SetAfterSync(func(_ context.Context, snap *model.Snapshot, _ model.ChangeSet, full bool) {
		got = append(got, call{snap, full})
	})
	first, second := &model.Snapshot{}, &model.Snapshot{}
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: first, Full: true}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("a sync with no member ran it: %+v", got)
	}
	if _, err := f.Add(ctx, v1alpha1.ModeNFTables, &countingBackend{mode: v1alpha1.ModeNFTables}, "k"); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (call{first, true}) {
		t.Fatalf("after programming the first mode: %+v, want one full call with the model", got)
	}
	f.SetPrimary(v1alpha1.ModeNFTables)
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: second}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1] != (call{second, false}) {
		t.Fatalf("after a partial sync of the primary: %+v", got)
	}
	// A switch's new mode, while the primary serves: the primary's syncs
	// have run it for that model already.
	if _, err := f.Add(ctx, v1alpha1.ModeIPTables, &countingBackend{mode: v1alpha1.ModeIPTables}, "k2"); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("programming a second mode beside the primary ran it: %+v", got)
	}
}

// TestFullSyncIsFollowedByACollection checks that every full sync, the
// primary's and a new mode's alike, is followed by a collection, and
// that changes and periodic resyncs are not.
func TestFullSyncIsFollowedByACollection(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	var collections atomic.Int32
	f.collect = func() { collections.Add(1) }
	snap := &model.Snapshot{}
	nft := &countingBackend{mode: v1alpha1.ModeNFTables}
	if _, err := f.Add(ctx, v1alpha1.ModeNFTables, nft, "k"); err != nil {
		t.Fatal(err)
	}
	f.SetPrimary(v1alpha1.ModeNFTables)
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: snap, Full: true}); err != nil {
		t.Fatal(err)
	}
	if got := collections.Load(); got != 1 {
		t.Fatalf("the primary's full sync was followed by %d collections, want 1", got)
	}
	ipt := &countingBackend{mode: v1alpha1.ModeIPTables}
	if _, err := f.Add(ctx, v1alpha1.ModeIPTables, ipt, "k"); err != nil {
		t.Fatal(err)
	}
	if got := collections.Load(); got != 2 {
		t.Fatalf("a new mode's full sync: %d collections in all, want 2", got)
	}
	for _, req := range []dataplane.SyncRequest{
		{Model: snap, Changed: model.ChangeSet{}},
		{Model: snap, Full: true, Resync: true},
	} {
		if _, err := f.Sync(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if got := collections.Load(); got != 2 {
		t.Fatalf("a change and a periodic resync: %d collections in all, want still 2", got)
	}
}

// TestCollectInBackgroundCollects checks that the Fanout's collection is
// a real one: the runtime counts one more forced collection.
func TestCollectInBackgroundCollects(t *testing.T) {
	forced := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	// Collections earlier tests' Fanouts started in the background have
	// run their course before the count is taken.
	before, since := forced(), time.Now()
	for time.Since(since) < 300*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
		if n := forced(); n != before {
			before, since = n, time.Now()
		}
	}
	collectInBackground()
	deadline := time.Now().Add(10 * time.Second)
	for forced() == before {
		if time.Now().After(deadline) {
			t.Fatal("no forced collection within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
