package switchtest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// flows lists the node's IPv4 conntrack entries.
func (w *world) flows() []*netlink.ConntrackFlow {
	w.t.Helper()
	h, err := netlink.NewHandleAt(w.lab.Node.NS.Handle, unix.NETLINK_NETFILTER)
	if err != nil {
		w.t.Fatal(err)
	}
	defer h.Close()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		w.t.Fatal(err)
	}
	return flows
}

// udpEntries counts the node's UDP conntrack entries by original
// destination and reply source.
func (w *world) udpEntries() map[string]int {
	w.t.Helper()
	out := map[string]int{}
	for _, f := range w.flows() {
		if f.Forward.Protocol != unix.IPPROTO_UDP {
			continue
		}
		out[fmt.Sprintf("%s:%d>%s", f.Forward.DstIP, f.Forward.DstPort, f.Reverse.SrcIP)]++
	}
	return out
}

func key(dst netip.AddrPort, reply netip.Addr) string { return fmt.Sprintf("%s>%s", dst, reply) }

// untranslatedSynSent counts the node's TCP entries to dst still in
// SYN_SENT whose replies would come from dst itself: connection attempts
// nothing translated.
func (w *world) untranslatedSynSent(dst netip.AddrPort) int {
	w.t.Helper()
	n := 0
	for _, f := range w.flows() {
		tcp, _ := f.ProtoInfo.(*netlink.ProtoInfoTCP)
		if f.Forward.Protocol == unix.IPPROTO_TCP && tcp != nil && tcp.State == 1 /* SYN_SENT */ &&
			f.Forward.DstIP.Equal(dst.Addr().AsSlice()) && f.Forward.DstPort == dst.Port() && f.Reverse.SrcIP.Equal(dst.Addr().AsSlice()) {
			n++
		}
	}
	return n
}

