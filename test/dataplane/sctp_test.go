package dataplane_test

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/vm"
)

// SCTP services. Every backend renders them (the model accepts TCP, UDP
// and SCTP), but only SCTP associations prove the rules work: the host
// kernel of the other tests has no SCTP, the test VM's Debian kernel has
// it as a module, so these run in the VM (make test-vm) and skip
// elsewhere.

var (
	sctpIP      = netip.MustParseAddr("198.19.0.30")
	sctpEmptyIP = netip.MustParseAddr("198.19.0.31")
)

const sctpNodePort = 30090

// TestSCTP checks, in every mode, that SCTP associations to a cluster IP
// and to a NodePort reach every endpoint and only those, and that a
// service without endpoints refuses them.
func TestSCTP(t *testing.T) {
	netlab.RequireRoot(t)
	vm.Require(t, "SCTP (the sctp kernel module)")
	// sctp for the sockets, xt_sctp for iptables' -m sctp (both
	// variants): the VM has no modprobe to load them on demand.
	vm.LoadModules(t, "sctp", "xt_sctp")
	for _, row := range backends {
		t.Run(row.name, func(t *testing.T) {
			lab := netlab.NewLab(t)
			node := lab.Node
			row.skip(t, node.NS)
			p := pods{a: node.AddPod(t, "pod-a"), b: node.AddPod(t, "pod-b"), c: node.AddPod(t, "pod-c")}
			all := []string{"pod-a", "pod-b", "pod-c"}
			for _, pod := range []*netlab.Pod{p.a, p.b, p.c} {
				s, err := netlab.StartSCTPServer(pod.NS, pod.Name, netlab.ServerPort)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Stop)
			}
			client := lab.Client.NS
			// The lab's path is there before any rule: straight to a pod.
			if got, err := client.RequestSCTP(p.a.Addr(), okTimeout); err != nil || got != "pod-a" {
				t.Fatalf("SCTP from the client straight to pod-a: %q, %v", got, err)
			}

			b := row.new(t, node.NS, nodeConfig)
			if _, err := b.Sync(t.Context(), dataplane.SyncRequest{Model: snapshot(sctpPorts(p)), Full: true}); err != nil {
				t.Fatalf("full sync: %v\n%s", err, row.dump(node.NS))
			}
			defer func() {
				if t.Failed() {
					t.Logf("state in the node namespace:\n%s", row.dump(node.NS))
				}
			}()
			for _, addr := range []netip.AddrPort{netip.AddrPortFrom(sctpIP, 80), netip.AddrPortFrom(netlab.NodeIP, sctpNodePort)} {
				tally := client.SpreadSCTP(addr, requests, okTimeout)
				if tally.Answered() != requests || !slices.Equal(tally.Names(), all) {
					t.Errorf("%d SCTP requests to %s: %v; want all answered by exactly %v", requests, addr, tally, all)
				}
			}
			empty := netip.AddrPortFrom(sctpEmptyIP, 80)
			if got, err := client.RequestSCTP(empty, okTimeout); err == nil {
				t.Errorf("SCTP %s without endpoints answered by %s; want refused", empty, got)
			} else if netlab.KindOf(err) != netlab.Refused {
				t.Errorf("SCTP %s without endpoints: %v; want refused", empty, err)
			}
		})
	}
}

// sctpPorts are an SCTP service with a NodePort and pods a, b and c as
// endpoints, and one without endpoints.
func sctpPorts(p pods) map[model.ServicePortName]*model.ServicePort {
	out := map[model.ServicePortName]*model.ServicePort{}
	for _, sp := range []*model.ServicePort{
		{Name: model.ServicePortName{Namespace: "suite", Name: "sctp", Port: "p", Protocol: corev1.ProtocolSCTP}, ClusterIP: sctpIP, Port: 80, NodePort: sctpNodePort,
			Endpoints: []model.Endpoint{endpoint(p.a, true), endpoint(p.b, true), endpoint(p.c, true)}},
		{Name: model.ServicePortName{Namespace: "suite", Name: "sctp-empty", Port: "p", Protocol: corev1.ProtocolSCTP}, ClusterIP: sctpEmptyIP, Port: 80},
	} {
		sp.Family, sp.Protocol = corev1.IPv4Protocol, corev1.ProtocolSCTP
		out[sp.Name] = sp
	}
	return out
}
