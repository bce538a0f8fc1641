package switcher

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

type recordingEvents struct{ got []string }

func (r *recordingEvents) Normal(reason, action, msg string) {
	r.got = append(r.got, fmt.Sprintf("Normal %s [%s] %s", reason, action, msg))
}

func (r *recordingEvents) Warning(reason, action, msg string) {
	r.got = append(r.got, fmt.Sprintf("Warning %s [%s] %s", reason, action, msg))
}

// The events of a switch name its phase, its switch and what it does; a
// failure is a Warning with its reason; a cleanup names a bounded number
// of what it removed, and counts them all.
func TestTell(t *testing.T) {
	ev := &recordingEvents{}
	s := New(Config{Prepare: failingPreparer{}, Events: ev}, Desire{})
	ipt, nft := v1alpha1.ModeIPTables, v1alpha1.ModeNFTables
	for _, st := range []State{
		{Phase: v1alpha1.NodePreparing, Target: nft, Previous: ipt},
		{Phase: v1alpha1.NodeProgramming, Target: nft, Previous: ipt},
		{Phase: v1alpha1.NodeVerifying, Target: nft, Previous: ipt},
	} {
		s.tellPhase(st, Step{Mode: nft})
	}
	s.tellPhase(State{Phase: v1alpha1.NodeCleaningUp, Target: nft, Previous: ipt}, Step{Action: CleanUp, Mode: nft, Remove: []v1alpha1.ProxyMode{ipt}})
	var removed []string
	for i := range 12 {
		removed = append(removed, fmt.Sprintf("chain PROXYSHIFT-%d", i))
	}
	s.tellRemoved(EventCleanedUp, nft, "the objects of iptables", removed)
	s.tellPhase(State{Phase: v1alpha1.NodeActive, Target: nft}, Step{Action: Serve, Mode: nft})
	st := State{Phase: v1alpha1.NodePreparing, Target: v1alpha1.ModeIPVS} // no previous mode: no baseline to take
	if res := s.execute(context.Background(), st, Step{Action: Prepare, Mode: v1alpha1.ModeIPVS}); res != Failed {
		t.Fatalf("prepare: %v, want Failed", res)
	}
	s.tellPhase(State{Phase: v1alpha1.NodeFailed, Target: nft}, Step{Action: Rollback, Mode: v1alpha1.ModeIPVS, Restore: nft})

	want := []string{
		"Normal Preparing [Switch to nftables] switching from iptables to nftables: taking a probe baseline through iptables, loading the kernel modules nftables needs",
		"Normal Programming [Switch to nftables] programming nftables next to iptables, which keeps serving",
		"Normal Verifying [Switch to nftables] verifying nftables: checking its objects against its last sync and probing the services that answered through iptables",
		"Normal CleaningUp [Switch to nftables] nftables verified; removing iptables",
		"Normal CleanedUp [Switch to nftables] removed the objects of iptables (12 objects): chain PROXYSHIFT-0, chain PROXYSHIFT-1, chain PROXYSHIFT-2, " +
			"chain PROXYSHIFT-3, chain PROXYSHIFT-4, chain PROXYSHIFT-5, chain PROXYSHIFT-6, chain PROXYSHIFT-7, chain PROXYSHIFT-8, chain PROXYSHIFT-9 and 2 more",
		"Normal Active [Switch to nftables] nftables serves the node",
		"Warning SwitchFailed [Switch to ipvs] Preparing failed: module ip_vs is missing",
		"Warning Failed [Switch to ipvs] the switch to ipvs failed (SwitchFailed); nftables serves the node; change the spec to try again",
	}
	if strings.Join(ev.got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(ev.got, "\n"), strings.Join(want, "\n"))
	}
}

// A removal's log line counts everything removed but names a bounded
// number of objects: leaving iptables at 10 000 services removes 110 000
// chains.
func TestRemovedLogValues(t *testing.T) {
	few := []string{"table ip proxyshift"}
	if got := fmt.Sprint(removedLogValues(few)); got != "[count 1 objects [table ip proxyshift]]" {
		t.Errorf("one object: %s", got)
	}
	var many []string
	for i := range 110000 {
		many = append(many, fmt.Sprintf("iptables-nft: chain nat PROXYSHIFT-SVC-%d", i))
	}
	kv := removedLogValues(many)
	if len(kv) != 6 || kv[1] != 110000 || len(kv[3].([]string)) != maxRemovedNamesInLog || kv[5] != 110000-maxRemovedNamesInLog {
		t.Errorf("110 000 objects: %d values, count %v", len(kv), kv[1])
	}
}
