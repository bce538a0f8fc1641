package model

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// modelLines renders a snapshot as sorted "name family ..." lines.
func modelLines(s *Snapshot) []string {
	var out []string
	for _, byName := range s.Ports {
		for name, sp := range byName {
			out = append(out, name.String()+" "+summary(sp))
		}
	}
	slices.Sort(out)
	return out
}

func changeNames(cs ChangeSet) []string {
	var out []string
	for name := range cs {
		out = append(out, name.String())
	}
	slices.Sort(out)
	return out
}

func signalled(tr *Tracker) bool {
	select {
	case <-tr.Changed():
		return true
	default:
		return false
	}
}

func TestTracker(t *testing.T) {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	tcp := corev1.ProtocolTCP
	twoPorts := withPorts(svcPort("http", 80, tcp), svcPort("metrics", 9090, tcp))
	httpSlice := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return slice("web-http", v4, http(8080), eps...)
	}
	metricsSlice := slice("web-metrics", v4, ports(port("metrics", 9100, tcp)), ep("10.1.0.1"))
	relabelled := func(s *discoveryv1.EndpointSlice, svc string) *discoveryv1.EndpointSlice {
		s = s.DeepCopy()
		s.Labels[discoveryv1.LabelServiceName] = svc
		return s
	}
	otherService := func(s *corev1.Service) { s.Name = "api" }

	tests := []struct {
		name string
		// setup runs before the first Snapshot, events after it; the
		// second Snapshot is checked.
		setup, events func(*Tracker)
		wantChanged   []string
		wantModel     []string
	}{{
		name:        "slice before its service: nothing until the service arrives",
		events:      func(tr *Tracker) { tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1")))) },
		wantChanged: nil,
		wantModel:   nil,
	}, {
		name:        "slice picked up when its service arrives",
		setup:       func(tr *Tracker) { tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1")))) },
		events:      func(tr *Tracker) { tr.OnServiceAdd(service()) },
		wantChanged: []string{"ns/web:http/TCP"},
		wantModel:   []string{"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name: "updates that change nothing",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service())
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"))))
		},
		events: func(tr *Tracker) {
			tr.OnServiceUpdate(service(func(s *corev1.Service) {
				s.ResourceVersion = "2"
				s.Annotations = map[string]string{"note": "irrelevant"}
			}))
			s := httpSlice(ep("10.1.0.1"))
			s.ResourceVersion = "2"
			tr.OnEndpointSliceUpdate(SliceOf(s))
			tr.OnEndpointSliceDelete(SliceOf(slice("never-seen", v4, nil)))
			tr.OnServiceDelete(service(otherService))
		},
		wantChanged: nil,
		wantModel:   []string{"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name: "endpoint removed: only its port changed",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service(twoPorts))
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"), ep("10.1.0.2"))))
			tr.OnEndpointSliceAdd(SliceOf(metricsSlice))
		},
		events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(SliceOf(httpSlice(ep("10.1.0.2")))) },
		wantChanged: []string{"ns/web:http/TCP"},
		wantModel: []string{
			"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.2:8080",
			"ns/web:metrics/TCP IPv4 10.0.0.1:9090/TCP np=0 eps=10.1.0.1:9100",
		},
	}, {
		name: "endpoint condition changed",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service())
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"))))
		},
		events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(SliceOf(httpSlice(ep("10.1.0.1", draining)))) },
		wantChanged: []string{"ns/web:http/TCP"},
		wantModel:   []string{"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name: "slice deleted",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service(twoPorts))
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"))))
			tr.OnEndpointSliceAdd(SliceOf(metricsSlice))
		},
		events:      func(tr *Tracker) { tr.OnEndpointSliceDelete(SliceOf(metricsSlice)) },
		wantChanged: []string{"ns/web:metrics/TCP"},
		wantModel: []string{
			"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080",
			"ns/web:metrics/TCP IPv4 10.0.0.1:9090/TCP np=0 eps=",
		},
	}, {
		name: "service deleted: its names reported and gone",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service(dualStack, twoPorts))
			tr.OnServiceAdd(service(otherService))
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"))))
		},
		events:      func(tr *Tracker) { tr.OnServiceDelete(service(dualStack, twoPorts)) },
		wantChanged: []string{"ns/web:http/TCP", "ns/web:metrics/TCP"},
		wantModel:   []string{"ns/api:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps="},
	}, {
		name: "service deleted and added again keeps its slices",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service())
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"))))
		},
		events: func(tr *Tracker) {
			tr.OnServiceDelete(service())
			tr.OnServiceAdd(service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.0.0.2", []string{"10.0.0.2"} }))
		},
		wantChanged: []string{"ns/web:http/TCP"},
		wantModel:   []string{"ns/web:http/TCP IPv4 10.0.0.2:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name:  "service port removed",
		setup: func(tr *Tracker) { tr.OnServiceAdd(service(twoPorts)) },
		events: func(tr *Tracker) {
			tr.OnServiceUpdate(service())
		},
		wantChanged: []string{"ns/web:metrics/TCP"},
		wantModel:   []string{"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps="},
	}, {
		name:  "service becomes headless",
		setup: func(tr *Tracker) { tr.OnServiceAdd(service()) },
		events: func(tr *Tracker) {
			tr.OnServiceUpdate(service(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }))
		},
		wantChanged: []string{"ns/web:http/TCP"},
		wantModel:   nil,
	}, {
		name: "service handed to another proxy",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service(twoPorts))
		},
		events: func(tr *Tracker) {
			tr.OnServiceUpdate(service(twoPorts, func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} }))
		},
		wantChanged: []string{"ns/web:http/TCP", "ns/web:metrics/TCP"},
		wantModel:   nil,
	}, {
		name: "IPv6 endpoints changed in a dual-stack service",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service(dualStack))
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"))))
			tr.OnEndpointSliceAdd(SliceOf(slice("web-v6", v6, http(8080), ep("fd01::1"))))
		},
		events: func(tr *Tracker) {
			tr.OnEndpointSliceUpdate(SliceOf(slice("web-v6", v6, http(8080), ep("fd01::1"), ep("fd01::2"))))
		},
		wantChanged: []string{"ns/web:http/TCP"},
		wantModel: []string{
			"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080",
			"ns/web:http/TCP IPv6 [fd00::1]:80/TCP np=0 eps=[fd01::1]:8080,[fd01::2]:8080",
		},
	}, {
		name: "slice relabelled to another service",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service())
			tr.OnServiceAdd(service(otherService))
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"))))
		},
		events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(SliceOf(relabelled(httpSlice(ep("10.1.0.1")), "api"))) },
		wantChanged: []string{"ns/api:http/TCP", "ns/web:http/TCP"},
		wantModel: []string{
			"ns/api:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080",
			"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps=",
		},
	}, {
		name: "slice loses its service label",
		setup: func(tr *Tracker) {
			tr.OnServiceAdd(service())
			tr.OnEndpointSliceAdd(SliceOf(httpSlice(ep("10.1.0.1"))))
		},
		events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(SliceOf(relabelled(httpSlice(ep("10.1.0.1")), ""))) },
		wantChanged: []string{"ns/web:http/TCP"},
		wantModel:   []string{"ns/web:http/TCP IPv4 10.0.0.1:80/TCP np=0 eps="},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(node, nil)
			if tt.setup != nil {
				tt.setup(tr)
			}
			tr.Snapshot()
			tt.events(tr)
			if got := signalled(tr); got != (len(tt.wantChanged) > 0) {
				t.Errorf("Changed signalled = %v, want %v", got, len(tt.wantChanged) > 0)
			}
			snap, changes := tr.Snapshot()
			if got := changeNames(changes); !slices.Equal(got, tt.wantChanged) {
				t.Errorf("changes = %v, want %v", got, tt.wantChanged)
			}
			if got := modelLines(snap); !slices.Equal(got, tt.wantModel) {
				t.Errorf("model\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.wantModel, "\n"))
			}
			if _, again := tr.Snapshot(); len(again) != 0 {
				t.Errorf("second Snapshot changes = %v, want none", changeNames(again))
			}
		})
	}
}

