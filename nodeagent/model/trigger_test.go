package model

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// triggered returns s with its last-change-trigger-time set to at.
func triggered(s *discoveryv1.EndpointSlice, at time.Time) *discoveryv1.EndpointSlice {
	s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
	return s
}

func TestTrackerTriggers(t *testing.T) {
	start := time.Now().Add(-time.Minute)
	at := start.Add(30 * time.Second)
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	tests := []struct {
		name   string
		events func(*Tracker)
		want   []Trigger
	}{{
		name: "a slice's trigger time, with its family",
		events: func(tr *Tracker) {
			tr.OnEndpointSliceAdd(SliceOf(triggered(slice("web-v6", v6, http(8080), ep("fd00::1")), at)))
		},
		want: []Trigger{{Family: corev1.IPv6Protocol, Time: at}},
	}, {
		name:   "no annotation: not measured",
		events: func(tr *Tracker) { tr.OnEndpointSliceAdd(SliceOf(slice("web-http", v4, http(8080), ep("10.1.0.1")))) },
	}, {
		name: "triggered before the tracker started: not measured",
		events: func(tr *Tracker) {
			tr.OnEndpointSliceAdd(SliceOf(triggered(slice("web-http", v4, http(8080), ep("10.1.0.1")), start.Add(-time.Second))))
		},
	}, {
		name: "unparseable annotation: not measured",
		events: func(tr *Tracker) {
			s := slice("web-http", v4, http(8080), ep("10.1.0.1"))
			s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "yesterday"}
			tr.OnEndpointSliceAdd(SliceOf(s))
		},
	}, {
		name: "FQDN slices: not measured",
		events: func(tr *Tracker) {
			tr.OnEndpointSliceAdd(SliceOf(triggered(slice("web-fqdn", discoveryv1.AddressTypeFQDN, http(8080), ep("a.example")), at)))
		},
	}, {
		name: "every update of a slice is measured",
		events: func(tr *Tracker) {
			tr.OnEndpointSliceAdd(SliceOf(triggered(slice("web-http", v4, http(8080), ep("10.1.0.1")), at)))
			tr.OnEndpointSliceUpdate(SliceOf(triggered(slice("web-http", v4, http(8080), ep("10.1.0.2")), at.Add(time.Second))))
		},
		want: []Trigger{{Family: corev1.IPv4Protocol, Time: at}, {Family: corev1.IPv4Protocol, Time: at.Add(time.Second)}},
	}, {
		name: "a deleted slice's changes are not measured",
		events: func(tr *Tracker) {
			s := triggered(slice("web-http", v4, http(8080), ep("10.1.0.1")), at)
			tr.OnEndpointSliceAdd(SliceOf(s))
			tr.OnEndpointSliceDelete(SliceOf(s))
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker("node-a", nil)
			tr.start = start
			tr.OnServiceAdd(service())
			tr.Snapshot()
			tc.events(tr)
			snap, _ := tr.Snapshot()
			if len(snap.Triggers) != len(tc.want) {
				t.Fatalf("triggers %v, want %v", snap.Triggers, tc.want)
			}
			for i, w := range tc.want {
				if g := snap.Triggers[i]; g.Family != w.Family || !g.Time.Equal(w.Time) {
					t.Errorf("trigger %d = %v, want %v", i, g, w)
				}
			}
			if snap, _ := tr.Snapshot(); len(snap.Triggers) != 0 {
				t.Errorf("the next snapshot has the triggers again: %v", snap.Triggers)
			}
		})
	}
}

// countingObserver counts the calls of each Observer method.
type countingObserver struct{ services, slices, queued int }

func (o *countingObserver) ServiceChange()       { o.services++ }
func (o *countingObserver) EndpointSliceChange() { o.slices++ }
func (o *countingObserver) Queued()              { o.queued++ }

func TestTrackerObserver(t *testing.T) {
	tr := NewTracker("node-a", nil)
	o := &countingObserver{}
	tr.Observe(o)
	s := slice("web-http", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1"))
	tr.OnEndpointSliceAdd(SliceOf(s)) // its service is not known yet: nothing to sync
	tr.OnServiceAdd(service())
	tr.Snapshot()
	tr.OnServiceUpdate(service()) // no change: nothing to sync
	unlabelled := s.DeepCopy()
	unlabelled.Name, unlabelled.Labels = "stray", nil
	tr.OnEndpointSliceAdd(SliceOf(unlabelled))
	tr.OnEndpointSliceAdd(SliceOf(slice("web-fqdn", discoveryv1.AddressTypeFQDN, http(8080), ep("a.example"))))
	tr.OnEndpointSliceDelete(SliceOf(s))
	if *o != (countingObserver{services: 2, slices: 2, queued: 2}) {
		t.Errorf("observed %+v, want 2 service events, 2 slice events (not the stray or FQDN one), 2 queued", *o)
	}
}