// waitUntranslatedGone waits up to 5 s for the node to hold no
// untranslated SYN_SENT entry to dst (untranslatedSynSent); when says
// what should have removed it.
func (w *world) waitUntranslatedGone(dst netip.AddrPort, when string) {
	w.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for w.untranslatedSynSent(dst) > 0 {
		if time.Now().After(deadline) {
			w.t.Fatalf("the untranslated SYN_SENT entry to %s is still on the node %s", dst, when)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// connectFrom opens (and closes) a TCP connection from the client's
// source port sport to addr, within timeout.
func (w *world) connectFrom(sport int, addr netip.AddrPort, timeout time.Duration) error {
	return w.lab.Client.NS.Do(func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: w.lab.Client.IP.AsSlice(), Port: sport}}
		c, err := d.Dial("tcp4", addr.String())
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// TestTCPSynBeforeTheService: a client that sends its SYN to a service
// address before any Service has it makes an untranslated conntrack
// entry, which its retransmissions, and any connection from the same
// source port, would follow for two minutes (kubernetes/kubernetes#48719).
// Once the Service is programmed the agent deletes that entry, so a
// connection from the same source port reaches an endpoint at once: for a
// SYN sent before the agent's first sync (the node's first mode is
// programmed by the start-up switch), and for one sent before a Service
// was created.
func TestTCPSynBeforeTheService(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeNFTables)
	// Another program's stateful rule, as every real node has (a CNI's,
	// the kubelet's): without one the namespace tracks no connection.
	if _, err := w.lab.Node.NS.NS().Output(context.Background(), nil, "nft",
		"add table inet other-program; add chain inet other-program pre { type filter hook prerouting priority 0; }; add rule inet other-program pre ct state new counter"); err != nil {
		t.Fatalf("nft: %v", err)
	}
	web := netip.AddrPortFrom(webIP, 80)
	const early, sport = 40079, 40080
	if err := w.connectFrom(early, web, 300*time.Millisecond); err == nil {
		t.Fatalf("%s answered before the agent ran", web)
	}
	if n := w.untranslatedSynSent(web); n != 1 {
		t.Fatalf("want one untranslated SYN_SENT entry to %s on the node, have %d", web, n)
	}
	w.startAgent()
	w.waitActive(v1alpha1.ModeNFTables)
	w.waitUntranslatedGone(web, "after the first sync")
	if err := w.connectFrom(early, web, time.Second); err != nil {
		t.Fatalf("from source port %d, the one of the SYN before the first sync: %v", early, err)
	}

	late := netip.AddrPortFrom(netip.MustParseAddr("198.19.0.80"), 80)

	// The SYN leaves the node untranslated (to the Beyond namespace,
	// where nothing answers it).
	if err := w.connectFrom(sport, late, 300*time.Millisecond); err == nil {
		t.Fatalf("%s answered before any Service had it", late)
	}
	if n := w.untranslatedSynSent(late); n != 1 {
		t.Fatalf("want one untranslated SYN_SENT entry to %s on the node, have %d", late, n)
	}

	w.service("late", corev1.ProtocolTCP, late.Addr(), int32(late.Port()), 0, w.pods...)
	deadline := time.Now().Add(15 * time.Second)
	for {
		// From fresh source ports: the rules are there.
		if _, err := w.lab.Client.NS.Request(netlab.TCP, late, time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered from a fresh source port", late)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The entry goes right after the sync that programmed the Service;
	// without the agent it would stay for two minutes.
	w.waitUntranslatedGone(late, "after the Service was programmed")
	if err := w.connectFrom(sport, late, time.Second); err != nil {
		t.Fatalf("from source port %d, the one of the early SYN: %v", sport, err)
	}
}

// TestUDPConntrackPerEndpoint: when a UDP service's endpoint goes away,
// the conntrack entries of clients NATed to it through the service are
// deleted, so their next datagrams are balanced afresh; the entries to
// the remaining endpoint, and UDP flows that do not go through a service,
// are untouched. When the last endpoint goes, its entries go too.
func TestUDPConntrackPerEndpoint(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeNFTables)
	w.startAgent()
	w.waitActive(v1alpha1.ModeNFTables)
	svc := netip.AddrPortFrom(dnsIP, 53)
	podA, podB := w.pods[0], w.pods[1]

	// Flows through the service to both pods, and one straight to pod a.
	deadline := time.Now().Add(15 * time.Second)
	for {
		tally := w.lab.Client.NS.Spread(netlab.UDP, svc, 20, time.Second)
		if tally.Answers[podA.Name] > 0 && tally.Answers[podB.Name] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("UDP service: %v", tally)
		}
	}
	if _, err := w.lab.Client.NS.Request(netlab.UDP, podA.Addr(), time.Second); err != nil {
		t.Fatalf("UDP straight to pod a: %v", err)
	}
	before := w.udpEntries()
	viaA, viaB, direct := key(svc, podA.IP), key(svc, podB.IP), key(podA.Addr(), podA.IP)
	if before[viaA] == 0 || before[viaB] == 0 || before[direct] == 0 {
		t.Fatalf("want entries %s, %s and %s; have %v", viaA, viaB, direct, before)
	}

	w.setEndpoints("dns", corev1.ProtocolUDP, podB)
	deadline = time.Now().Add(15 * time.Second)
	for w.udpEntries()[viaA] > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("entries through the service to the removed endpoint are still there: %v", w.udpEntries())
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := w.udpEntries()
	if after[viaB] != before[viaB] || after[direct] != before[direct] {
		t.Errorf("other entries changed: before %v, after %v", before, after)
	}
	// The next datagrams go to the remaining endpoint.
	if tally := w.lab.Client.NS.Spread(netlab.UDP, svc, 10, time.Second); tally.Answers[podB.Name] != 10 {
		t.Errorf("after the endpoint went: %v", tally)
	}

	// The last endpoint goes: its entries go too; the direct flow stays.
	w.setEndpoints("dns", corev1.ProtocolUDP)
	deadline = time.Now().Add(15 * time.Second)
	for w.udpEntries()[viaB] > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("entries to the last endpoint are still there: %v", w.udpEntries())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if w.udpEntries()[direct] != before[direct] {
		t.Errorf("the flow straight to pod a was touched: %v", w.udpEntries())
	}
}
