package switcher

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/probe"
	"github.com/proxyshift/proxyshift/nodeagent/report"
)

// settingsKernel is the node's kernel as far as the nftables mode's
// settings go: the key of the settings its objects were last programmed
// with ("" none).
type settingsKernel struct {
	mu  sync.Mutex
	key string
}

func (k *settingsKernel) holds() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.key
}

// keyedBackend is an nftables instance built with the settings of key.
type keyedBackend struct {
	k   *settingsKernel
	key string
}

func (b *keyedBackend) Mode() string { return string(v1alpha1.ModeNFTables) }
func (b *keyedBackend) Sync(context.Context, dataplane.SyncRequest) (dataplane.Counts, error) {
	b.k.mu.Lock()
	b.k.key = b.key
	b.k.mu.Unlock()
	return dataplane.Counts{Services: 1}, nil
}
func (b *keyedBackend) Programmed(context.Context) (dataplane.Counts, error) {
	return dataplane.Counts{Services: 1}, nil
}
func (b *keyedBackend) Cleanup(context.Context) ([]string, error) {
	b.k.mu.Lock()
	b.k.key = ""
	b.k.mu.Unlock()
	return nil, nil
}
func (b *keyedBackend) Present(context.Context) (bool, error) { return b.k.holds() != "", nil }

type nopPreparer struct{}

func (nopPreparer) Prepare(context.Context, v1alpha1.ProxyMode, v1alpha1.IPVSScheduler) error {
	return nil
}

// switchReports hands each report to the test.
type switchReports chan report.Switch

func (r switchReports) SetSwitch(s report.Switch) { r <- s }
func (switchReports) Flush(context.Context) error { return nil }

// next waits for a report that match accepts and returns it; it fails
// the test after 10 s.
func (r switchReports) next(t *testing.T, what string, match func(report.Switch) bool) report.Switch {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-r:
			if match(s) {
				return s
			}
		case <-deadline:
			t.Fatalf("no report of %s", what)
		}
	}
}

// settingsAgent is one agent process: a switcher whose backends are
// built with the settings of the current desire, as the agent's are.
type settingsAgent struct {
	s       *Switcher
	reports switchReports
	stop    func()
}

func startSettingsAgent(t *testing.T, k *settingsKernel, d Desire, failVerify bool) *settingsAgent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &settingsAgent{reports: make(switchReports, 100)}
	f := NewFanout()
	a.s = New(Config{
		Fanout: f,
		Modes:  []v1alpha1.ProxyMode{v1alpha1.ModeNFTables},
		Backend: func(v1alpha1.ProxyMode) (dataplane.Backend, string, error) {
			key := a.s.currentDesire().Key
			return &keyedBackend{k: k, key: key}, key, nil
		},
		Prepare:    nopPreparer{},
		Prober:     &probe.Prober{Attempts: 1},
		Report:     a.reports,
		FailVerify: failVerify,
	}, d)
	st, step, err := a.s.Init(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The sync loop's first sync, a full one.
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: &model.Snapshot{}, Full: true}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = a.s.Run(ctx, st, step); close(done) }()
	a.stop = func() { cancel(); <-done }
	t.Cleanup(a.stop)
	return a
}

// TestFailedReconfigurationReportsTheSettingsThatServe changes the
// serving mode's settings and fails the change in Verifying: the old
// instance is synced back, and every report from the failure on gives
// the old settings as those the mode runs with (status.activeSettings),
// even the Failed one sent before the rollback runs. A restarted agent
// holding the failure is given them (the agent builds its backends from
// status.activeSettings while the failure is held), programs them, and
// reports them again. A spec that returns to them has nothing to switch.
func TestFailedReconfigurationReportsTheSettingsThatServe(t *testing.T) {
	nft := v1alpha1.ModeNFTables
	settings := func(cidr string) *v1alpha1.ProxySettings {
		return &v1alpha1.ProxySettings{ClusterCIDRs: []v1alpha1.CIDR{v1alpha1.CIDR(cidr)}}
	}
	oldSettings, newSettings := settings("10.1.0.0/16"), settings("10.2.0.0/16")
	desire := func(key string, s *v1alpha1.ProxySettings, gen int64) Desire {
		return Desire{Mode: nft, Key: key, Settings: s, Generation: gen}
	}
	same := func(a, b *v1alpha1.ProxySettings) bool { return fmt.Sprint(a) == fmt.Sprint(b) }
	k := &settingsKernel{key: "old"}

	a := startSettingsAgent(t, k, desire("old", oldSettings, 1), true)
	if r := a.reports.next(t, "Active", func(r report.Switch) bool { return r.Phase == v1alpha1.NodeActive }); !same(r.Settings, oldSettings) {
		t.Errorf("serving as found: settings %v reported, want %v", r.Settings, oldSettings)
	}
	a.s.SetDesire(desire("new", newSettings, 2))
	failed := a.reports.next(t, "Failed", func(r report.Switch) bool { return r.Phase == v1alpha1.NodeFailed })
	if !same(failed.Settings, oldSettings) {
		t.Errorf("the failure reports settings %v, want the old %v it rolls back to", failed.Settings, oldSettings)
	}
	a.reports.next(t, "the held desire served", func(r report.Switch) bool {
		if r.Phase == v1alpha1.NodeFailed && !same(r.Settings, oldSettings) {
			t.Errorf("held: settings %v reported, want %v", r.Settings, oldSettings)
		}
		return r.Phase == v1alpha1.NodeFailed && k.holds() == "old"
	})

	// The spec goes back to the old settings: they serve already.
	a.s.SetDesire(desire("old", oldSettings, 3))
	back := a.reports.next(t, "the return to the old settings", func(r report.Switch) bool { return r.Generation == 3 })
	if back.Phase != v1alpha1.NodeActive || !same(back.Settings, oldSettings) {
		t.Errorf("a spec back to the settings that serve: %s with settings %v, want Active with %v at once", back.Phase, back.Settings, oldSettings)
	}
	a.s.SetDesire(desire("new", newSettings, 4))
	a.reports.next(t, "Failed again", func(r report.Switch) bool { return r.Phase == v1alpha1.NodeFailed })
	a.reports.next(t, "the rollback", func(r report.Switch) bool { return r.Phase == v1alpha1.NodeFailed && k.holds() == "old" })
	a.stop()

	// The restart: the failure of generation 4 is held, and the agent
	// builds from the settings status.activeSettings gives.
	held := desire("old", oldSettings, 4)
	held.Held, held.HeldReason = true, "VerificationFailed"
	a2 := startSettingsAgent(t, k, held, false)
	r := a2.reports.next(t, "the restarted agent's first report", func(report.Switch) bool { return true })
	if r.Phase != v1alpha1.NodeFailed || !same(r.Settings, oldSettings) || k.holds() != "old" {
		t.Errorf("restarted while held: %s with settings %v reported, %q programmed; want Failed with the old ones", r.Phase, r.Settings, k.holds())
	}
}
