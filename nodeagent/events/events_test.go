package events

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
)

// A flapping node's events are bounded: a burst, then one per interval;
// a long message is cut to what the API server accepts.
func TestBoundedAndCut(t *testing.T) {
	fake := events.NewFakeRecorder(100)
	r := newRecorder(fake, "node-a", func() types.UID { return "uid-a" }, 3, time.Hour)
	r.Normal("Preparing", "Switch to nftables", strings.Repeat("x", 2000))
	for i := 0; i < 10; i++ {
		r.Warning("VerificationFailed", "Switch to nftables", "probe failed")
	}
	close(fake.Events)
	var got []string
	for e := range fake.Events {
		got = append(got, e)
	}
	if len(got) != 3 {
		t.Fatalf("%d events recorded, want the burst of 3: %q", len(got), got)
	}
	if want := "Normal Preparing " + strings.Repeat("x", maxNote-3) + "..."; got[0] != want {
		t.Errorf("first event %q (%d bytes), want it cut to %d bytes", got[0][:40], len(got[0]), maxNote)
	}
	if got[1] != "Warning VerificationFailed probe failed" || r.dropped != 8 {
		t.Errorf("events %q, dropped %d", got[1:], r.dropped)
	}
}
