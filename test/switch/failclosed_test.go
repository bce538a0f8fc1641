package switchtest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// moduleFixture writes a modules directory whose modules.builtin lists
// every module the iptables and nftables modes need except missing, an
// empty /proc/modules and an empty /sys/module, and returns the agent
// flags pointing at them.
func moduleFixture(t *testing.T, missing string) []string {
	t.Helper()
	dir := t.TempDir()
	var names []string
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables} {
		mods, err := contract.ModulesFor(m, "")
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, mods...)
	}
	for _, b := range []string{"legacy", "nft"} {
		mods, _ := contract.IPTablesBackendModules(b)
		names = append(names, mods...)
	}
	var builtin strings.Builder
	for _, n := range names {
		if n != missing {
			builtin.WriteString("kernel/net/netfilter/" + n + ".ko\n")
		}
	}
	modules := filepath.Join(dir, "modules")
	sys := filepath.Join(dir, "sys")
	for _, d := range []string{modules, sys} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		filepath.Join(modules, "modules.builtin"): builtin.String(),
		filepath.Join(modules, "modules.dep"):     "",
		filepath.Join(dir, "proc-modules"):        "",
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"--modules-dir", modules, "--proc-modules", filepath.Join(dir, "proc-modules"), "--sys-module", sys}
}

// waitFailed waits for phase Failed for the current generation and
// returns the Ready condition.
func (w *world) waitFailed() (*v1alpha1.ProxyNode, *metav1.Condition) {
	w.t.Helper()
	gen := w.gen
	pn := w.waitStatus("phase Failed", 60*time.Second, func(pn *v1alpha1.ProxyNode) bool {
		return pn.Status.Phase == v1alpha1.NodeFailed && pn.Status.ObservedConfig != nil && pn.Status.ObservedConfig.Generation == gen
	})
	return pn, meta.FindStatusCondition(pn.Status.Conditions, contract.ConditionReady)
}

// TestFailClosed: a switch that cannot or must not complete leaves the
// old mode serving, with status Failed and a reason a person can act on,
// and no new connection fails meanwhile.
//   - A module the target needs is missing (a modules directory without
//     it): Failed in Preparing, ModuleMissing naming the module; nothing
//     of the target was programmed.
//   - Verifying fails (--test-fail-verify), after nftables was programmed
//     ahead of iptables: rolled back, VerificationFailed.
//   - A restarted agent does not retry a switch that failed for the same
//     spec; a new spec does.
func TestFailClosed(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	a := w.startAgent(moduleFixture(t, "nft_numgen")...)
	w.waitActive(v1alpha1.ModeIPTables)
	w.requireTraffic()

	t.Run("missing-module", func(t *testing.T) {
		loop := w.startClientLoop()
		w.desire(v1alpha1.ModeNFTables)
		pn, ready := w.waitFailed()
		loop.RequireNoFailures(t, "while the switch failed")
		if ready == nil || ready.Reason != "ModuleMissing" || !strings.Contains(ready.Message, "nft_numgen") {
			t.Errorf("Ready condition %+v; want reason ModuleMissing naming nft_numgen", ready)
		}
		if pn.Status.ActiveMode != v1alpha1.ModeIPTables {
			t.Errorf("active mode %s, want iptables still serving", pn.Status.ActiveMode)
		}
		if deg := meta.FindStatusCondition(pn.Status.Conditions, contract.ConditionDegraded); deg == nil || deg.Status != metav1.ConditionTrue {
			t.Errorf("Degraded condition %+v; want True", deg)
		}
		var mods []string
		for _, m := range pn.Status.Kernel.Modules {
			if m.Name == "nft_numgen" {
				mods = append(mods, string(m.State))
			}
		}
		if !slices.Equal(mods, []string{string(v1alpha1.ModuleMissing)}) {
			t.Errorf("kernel facts report nft_numgen as %v, want Missing", mods)
		}
		w.requireOnly(v1alpha1.ModeIPTables)
		w.requireTraffic()
	})
	a.stop()

	t.Run("verification-fails", func(t *testing.T) {
		a := w.startAgent("--test-fail-verify")
		loop := w.startClientLoop()
		w.desire(v1alpha1.ModeNFTables)
		pn, ready := w.waitFailed()
		// Failed is reported as the rollback starts; it re-programs
		// iptables whole and then removes nftables, which under load
		// takes seconds.
		a.waitLog("Rolled back: removed the failed target", 60*time.Second)
		loop.RequireNoFailures(t, "during the failed switch and its rollback")
		if ready == nil || ready.Reason != contract.ReasonVerificationFailed || !strings.Contains(ready.Message, "iptables keeps serving") {
			t.Errorf("Ready condition %+v; want reason VerificationFailed saying iptables keeps serving", ready)
		}
		if pn.Status.ActiveMode != v1alpha1.ModeIPTables {
			t.Errorf("active mode %s, want iptables", pn.Status.ActiveMode)
		}
		w.requireOnly(v1alpha1.ModeIPTables)
		w.requireTraffic()
		a.stop()
	})

	t.Run("failure-held-across-restart", func(t *testing.T) {
		a := w.startAgent()
		a.waitLog("Switcher starting", 20*time.Second)
		time.Sleep(2 * time.Second)
		pn := w.proxyNode()
		if pn.Status.Phase != v1alpha1.NodeFailed || pn.Status.ActiveMode != v1alpha1.ModeIPTables {
			t.Errorf("a restarted agent retried the failed switch: %s", statusText(pn))
		}
		w.requireOnly(v1alpha1.ModeIPTables)
		w.desire(v1alpha1.ModeNFTables) // a new spec tries again
		w.waitActive(v1alpha1.ModeNFTables)
		w.requireOnly(v1alpha1.ModeNFTables)
		w.requireTraffic()
	})
}

