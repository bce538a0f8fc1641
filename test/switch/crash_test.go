package switchtest

import (
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// TestKillInEveryPhase kills the agent (SIGKILL) once it has done the
// work of each phase of a switch, in both directions between iptables
// and nftables, then starts a new agent: it must converge to the desired
// mode with nothing of the other left, while new connections never fail,
// not even while no agent runs.
func TestKillInEveryPhase(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	a := w.startAgent()
	w.waitActive(v1alpha1.ModeIPTables)
	w.requireTraffic()
	a.stop()
	current := v1alpha1.ModeIPTables
	for _, phase := range []v1alpha1.NodePhase{v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeCleaningUp} {
		for range 2 {
			to := other(current)
			t.Run(string(current)+"-to-"+string(to)+"-killed-in-"+string(phase), func(t *testing.T) {
				hung := w.startAgent("--test-stop-at-phase=" + string(phase))
				w.waitActive(current)
				loop := w.startClientLoop()
				w.desire(to)
				hung.waitLog("Test hook: stopping at phase", 60*time.Second)
				hung.kill9()
				time.Sleep(500 * time.Millisecond) // no agent at all now

				next := w.startAgent()
				w.waitActive(to)
				time.Sleep(300 * time.Millisecond)
				loop.RequireNoFailures(t, "across the kill and the restart")
				w.requireOnly(to)
				w.requireTraffic()
				next.stop()
			})
			current = to
		}
	}
}
