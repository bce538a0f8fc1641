package dataplane_test

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestNodeWithoutIPv6 programs the suite's services in both families
// into a node whose IPv6 is turned off (net.ipv6.conf.all.disable_ipv6 =
// 1), in every backend: the sync programs IPv4, which answers, and
// reports IPv6 as missing with a dataplane.Warning (a
// *dataplane.FamilyMissingError naming every IPv6 service port), never
// a failed sync; full and incremental syncs alike.
func TestNodeWithoutIPv6(t *testing.T) {
	netlab.RequireRoot(t)
	netlab.RequireIPv6(t)
	for _, row := range backends {
		t.Run(row.name, func(t *testing.T) {
			skipHostRowInVM(t, row)
			lab := netlab.NewLab(t)
			node := lab.Node
			row.skip(t, node.NS)
			p := pods{a: node.AddPod(t, "pod-a"), b: node.AddPod(t, "pod-b"), c: node.AddPod(t, "pod-c"), d: node.AddPod(t, "pod-d")}
			if err := node.NS.DisableIPv6(); err != nil {
				t.Fatal(err)
			}
			v4, v6 := services(p, ipv4), services(p, ipv6)
			snap := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
				corev1.IPv4Protocol: v4, corev1.IPv6Protocol: v6,
			}}
			cfg := ipv4.nodeConfig()
			cfg.NodeIPs = append(cfg.NodeIPs, ipv6.addr(netlab.NodeIP))
			cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, ipv6.prefix(netlab.PodCIDR))
			b := row.new(t, node.NS, cfg)
			t.Cleanup(func() {
				if _, err := b.Cleanup(context.Background()); err != nil {
					t.Errorf("cleanup: %v", err)
				}
				if c, ok := b.(io.Closer); ok {
					_ = c.Close()
				}
			})
			web := netip.AddrPortFrom(webIP, 80)
			web6 := netip.AddrPortFrom(ipv6.addr(webIP), 80)
			for _, req := range []dataplane.SyncRequest{
				{Model: snap, Full: true},
				{Model: snap, Changed: model.ChangeSet{{Namespace: "suite", Name: "web", Port: "p", Protocol: corev1.ProtocolTCP}: {}}},
			} {
				counts, err := b.Sync(t.Context(), req)
				warnings, rest := dataplane.SplitWarnings(err)
				if rest != nil {
					t.Fatalf("sync (full %v) failed: %v\n%s", req.Full, rest, row.dump(node.NS))
				}
				var missing *dataplane.FamilyMissingError
				if len(warnings) != 1 || !errors.As(err, &missing) || missing.Family != corev1.IPv6Protocol || len(missing.Ports) != len(v6) {
					t.Errorf("sync (full %v) warns %v; want one *dataplane.FamilyMissingError for the %d IPv6 service ports", req.Full, err, len(v6))
				} else {
					t.Logf("sync (full %v) warns: %v", req.Full, err)
				}
				if counts.Services != len(v4) {
					t.Errorf("sync (full %v) programmed %d service ports; want the %d of IPv4", req.Full, counts.Services, len(v4))
				}
				expectSpread(t, lab.Client.NS, netlab.TCP, web, []string{"pod-a", "pod-b", "pod-c"})
				if got, err := lab.Client.NS.Request(netlab.TCP, web6, failTimeout); err == nil {
					t.Errorf("%s answered by %s on a node without IPv6", web6, got)
				}
			}
		})
	}
}