// extraCIDR is a cluster CIDR the settings tests add and remove; the
// iptables mode programs extraRule for it.
const extraCIDR = "198.19.200.0/24"

var extraRule = "-s " + extraCIDR + " -j RETURN"

// servingIPTables has an agent serve iptables with cidrs as the cluster
// CIDRs, and stops it.
func (w *world) servingIPTables(cidrs ...v1alpha1.CIDR) {
	w.t.Helper()
	a := w.startAgent()
	w.settings(v1alpha1.ProxySettings{ClusterCIDRs: cidrs})
	w.waitActive(v1alpha1.ModeIPTables)
	a.stop()
}

// requireRolledBack waits for the change the spec last written asks for
// to fail verification (the agent runs with --test-fail-verify) and for
// iptables to serve again with cidrs, as status.activeSettings says and
// the kernel holds (extraRule exactly when cidrs has extraCIDR).
func (w *world) requireRolledBack(cidrs []v1alpha1.CIDR) {
	w.t.Helper()
	if _, ready := w.waitFailed(); ready == nil || ready.Reason != contract.ReasonVerificationFailed {
		w.t.Errorf("Ready condition %+v; want reason VerificationFailed", ready)
	}
	w.waitStatus("iptables serving with the settings it served with", 30*time.Second, func(pn *v1alpha1.ProxyNode) bool {
		s := pn.Status.ActiveSettings
		return pn.Status.ActiveMode == v1alpha1.ModeIPTables && s != nil && slices.Equal(s.ClusterCIDRs, cidrs)
	})
	want := slices.Contains(cidrs, extraCIDR)
	for deadline := time.Now().Add(30 * time.Second); strings.Contains(w.iptablesSave(), extraRule) != want; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			w.t.Fatalf("30 s after the failure, the kernel holding %q is %v; want %v (the settings that served)", extraRule, !want, want)
		}
	}
}

