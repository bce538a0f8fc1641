package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The benchmarks program IPVS in a network namespace of their own with n
// ClusterIP services of 10 endpoints each, the model the nftables
// backend's benchmarks use. They need the test VM: make bench-vm. Under
// TCG emulation their times are not comparable with anything measured on
// the host; compare them with each other.

func benchModel(n int) *model.Snapshot {
	ports := map[model.ServicePortName]*model.ServicePort{}
	for i := range n {
		sp := &model.ServicePort{
			Name:      model.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: corev1.ProtocolTCP},
			Family:    corev1.IPv4Protocol,
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
			Protocol:  corev1.ProtocolTCP,
			Port:      80,
		}
		for j := range 10 {
			e := i*10 + j
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(e >> 8), byte(e)}),
				Port: 8080, Ready: true, Serving: true})
		}
		ports[sp.Name] = sp
	}
	return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: ports, corev1.IPv6Protocol: {},
	}}
}

// benchBackend returns a backend in a fresh namespace, synced with m.
func benchBackend(b *testing.B, m *model.Snapshot) *Backend {
	b.Helper()
	loadVMModules(b)
	ns := netlab.NewNetNS(b, "ipvs-bench")
	be, err := New(labConfig, WithNetNSFd(ns.FD()))
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	c, err := be.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("the first sync into an empty namespace programmed %+v in %v", c, time.Since(start).Round(time.Millisecond))
	return be
}

// benchmarkFullSync measures a full resync of a kernel already holding
// the model: every virtual service and real server read back and
// compared, the helper table rewritten.
func benchmarkFullSync(b *testing.B, n int) {
	m := benchModel(n)
	be := benchBackend(b, m)
	dataplanetest.FullSyncs(b, be, m)
}

// benchmarkOneEndpointChange measures an incremental sync after one
// endpoint of one service changed.
func benchmarkOneEndpointChange(b *testing.B, n int) {
	m := benchModel(n)
	be := benchBackend(b, m)
	dataplanetest.EndpointChanges(b, be, m)
}

func BenchmarkFullSync1k(b *testing.B)           { benchmarkFullSync(b, 1000) }
func BenchmarkFullSync10k(b *testing.B)          { benchmarkFullSync(b, 10000) }
func BenchmarkOneEndpointChange1k(b *testing.B)  { benchmarkOneEndpointChange(b, 1000) }
func BenchmarkOneEndpointChange10k(b *testing.B) { benchmarkOneEndpointChange(b, 10000) }
