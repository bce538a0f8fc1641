package agent

import (
	"errors"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
)

// TestFactsAreGatheredAgainWhenAModeStartsServing checks that the first
// successful sync of each newly serving mode (which set its sysctls)
// asks for the facts again, once, without ever blocking the sync.
func TestFactsAreGatheredAgainWhenAModeStartsServing(t *testing.T) {
	w := newServingWatch()
	kicked := func() bool {
		select {
		case <-w.kick:
			return true
		default:
			return false
		}
	}
	steps := []struct {
		sync switcher.PrimarySync
		want bool
	}{
		{switcher.PrimarySync{Mode: v1alpha1.ModeIPVS, Err: errors.New("failed")}, false},
		{switcher.PrimarySync{Mode: v1alpha1.ModeIPVS}, true},
		{switcher.PrimarySync{Mode: v1alpha1.ModeIPVS}, false},
		{switcher.PrimarySync{Mode: v1alpha1.ModeNFTables}, true},
		{switcher.PrimarySync{Mode: v1alpha1.ModeIPVS}, true},
	}
	for i, s := range steps {
		w.synced(s.sync)
		if got := kicked(); got != s.want {
			t.Errorf("step %d (%s, err %v): gathered again = %v, want %v", i, s.sync.Mode, s.sync.Err, got, s.want)
		}
	}
	// Nobody gathering: syncs never block, and one gathering is pending.
	w.synced(switcher.PrimarySync{Mode: v1alpha1.ModeNFTables})
	w.synced(switcher.PrimarySync{Mode: v1alpha1.ModeIPVS})
	if !kicked() || kicked() {
		t.Error("two mode changes with nobody gathering: want exactly one pending gathering")
	}
}
