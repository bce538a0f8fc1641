package switchtest

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// udpEntries counts the node's UDP conntrack entries by original
// destination and reply source.
func (w *world) udpEntries() map[string]int {
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
	out := map[string]int{}
	for _, f := range flows {
		if f.Forward.Protocol != unix.IPPROTO_UDP {
			continue
		}
		out[fmt.Sprintf("%s:%d>%s", f.Forward.DstIP, f.Forward.DstPort, f.Reverse.SrcIP)]++
	}
	return out
}

func key(dst netip.AddrPort, reply netip.Addr) string { return fmt.Sprintf("%s>%s", dst, reply) }

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
