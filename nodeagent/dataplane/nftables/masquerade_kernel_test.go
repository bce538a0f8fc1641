package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestKernelClusterIPMasquerade makes real connections to a cluster IP
// and reads their translation back from the node's conntrack table: a
// client outside the pod network is masqueraded (the endpoint's reply
// must come back through this node), a pod is not; with MasqueradeAll
// both are. The mark is set by the one rule in the services chain that
// looks the destination up in cluster-ips.
func TestKernelClusterIPMasquerade(t *testing.T) {
	netlab.RequireRoot(t)
	if _, err := nsexec.LookPath("conntrack"); err != nil {
		t.Skipf("needs conntrack (Debian package conntrack): %v", err)
	}
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("MasqueradeAll=%v", all), func(t *testing.T) {
			lab := netlab.NewLab(t)
			podA := lab.Node.AddPod(t, "pod-a")
			podB := lab.Node.AddPod(t, "pod-b")
			cfg := labNodeConfig
			cfg.MasqueradeAll = all
			syncOneService(t, lab, cfg, "web", podB.IP)
			for _, c := range []struct {
				name string
				from *netlab.NetNS
				src  netip.Addr
				want bool
			}{
				{"client outside the pod network", lab.Client.NS, netlab.ClientIP, true},
				{"pod", podA.NS, podA.IP, all},
			} {
				if got, err := c.from.Request(netlab.TCP, netip.AddrPortFrom(serviceIP, 80), 2*time.Second); err != nil || got != "pod-b" {
					t.Fatalf("%s to the cluster IP: %q, %v; want an answer from pod-b", c.name, got, err)
				}
				if got := masqueraded(t, lab.Node.NS, c.src, serviceIP); got != c.want {
					t.Errorf("%s to the cluster IP: masqueraded %v, want %v", c.name, got, c.want)
				}
			}
		})
	}
}

// labNodeConfig describes a netlab lab's node: its address, the lab's
// pod network as the cluster CIDR, masquerade bit 14.
var labNodeConfig = dataplane.NodeConfig{NodeName: "node-1", NodeIPs: []netip.Addr{netlab.NodeIP},
	ClusterCIDRs: []netip.Prefix{netlab.PodCIDR}, MasqueradeBit: 14}

// serviceIP is the cluster IP of syncOneService's service.
var serviceIP = netip.MustParseAddr("198.19.0.10")

// syncOneService programs lab's node, as cfg describes it, with one
// service, serviceIP:80 (named name, in namespace default), whose only
// endpoint is the pod at ep on the node, serving netlab.ServerPort.
func syncOneService(t *testing.T, lab *netlab.Lab, cfg dataplane.NodeConfig, name string, ep netip.Addr) *Backend {
	t.Helper()
	b, err := New(cfg, WithNetNS(lab.Node.NS.NS()))
	if err != nil {
		t.Fatal(err)
	}
	sp := dt.Svc("default", name, "http", serviceIP.String(), 80)
	sp.Endpoints = []model.Endpoint{{IP: ep, Port: netlab.ServerPort, Ready: true, Serving: true, IsLocal: true}}
	m := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{corev1.IPv4Protocol: dt.PortsOf(sp)}}
	if _, err := b.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		t.Fatal(err)
	}
	return b
}

// masqueraded reads the node's conntrack entries of TCP connections from
// src to dst and says whether their replies go to another address than
// src (the connection was SNATed). It fails the test if there is none.
func masqueraded(t *testing.T, node *netlab.NetNS, src, dst netip.Addr) bool {
	t.Helper()
	out, err := node.NS().Output(context.Background(), nil, "conntrack", "-L", "-p", "tcp", "-s", src.String(), "-d", dst.String())
	if err != nil {
		t.Fatalf("conntrack -L: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		// The original tuple's dst= comes first, the reply's second.
		var dsts []string
		for _, f := range strings.Fields(line) {
			if d, ok := strings.CutPrefix(f, "dst="); ok {
				dsts = append(dsts, d)
			}
		}
		if len(dsts) == 2 {
			return dsts[1] != src.String()
		}
	}
	t.Fatalf("no conntrack entry from %s to %s:\n%s", src, dst, out)
	return false
}
