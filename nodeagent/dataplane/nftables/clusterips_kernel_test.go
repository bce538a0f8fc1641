package nftables

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestKernelClusterIPUnknownPort sends real packets to a cluster IP: its
// port answers, from a pod (forwarded) and from the node itself (local
// output), and any other port is refused at once, TCP and UDP alike, as
// kube-proxy's nftables mode refuses it (cluster-ips-check). Without the cluster IP in
// cluster-ips, the same packets are not refused.
func TestKernelClusterIPUnknownPort(t *testing.T) {
	netlab.RequireRoot(t)
	lab := netlab.NewLab(t)
	podA := lab.Node.AddPod(t, "pod-a")
	podB := lab.Node.AddPod(t, "pod-b")
	syncOneService(t, lab, labNodeConfig, "web", podB.IP)
	from := []struct {
		name string
		ns   *netlab.NetNS
	}{{"pod", podA.NS}, {"node", lab.Node.NS}}
	for _, c := range from {
		if got, err := c.ns.Request(netlab.TCP, netip.AddrPortFrom(serviceIP, 80), 2*time.Second); err != nil || got != "pod-b" {
			t.Fatalf("%s to the service's port: %q, %v; want an answer from pod-b", c.name, got, err)
		}
		for _, proto := range []netlab.Proto{netlab.TCP, netlab.UDP} {
			_, err := c.ns.Request(proto, netip.AddrPortFrom(serviceIP, 81), 2*time.Second)
			// The node's own UDP datagram is rejected in its output path,
			// which the sender sees as EPERM from its write.
			if netlab.KindOf(err) != netlab.Refused && !(c.ns == lab.Node.NS && proto == netlab.UDP && errors.Is(err, syscall.EPERM)) {
				t.Errorf("%s to port 81 of the cluster IP over %v: %v, want refused", c.name, proto, err)
			}
		}
	}

	// The same without the cluster IP in cluster-ips: not refused.
	conn, err := nftables.New(nftables.WithNetNSFd(lab.Node.NS.FD()))
	if err != nil {
		t.Fatal(err)
	}
	set := &nftables.Set{Name: setClusterIPs, Table: &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}, KeyType: nftables.TypeIPAddr}
	if err := conn.SetDeleteElements(set, []nftables.SetElement{{Key: serviceIP.AsSlice()}}); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, c := range from {
		if _, err := c.ns.Request(netlab.TCP, netip.AddrPortFrom(serviceIP, 81), 500*time.Millisecond); netlab.KindOf(err) == netlab.Refused {
			t.Errorf("without the cluster IP in cluster-ips, %s to port 81 was refused (%v); the test proves nothing", c.name, err)
		}
	}
}
