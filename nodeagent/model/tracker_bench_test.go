package model

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// BenchmarkEndpointChange10k is the work of one EndpointSlice event (one
// endpoint moved) in a model of 10 000 services, as the agent's event
// handler does it before the change can be synced: each event follows the
// sync loop's Snapshot of the previous one, once the model's copy that a
// Snapshot starts is made (it is made in the background, in about 1.5
// ms, and events a sync apart find it ready).
func BenchmarkEndpointChange10k(b *testing.B) {
	const n = 10000
	tr := NewTracker(node, nil)
	sliceOf := func(i int, addr string) *discoveryv1.EndpointSlice {
		s := slice(fmt.Sprintf("svc-%d-1", i), discoveryv1.AddressTypeIPv4, http(8080), ep(addr))
		s.Labels[discoveryv1.LabelServiceName] = fmt.Sprintf("svc-%d", i)
		return s
	}
	for i := range n {
		tr.OnServiceAdd(service(func(s *corev1.Service) {
			s.Name = fmt.Sprintf("svc-%d", i)
			s.Spec.ClusterIP = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
			s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
		}))
		tr.OnEndpointSliceAdd(SliceOf(sliceOf(i, "10.1.0.1")))
	}
	snapshotAndCopy := func() {
		tr.Snapshot()
		tr.Synced()
		for len(tr.spare) == 0 {
			runtime.Gosched()
		}
	}
	snapshotAndCopy()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		tr.OnEndpointSliceUpdate(SliceOf(sliceOf(i%n, fmt.Sprintf("10.2.%d.%d", i/256%256, i%256))))
		b.StopTimer()
		if len(tr.changes) != 1 {
			b.Fatalf("a change left %d changed ports", len(tr.changes))
		}
		snapshotAndCopy()
		b.StartTimer()
	}
}

// BenchmarkInitialLists10k is the tracker's part of an agent's start: the
// informers' first lists of 10 000 Services and their EndpointSlices (10
// endpoints each), Services first, then the first Snapshot; each event
// building what it changed, and deferred to that Snapshot as the agent
// does it.
func BenchmarkInitialLists10k(b *testing.B) {
	const n = 10000
	svcs := make([]*corev1.Service, n)
	sls := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		svcs[i] = service(func(s *corev1.Service) {
			s.Name = fmt.Sprintf("svc-%d", i)
			s.Spec.ClusterIP = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
			s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
		})
		var eps []discoveryv1.Endpoint
		for j := range 10 {
			eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d", 1+j, i/256, i%256)))
		}
		sls[i] = slice(fmt.Sprintf("svc-%d-1", i), discoveryv1.AddressTypeIPv4, http(8080), eps...)
		sls[i].Labels[discoveryv1.LabelServiceName] = svcs[i].Name
	}
	for _, deferred := range []bool{false, true} {
		b.Run(map[bool]string{false: "each-event", true: "deferred"}[deferred], func(b *testing.B) {
			b.ReportAllocs()
			var tr *Tracker
			for b.Loop() {
				tr = NewTracker(node, nil)
				if deferred {
					tr.DeferUntilSnapshot()
				}
				for _, svc := range svcs {
					tr.OnServiceAdd(svc)
				}
				for _, s := range sls {
					tr.OnEndpointSliceAdd(SliceOf(s))
				}
				snap, _ := tr.Snapshot()
				if got := len(snap.Ports[corev1.IPv4Protocol]); got != n {
					b.Fatalf("%d ports in the model, want %d", got, n)
				}
			}
			b.ReportMetric(heldBy(&tr)/1e6, "live-MB")
		})
	}
}

// heldBy is the heap that *tr alone keeps alive once the copy of the
// model its last Snapshot needs is made (Synced): the live heap with it, less
// the live heap without it (the API objects it was given stay).
func heldBy(tr **Tracker) float64 {
	(*tr).Synced()
	for len((*tr).spare) == 0 {
		runtime.Gosched()
	}
	var with, without runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&with)
	*tr = nil
	runtime.GC()
	runtime.ReadMemStats(&without)
	return float64(with.HeapAlloc) - float64(without.HeapAlloc)
}
