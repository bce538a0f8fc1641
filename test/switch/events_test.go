package switchtest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// story lists, as `kubectl get events --field-selector
// involvedObject.kind=ProxyNode,involvedObject.name=NODE` does, the
// events of the switch to mode, oldest first, as "Type Reason: message".
func (w *world) story(mode v1alpha1.ProxyMode) []string {
	w.t.Helper()
	l, err := w.kube.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=ProxyNode,involvedObject.name=" + nodeName,
	})
	if err != nil {
		w.t.Fatal(err)
	}
	var evs []corev1.Event
	for _, e := range l.Items {
		if e.Action == "Switch to "+string(mode) {
			evs = append(evs, e)
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].EventTime.Before(&evs[j].EventTime) })
	pn := w.proxyNode()
	var out []string
	for _, e := range evs {
		if e.InvolvedObject.UID != pn.UID || e.Related == nil || e.Related.Kind != "Node" || e.Related.Name != nodeName ||
			e.ReportingController != "network.proxyshift.io/agent" {
			w.t.Errorf("event %s is about %+v (related %+v) from %s; want ProxyNode %s (uid %s), its Node, the agent",
				e.Name, e.InvolvedObject, e.Related, e.ReportingController, nodeName, pn.UID)
		}
		out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
	}
	return out
}

// waitStory waits until the events of the switch to mode have the
// reasons want, in order, and returns them.
func (w *world) waitStory(mode v1alpha1.ProxyMode, want ...string) []string {
	w.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := w.story(mode)
		var reasons []string
		for _, e := range got {
			reasons = append(reasons, strings.SplitN(strings.SplitN(e, ": ", 2)[0], " ", 2)[1])
		}
		if strings.Join(reasons, ",") == strings.Join(want, ",") {
			return got
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("the events of the switch to %s are\n  %s\nwant the reasons %v", mode, strings.Join(got, "\n  "), want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// requireSaid checks that event i of a story says each of words.
func requireSaid(t *testing.T, story []string, i int, words ...string) {
	t.Helper()
	for _, w := range words {
		if !strings.Contains(story[i], w) {
			t.Errorf("event %q does not say %q", story[i], w)
		}
	}
}

// TestSwitchEvents: the events about a node's ProxyNode tell a switch's
// story, phase by phase with what was removed, and a failed switch's.
func TestSwitchEvents(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	a := w.startAgent()
	w.waitActive(v1alpha1.ModeIPTables)

	w.desire(v1alpha1.ModeNFTables)
	w.waitActive(v1alpha1.ModeNFTables)
	s := w.waitStory(v1alpha1.ModeNFTables, "Preparing", "Programming", "Verifying", "CleaningUp", "CleanedUp", "Active")
	requireSaid(t, s, 0, "Normal", "switching from iptables to nftables", "loading the kernel modules nftables needs")
	requireSaid(t, s, 1, "programming nftables next to iptables, which keeps serving")
	requireSaid(t, s, 2, "verifying nftables", "probing the services")
	requireSaid(t, s, 3, "nftables verified; removing iptables")
	requireSaid(t, s, 4, "removed the objects of iptables (", "PROXYSHIFT")
	requireSaid(t, s, 5, "nftables serves the node")
	a.stop()

	w.startAgent("--test-fail-verify")
	w.desire(v1alpha1.ModeIPTables)
	w.waitFailed()
	// The agent's first switch, to iptables from nothing, then the
	// failed one (a new agent process, so no event is folded into the
	// first switch's).
	s = w.waitStory(v1alpha1.ModeIPTables, "Preparing", "Programming", "Verifying", "CleaningUp", "Active",
		"Preparing", "Programming", "Verifying", contract.ReasonVerificationFailed, "Failed", "RolledBack")
	requireSaid(t, s, 0, "switching from nothing to iptables")
	requireSaid(t, s, 5, "switching from nftables to iptables")
	requireSaid(t, s, 8, "Warning", "Verifying failed: verification failed on purpose", "nftables keeps serving")
	requireSaid(t, s, 9, "Warning", "the switch to iptables failed (VerificationFailed); nftables serves the node")
	requireSaid(t, s, 10, "Normal", "removed the objects of the failed target iptables (", "PROXYSHIFT")
}
