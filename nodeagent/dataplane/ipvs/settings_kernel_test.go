package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestVMTimeouts checks that a full sync sets the timeouts it is given,
// reading them back from the kernel, that a zero timeout leaves the
// kernel's, and that other namespaces keep theirs.
func TestVMTimeouts(t *testing.T) {
	lab, pods := newLab(t, 1)
	h := rawHandle(t, lab)
	client, err := libipvs.New(fmt.Sprintf("/proc/self/fd/%d", lab.Client.NS.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	untouched, err := client.GetConfig()
	if err != nil {
		t.Fatal(err)
	}
	m := snapshotOf(labService("web", "198.19.0.80", pods...))

	want := Timeouts{TCP: 17 * time.Minute, TCPFin: 33 * time.Second, UDP: 44 * time.Second}
	mustSync(t, newLabBackend(t, lab, WithTimeouts(want)), dataplane.SyncRequest{Model: m, Full: true})
	got, err := h.GetConfig()
	if err != nil {
		t.Fatal(err)
	}
	if (Timeouts{got.TimeoutTCP, got.TimeoutTCPFin, got.TimeoutUDP}) != want {
		t.Errorf("the kernel's timeouts are %+v, want %+v", *got, want)
	}

	mustSync(t, newLabBackend(t, lab, WithTimeouts(Timeouts{UDP: 55 * time.Second})), dataplane.SyncRequest{Model: m, Full: true})
	want.UDP = 55 * time.Second
	if got, err = h.GetConfig(); err != nil || (Timeouts{got.TimeoutTCP, got.TimeoutTCPFin, got.TimeoutUDP}) != want {
		t.Errorf("after setting udp only, the kernel's timeouts are %+v, %v; want %+v", got, err, want)
	}
	if got, err := client.GetConfig(); err != nil || *got != *untouched {
		t.Errorf("another namespace's timeouts changed from %+v to %+v, %v", *untouched, got, err)
	}
}

// TestVMExcludedVirtualServicesSurvive checks that virtual services of
// the backend's own in an excluded CIDR are never deleted: not when their
// service goes (incremental sync), not by a full sync after a restart,
// not by Cleanup; while the others are, and the excluded ones serve as
// usual while wanted.
func TestVMExcludedVirtualServicesSurvive(t *testing.T) {
	lab, pods := newLab(t, 1)
	h := rawHandle(t, lab)
	excl := WithExcludeCIDRs(netip.MustParsePrefix("198.19.0.88/30"))
	gone := labService("gone", "198.19.0.89", pods...)
	stale := labService("stale", "198.19.0.90", pods...)
	plain := labService("plain", "198.19.0.85", pods...)
	b := newLabBackend(t, lab, excl)
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(gone, stale, plain), Full: true})
	if tally := lab.Client.NS.Spread(netlab.TCP, vip("198.19.0.89"), 5, okTimeout); tally.Answered() != 5 {
		t.Errorf("the excluded CIDR's service: %v; want every connection answered", tally)
	}
	present := func(step string, want ...string) {
		t.Helper()
		dump := dumpIPVS(t, h)
		var got []string
		for _, ip := range []string{"198.19.0.85", "198.19.0.89", "198.19.0.90"} {
			if strings.Contains(dump, "tcp/"+ip+":80 ") {
				got = append(got, ip)
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("after %s, virtual services at %v; want %v:\n%s", step, got, want, dump)
		}
	}

	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(stale),
		Changed: model.ChangeSet{gone.Name: {}, plain.Name: {}}})
	present("deleting two services", "198.19.0.89", "198.19.0.90")

	// A restart, and stale went meanwhile: found by its record, kept.
	b = newLabBackend(t, lab, excl)
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(plain), Full: true})
	present("a full sync after a restart", "198.19.0.85", "198.19.0.89", "198.19.0.90")

	if _, err := b.Cleanup(context.Background()); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	present("cleanup", "198.19.0.89", "198.19.0.90")
}
