package vmswitch_test

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestVMSwitchIPVSDualStack moves a node nftables -> ipvs -> iptables
// through the agent's switcher with the web service dual-stack (a
// service port in each family, as a RequireDualStack Service gives the
// model), under two clients that keep opening new connections, one over
// IPv4 and one over IPv6, to the cluster IP and NodePort of its family:
// none may fail in either family, and after each switch both pods answer
// in both families and the kernel holds nothing of the old mode.
func TestVMSwitchIPVSDualStack(t *testing.T) {
	loadModules(t)
	netlab.RequireIPv6(t)
	lab := netlab.NewLab(t)
	pods := []*netlab.Pod{lab.Node.AddPod(t, "pod-a"), lab.Node.AddPod(t, "pod-b")}
	cfg := nodeConfig
	cfg.NodeIPs = append([]netip.Addr{}, netlab.NodeIP, lab.Node.IP6)
	cfg.ClusterCIDRs = append([]netip.Prefix{}, netlab.PodCIDR, lab.Node.PodCIDR6)
	v4 := []netip.AddrPort{netip.AddrPortFrom(webIP, 80), nodePort}
	v6 := []netip.AddrPort{netip.AddrPortFrom(netlab.IPv6Of(webIP), 80), netip.AddrPortFrom(lab.Node.IP6, nodePort.Port())}

	n := startNode(t, lab, cfg, dualStackWeb(pods), v1alpha1.ModeNFTables)
	n.waitActive(v1alpha1.ModeNFTables)
	requireAnswers(t, lab, len(pods), append(v4, v6...)...)

	from := v1alpha1.ModeNFTables
	for _, to := range []v1alpha1.ProxyMode{v1alpha1.ModeIPVS, v1alpha1.ModeIPTables} {
		t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
			loop4 := netlab.StartClientLoop(t, lab.Client.NS, v4...)
			loop6 := netlab.StartClientLoop(t, lab.OtherClient.NS, v6...)
			time.Sleep(300 * time.Millisecond)

			n.sw.SetDesire(switcher.Desire{Mode: to})
			n.waitActive(to)
			time.Sleep(300 * time.Millisecond)
			loop4.RequireNoFailures(t, "IPv4 during the switch")
			loop6.RequireNoFailures(t, "IPv6 during the switch")
			n.requireOnly(to)
			requireAnswers(t, lab, len(pods), append(v4, v6...)...)
		})
		from = to
	}
}

// dualStackWeb is web with an IPv6 service port beside the IPv4 one: the
// cluster IP's twin in the lab, the same NodePort, the pods' IPv6
// addresses as endpoints.
func dualStackWeb(pods []*netlab.Pod) *model.Snapshot {
	snap := web(podIPs(pods))
	for _, sp := range snap.Ports[corev1.IPv4Protocol] {
		sp6 := *sp
		sp6.Family, sp6.ClusterIP = corev1.IPv6Protocol, netlab.IPv6Of(sp.ClusterIP)
		sp6.Endpoints = nil
		for _, ep := range sp.Endpoints {
			ep.IP = netlab.IPv6Of(ep.IP)
			sp6.Endpoints = append(sp6.Endpoints, ep)
		}
		snap.Ports[corev1.IPv6Protocol] = map[model.ServicePortName]*model.ServicePort{sp6.Name: &sp6}
	}
	return snap
}
