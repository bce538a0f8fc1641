package dataplane_test

import (
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
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
			// A service without endpoints rejects: an ICMP port
			// unreachable about the client's INIT reaches the client.
			// Whether the client's connect fails on it is up to its
			// SCTP stack: Linux takes it as a hard error only when it
			// arrives while the socket is not busy in the connect call,
			// which on a lab's veths it sometimes is (seen in the VM,
			// every mode); else SCTP retries its INIT until the timeout.
			empty := netip.AddrPortFrom(sctpEmptyIP, 80)
			icmp := listenICMP(t, client)
			got, err := client.RequestSCTP(empty, okTimeout)
			if err == nil {
				t.Errorf("SCTP %s without endpoints answered by %s; want refused", empty, got)
			}
			t.Logf("SCTP %s without endpoints: %v", empty, err)
			if netlab.KindOf(err) != netlab.Refused && !icmp.portUnreachable(t, sctpEmptyIP) {
				t.Errorf("SCTP %s without endpoints: %v, and no ICMP port unreachable about it reached the client; want refused", empty, err)
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
			Endpoints: []model.Endpoint{endpoint(ipv4, p.a, true), endpoint(ipv4, p.b, true), endpoint(ipv4, p.c, true)}},
		{Name: model.ServicePortName{Namespace: "suite", Name: "sctp-empty", Port: "p", Protocol: corev1.ProtocolSCTP}, ClusterIP: sctpEmptyIP, Port: 80},
	} {
		sp.Family, sp.Protocol = corev1.IPv4Protocol, corev1.ProtocolSCTP
		out[sp.Name] = sp
	}
	return out
}

// icmpListener is a raw ICMP socket in a client namespace, which sees
// every ICMP message the namespace receives.
type icmpListener struct{ fd int }

// listenICMP opens an icmpListener in ns, closed when the test ends.
func listenICMP(t *testing.T, ns *netlab.NetNS) *icmpListener {
	t.Helper()
	l := &icmpListener{}
	err := ns.Do(func() error {
		var err error
		l.fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	})
	if err != nil {
		t.Fatalf("raw ICMP socket in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { unix.Close(l.fd) })
	tv := unix.NsecToTimeval(failTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(l.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return l
}

// portUnreachable says whether an ICMP port unreachable about an SCTP
// packet to dst has arrived (or arrives within failTimeout).
func (l *icmpListener) portUnreachable(t *testing.T, dst netip.Addr) bool {
	t.Helper()
	buf := make([]byte, 1500)
	for {
		n, _, err := unix.Recvfrom(l.fd, buf, 0)
		if err != nil {
			return false
		}
		pkt := buf[:n]
		if len(pkt) < 20 {
			continue
		}
		ihl := int(pkt[0]&0x0f) * 4
		icmp := pkt[ihl:]
		if len(icmp) < 8+20 || icmp[0] != 3 || icmp[1] != 3 {
			continue
		}
		inner := icmp[8:]
		innerDst := netip.AddrFrom4([4]byte(inner[16:20]))
		t.Logf("ICMP port unreachable from %s about protocol %d to %s", netip.AddrFrom4([4]byte(pkt[12:16])), inner[9], innerDst)
		if inner[9] == unix.IPPROTO_SCTP && innerDst == dst {
			return true
		}
	}
}