// TestFailedSettingsChangeHeldAcrossRestart changes the settings of the
// serving iptables mode (one more cluster CIDR) with Verifying failing:
// the old rules are synced back, status Failed keeps the settings that
// serve in activeSettings, and an agent restarted while the failure is
// held programs those, not the spec's that failed (it used to rebuild
// the mode from the spec and write them unverified with its first sync).
// A new spec tries the change again.
func TestFailedSettingsChangeHeldAcrossRestart(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	podCIDR := v1alpha1.CIDR(netlab.PodCIDR.String())
	rule := extraRule
	w.servingIPTables(podCIDR)

	a := w.startAgent("--test-fail-verify")
	a.waitLog("proxyshift-agent running", 20*time.Second)
	w.settings(v1alpha1.ProxySettings{ClusterCIDRs: []v1alpha1.CIDR{podCIDR, extraCIDR}})
	w.requireRolledBack([]v1alpha1.CIDR{podCIDR})
	a.stop()

	a = w.startAgent()
	a.waitLog("Synced proxy rules", 30*time.Second) // the first sync, a full one
	pn := w.proxyNode()
	if pn.Status.Phase != v1alpha1.NodeFailed {
		t.Errorf("a restarted agent retried the failed change: %s", statusText(pn))
	}
	if strings.Contains(w.iptablesSave(), rule) {
		t.Errorf("a restarted agent programmed the settings whose change failed and is held (%q)", rule)
	}
	w.requireTraffic()

	w.settings(v1alpha1.ProxySettings{ClusterCIDRs: []v1alpha1.CIDR{podCIDR, extraCIDR}}) // a new spec tries again
	w.waitActive(v1alpha1.ModeIPTables)
	if !strings.Contains(w.iptablesSave(), rule) {
		t.Errorf("the new spec's settings are not programmed (%q)", rule)
	}
}

// TestSettingsChangedWhileAgentDownAreVerified changes the settings of
// the serving iptables mode (one more cluster CIDR) while no agent runs,
// and starts one whose Verifying fails: it serves what the previous agent
// served first, then tries the spec's change as a switch does, fails it
// and rolls it back, so the kernel never keeps the unverified settings.
// (A restarted agent used to build the mode from the new spec and write
// it with its first sync, unverified, and report it Active.)
func TestSettingsChangedWhileAgentDownAreVerified(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	podCIDR := v1alpha1.CIDR(netlab.PodCIDR.String())
	w.servingIPTables(podCIDR)

	w.settings(v1alpha1.ProxySettings{ClusterCIDRs: []v1alpha1.CIDR{podCIDR, extraCIDR}})
	a := w.startAgent("--test-fail-verify")
	w.requireRolledBack([]v1alpha1.CIDR{podCIDR})
	a.waitLog("serving what the previous agent served first", time.Second)
	w.requireTraffic()
}

// TestResumedSwitchRebuildsTheOldModeAsItServed kills the agent while it
// switches from iptables (with one more cluster CIDR) to nftables with a
// spec whose settings leave that CIDR out, and restarts it with Verifying
// failing: the resumed switch rebuilds iptables with the settings it
// served with (status.activeSettings), so the rules that keep serving
// do not change, and the rollback restores them as they were. (A resumed
// switch used to rebuild iptables from the new spec and write that,
// unverified, with its first sync.)
func TestResumedSwitchRebuildsTheOldModeAsItServed(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	podCIDR := v1alpha1.CIDR(netlab.PodCIDR.String())
	served := []v1alpha1.CIDR{podCIDR, extraCIDR}
	w.servingIPTables(served...)

	hung := w.startAgent("--test-stop-at-phase=" + string(v1alpha1.NodeProgramming))
	w.waitActive(v1alpha1.ModeIPTables)
	if !strings.Contains(w.iptablesSave(), extraRule) {
		t.Fatalf("setup: iptables lacks the served settings' %q", extraRule)
	}
	w.writeSpec(func(s *v1alpha1.ProxyNodeSpec) {
		s.DesiredMode = v1alpha1.ModeNFTables
		s.Settings = v1alpha1.ProxySettings{ClusterCIDRs: []v1alpha1.CIDR{podCIDR}}
	})
	hung.waitLog("Test hook: stopping at phase", 60*time.Second)
	hung.kill9()

	w.startAgent("--test-fail-verify")
	w.requireRolledBack(served)
	w.requireTraffic()
}