// snapshottedTracker is a tracker holding one service with one endpoint,
// 10.1.0.1, and the Snapshot taken of it.
func snapshottedTracker() (*Tracker, *Snapshot) {
	tr := NewTracker(node, nil)
	tr.OnServiceAdd(service())
	tr.OnEndpointSliceAdd(SliceOf(slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1"))))
	snap, _ := tr.Snapshot()
	return tr, snap
}

// moveTheEndpoint moves snapshottedTracker's endpoint to 10.1.0.2.
func moveTheEndpoint(tr *Tracker) {
	tr.OnEndpointSliceUpdate(SliceOf(slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.2"))))
}

func TestTrackerSnapshotIsolation(t *testing.T) {
	tr, first := snapshottedTracker()
	before := modelLines(first)

	moveTheEndpoint(tr)
	tr.OnServiceAdd(service(func(s *corev1.Service) { s.Name = "api" }))
	second, _ := tr.Snapshot()

	if after := modelLines(first); !slices.Equal(before, after) {
		t.Errorf("earlier snapshot changed:\n%s\nwas\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if got := len(modelLines(second)); got != 2 {
		t.Errorf("new snapshot has %d ports, want 2", got)
	}
}

// TestTrackerCopiesAheadOfTheNextWrite checks that the copy of the model
// the next write needs is started once the sync of a Snapshot has ended
// (Synced), not while it runs, so that the write finds it made, and that
// the copy is the one the write then changes: the snapshot keeps what it
// held, and the next one has the change.
func TestTrackerCopiesAheadOfTheNextWrite(t *testing.T) {
	tr, first := snapshottedTracker()
	time.Sleep(10 * time.Millisecond)
	tr.mu.Lock()
	copying := tr.copying
	tr.mu.Unlock()
	if copying || len(tr.spare) != 0 {
		t.Fatal("a Snapshot started a copy of the model while its sync runs")
	}
	tr.Synced()
	deadline := time.Now().Add(10 * time.Second)
	for len(tr.spare) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if len(tr.spare) != 1 {
		t.Fatalf("10 s after Synced, no copy of the model is ready for the next write")
	}
	before := modelLines(first)
	moveTheEndpoint(tr)
	if len(tr.spare) != 0 {
		t.Errorf("the write did not take the copy made ahead")
	}
	second, changes := tr.Snapshot()
	if after := modelLines(first); !slices.Equal(before, after) {
		t.Errorf("the snapshot before the write changed:\n%s\nwas\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if got := modelLines(second); slices.Equal(got, before) || len(changes) != 1 {
		t.Errorf("the snapshot after the write holds\n%s\nwith changes %v; want the moved endpoint", strings.Join(got, "\n"), changeNames(changes))
	}
}

// A write that comes while the sync of a Snapshot still runs (no Synced
// yet) copies the model itself: the snapshot keeps what it held.
func TestTrackerWriteBeforeSyncedCopies(t *testing.T) {
	tr, first := snapshottedTracker()
	before := modelLines(first)
	moveTheEndpoint(tr)
	tr.Synced() // nothing is shared any more: no copy to make
	if len(tr.spare) != 0 || tr.copying {
		t.Errorf("Synced after the write started a copy nothing needs")
	}
	second, _ := tr.Snapshot()
	if after := modelLines(first); !slices.Equal(before, after) {
		t.Errorf("the snapshot before the write changed:\n%s\nwas\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if got := modelLines(second); slices.Equal(got, before) {
		t.Errorf("the snapshot after the write does not have the moved endpoint:\n%s", strings.Join(got, "\n"))
	}
}

func TestTrackerSignalCoalesces(t *testing.T) {
	tr := NewTracker(node, nil)
	tr.OnServiceAdd(service())
	tr.OnServiceAdd(service(func(s *corev1.Service) { s.Name = "api" }))
	if !signalled(tr) || signalled(tr) {
		t.Fatal("want exactly one pending signal for two changes")
	}
	tr.OnServiceDelete(service())
	tr.Snapshot()
	if signalled(tr) {
		t.Error("signal still pending after Snapshot took the changes")
	}
}

func TestTrackerReportsErrorsOnce(t *testing.T) {
	var got []string
	tr := NewTracker(node, func(err error) { got = append(got, err.Error()) })
	bad := func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"nope"} }

	tr.OnServiceAdd(service(bad))
	tr.OnServiceUpdate(service(bad))
	tr.OnEndpointSliceAdd(SliceOf(slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1"))))
	if want := []string{`service ns/web: spec.externalIPs[0] "nope": not an IP address`}; !slices.Equal(got, want) {
		t.Fatalf("reported %q, want %q", got, want)
	}

	got = nil
	tr.OnEndpointSliceUpdate(SliceOf(slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1"), ep("x"))))
	if len(got) != 2 || !strings.Contains(got[1], `endpointslice a: endpoints[1].addresses[0] "x"`) {
		t.Fatalf("after a new error reported %q, want both errors again", got)
	}

	got = nil
	tr.OnServiceUpdate(service())
	tr.OnEndpointSliceUpdate(SliceOf(slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1"))))
	tr.OnServiceUpdate(service(bad))
	if len(got) != 2 || !strings.Contains(got[1], "spec.externalIPs[0]") {
		t.Errorf("after the errors were fixed and came back, reported %q, want them again", got)
	}
}

// TestTrackerConcurrent is for the race detector: events and snapshots
// from several goroutines, with snapshots read while events continue.
func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker(node, func(error) {})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				name := fmt.Sprintf("svc-%d", i%7)
				s := service(func(s *corev1.Service) { s.Name = name })
				sl := slice(fmt.Sprintf("%s-%d", name, g), discoveryv1.AddressTypeIPv4, http(8080), ep(fmt.Sprintf("10.1.%d.%d", g, i%5)))
				sl.Labels[discoveryv1.LabelServiceName] = name
				tr.OnServiceAdd(s)
				tr.OnEndpointSliceUpdate(SliceOf(sl))
				if i%10 == 0 {
					tr.OnServiceDelete(s)
				}
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			snap, _ := tr.Snapshot()
			for _, byName := range snap.Ports {
				for _, sp := range byName {
					_ = sp.ClusterEndpoints()
				}
			}
		}
	})
	wg.Wait()

	// The last event of every service added it, with one slice per goroutine.
	snap, _ := tr.Snapshot()
	if got := len(snap.Ports[corev1.IPv4Protocol]); got != 7 {
		t.Errorf("model has %d ports, want 7", got)
	}
	for name, sp := range snap.Ports[corev1.IPv4Protocol] {
		if len(sp.Endpoints) != 4 {
			t.Errorf("%s: %d endpoints, want one per goroutine", name, len(sp.Endpoints))
		}
	}
}

func TestTrackerIgnoresNil(t *testing.T) {
	tr := NewTracker(node, nil)
	tr.OnServiceAdd(nil)
	tr.OnServiceDelete(nil)
	tr.OnEndpointSliceAdd(SliceOf(nil))
	tr.OnEndpointSliceDelete(SliceOf(nil))
	if snap, changes := tr.Snapshot(); len(changes) != 0 || len(modelLines(snap)) != 0 {
		t.Errorf("nil events changed the model: %v", changeNames(changes))
	}
}

// TestDeferUntilSnapshot: after DeferUntilSnapshot the events build
// nothing (no model, no errors) until the next Snapshot, which holds the
// same model as a tracker that built at every event and reports the
// errors once; from then on every event builds again.
func TestDeferUntilSnapshot(t *testing.T) {
	var got []string
	tr := NewTracker(node, func(err error) { got = append(got, err.Error()) })
	tr.DeferUntilSnapshot()
	each := NewTracker(node, nil)
	bad := func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"nope"} }
	for _, feed := range []*Tracker{tr, each} {
		feed.OnServiceAdd(service(bad))
		feed.OnEndpointSliceAdd(SliceOf(slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1"))))
		feed.OnEndpointSliceAdd(SliceOf(slice("b", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.2"))))
	}
	if len(tr.built) != 0 || len(tr.ports[corev1.IPv4Protocol]) != 0 || len(got) != 0 {
		t.Fatalf("before the Snapshot: %d services built, %d ports, errors %q; want none", len(tr.built), len(tr.ports[corev1.IPv4Protocol]), got)
	}
	select {
	case <-tr.Changed():
	default:
		t.Fatal("the deferred events did not signal Changed")
	}

	snap, changes := tr.Snapshot()
	want, wantChanges := each.Snapshot()
	if !reflect.DeepEqual(snap.Ports, want.Ports) || !reflect.DeepEqual(changes, wantChanges) {
		t.Errorf("deferred Snapshot:\n%+v %v\nbuilt at each event:\n%+v %v", snap.Ports, changes, want.Ports, wantChanges)
	}
	if eps := snap.Ports[corev1.IPv4Protocol][ServicePortName{Namespace: "ns", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}]; eps == nil || len(eps.Endpoints) != 2 {
		t.Errorf("web's port in the deferred Snapshot: %+v, want both slices' endpoints", eps)
	}
	if want := []string{`service ns/web: spec.externalIPs[0] "nope": not an IP address`}; !slices.Equal(got, want) {
		t.Errorf("the Snapshot reported %q, want %q", got, want)
	}

	got = nil
	tr.OnEndpointSliceUpdate(SliceOf(slice("b", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.3"))))
	if _, changes := tr.Snapshot(); len(changes) != 1 || len(tr.deferred) != 0 {
		t.Errorf("an event after the Snapshot left changes %v (deferred %d), want web's port, built at the event", changes, len(tr.deferred))
	}
	if len(got) != 0 {
		t.Errorf("the unchanged errors were reported again: %q", got)
	}
}
