package netlab

import (
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"
)

const (
	// okTimeout bounds requests that should be answered.
	okTimeout = 2 * time.Second
	// failTimeout bounds requests that should fail; "at once" is well under it.
	failTimeout = 500 * time.Millisecond
)

// TestLabReachesPodsWithoutProxy checks the lab by itself: with no service
// proxy, clients reach each pod by its address over TCP and UDP, every
// pod answers with its name, and forwarding is on in the node only.
func TestLabReachesPodsWithoutProxy(t *testing.T) {
	lab := NewLab(t)
	a := lab.Node.AddPod(t, "pod-a")
	b := lab.Node.AddPod(t, "pod-b")
	if a.IP != netip.MustParseAddr("198.18.1.2") || b.IP != netip.MustParseAddr("198.18.1.3") {
		t.Fatalf("pod addresses %s, %s; want 198.18.1.2, 198.18.1.3", a.IP, b.IP)
	}
	for _, client := range []*Host{lab.Client, lab.OtherClient} {
		for _, pod := range []*Pod{a, b} {
			for _, proto := range []Proto{TCP, UDP} {
				got, err := client.NS.Request(proto, pod.Addr(), okTimeout)
				if err != nil || got != pod.Name {
					t.Errorf("%s from %s to %s: got %q, %v; want %q", proto, client.IP, pod.Addr(), got, err, pod.Name)
				}
			}
		}
	}
	// Pods reach each other across the bridge, and the node reaches pods.
	if got, err := a.NS.Request(TCP, b.Addr(), okTimeout); err != nil || got != "pod-b" {
		t.Errorf("pod-a to pod-b: %q, %v", got, err)
	}
	if got, err := lab.Node.NS.Request(UDP, a.Addr(), okTimeout); err != nil || got != "pod-a" {
		t.Errorf("node to pod-a: %q, %v", got, err)
	}
	tally := lab.Client.NS.Spread(TCP, a.Addr(), 10, okTimeout)
	if tally.Answers["pod-a"] != 10 || tally.Answered() != 10 {
		t.Errorf("10 requests to pod-a: %v", tally)
	}

	if v, err := lab.Node.NS.Sysctl("net/ipv4/ip_forward"); err != nil || v != "1" {
		t.Errorf("node ip_forward = %q, %v; want 1", v, err)
	}
	if v, err := lab.Node.Beyond.Sysctl("net/ipv4/ip_forward"); err != nil || v != "0" {
		t.Errorf("beyond ip_forward = %q, %v; want 0", v, err)
	}
}

// TestRequestClassifiesFailures checks the error kinds the dataplane
// suite relies on: a closed port is refused at once, an address without a
// route is unreachable, and an address that does not answer times out.
func TestRequestClassifiesFailures(t *testing.T) {
	lab := NewLab(t)
	a := lab.Node.AddPod(t, "pod-a")
	closedPort := netip.AddrPortFrom(a.IP, 9)
	for _, proto := range []Proto{TCP, UDP} {
		_, err := lab.Client.NS.Request(proto, closedPort, okTimeout)
		if KindOf(err) != Refused || err.(*RequestError).Elapsed > failTimeout {
			t.Errorf("%s to closed port %s: %v; want refused within %v", proto, closedPort, err, failTimeout)
		}
	}
	// No proxy: the node routes service addresses beyond itself, where
	// nothing answers.
	svc := netip.AddrPortFrom(ServiceCIDR.Addr().Next(), 80)
	if _, err := lab.Client.NS.Request(TCP, svc, failTimeout); KindOf(err) != Timeout {
		t.Errorf("TCP to untranslated %s: %v; want timeout", svc, err)
	}
	// A namespace with no route at all fails at once, without a packet.
	bare := NewNetNS(t, "bare")
	if _, err := bare.Request(TCP, svc, failTimeout); KindOf(err) != Unreachable {
		t.Errorf("TCP to %s without a route: %v; want unreachable", svc, err)
	}
	// A removed pod's address is on the pod subnet but nobody answers ARP.
	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := lab.Client.NS.Request(TCP, a.Addr(), failTimeout); KindOf(err) != Timeout {
		t.Errorf("TCP to removed pod: %v; want timeout", err)
	}
	if d := time.Since(start); d > failTimeout+200*time.Millisecond {
		t.Errorf("request with timeout %v took %v", failTimeout, d)
	}
}

// TestPodsComeAndGo checks pods added and removed while traffic runs, and
// a long-lived connection that sees its server go.
func TestPodsComeAndGo(t *testing.T) {
	lab := NewLab(t)
	a := lab.Node.AddPod(t, "pod-a")
	s, err := lab.Client.NS.OpenSession(a.Addr(), okTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Server != "pod-a" {
		t.Fatalf("session answered by %q, want pod-a", s.Server)
	}
	for _, msg := range []string{"one", "two"} {
		if err := s.Exchange(msg, okTimeout); err != nil {
			t.Fatalf("exchange %q: %v", msg, err)
		}
	}

	b := lab.Node.AddPod(t, "pod-b")
	if got, err := lab.Client.NS.Request(UDP, b.Addr(), okTimeout); err != nil || got != "pod-b" {
		t.Fatalf("new pod-b: %q, %v", got, err)
	}
	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := a.Remove(); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if err := s.Exchange("three", okTimeout); KindOf(err) != Reset {
		t.Errorf("exchange after the pod went: %v; want reset", err)
	}
	if _, err := lab.Client.NS.Request(TCP, a.Addr(), failTimeout); err == nil {
		t.Error("removed pod-a still answers")
	}
	if got, err := lab.Client.NS.Request(TCP, b.Addr(), okTimeout); err != nil || got != "pod-b" {
		t.Errorf("pod-b after pod-a went: %q, %v", got, err)
	}
	c := lab.Node.AddPod(t, "pod-c")
	if c.IP == a.IP {
		t.Errorf("pod-c reused removed pod-a's address %s", a.IP)
	}
}

// TestLabTeardownLeavesNothing checks that a lab leaves no namespace, no
// link in the root namespace and no running server behind.
func TestLabTeardownLeavesNothing(t *testing.T) {
	RequireRoot(t)
	root := rootLinks(t)
	rootForward := readRootSysctl(t, "net/ipv4/ip_forward")
	var names []string
	var servers []*Server
	t.Run("lab", func(t *testing.T) {
		lab := NewLab(t)
		p := lab.Node.AddPod(t, "pod-a")
		names = append(names, lab.Node.NS.Name, lab.Node.Beyond.Name, lab.Client.NS.Name, lab.OtherClient.NS.Name, p.NS.Name)
		servers = append(servers, p.server)
		if _, err := lab.Client.NS.Request(TCP, p.Addr(), okTimeout); err != nil {
			t.Fatal(err)
		}
	})
	for _, name := range names {
		if _, err := os.Stat("/run/netns/" + name); !os.IsNotExist(err) {
			t.Errorf("namespace %s still present: %v", name, err)
		}
	}
	for _, s := range servers {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if !closed {
			t.Errorf("server %s still running", s.name)
		}
	}
	if after := rootLinks(t); !slices.Equal(root, after) {
		t.Errorf("root namespace links changed: before %v, after %v", root, after)
	}
	if after := readRootSysctl(t, "net/ipv4/ip_forward"); after != rootForward {
		t.Errorf("root ip_forward changed from %q to %q", rootForward, after)
	}
}

func rootLinks(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func readRootSysctl(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + key)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
