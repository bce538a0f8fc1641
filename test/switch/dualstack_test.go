package switchtest

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The dual-stack Service of TestSwitchDualStack: a NodePort Service with
// ipFamilyPolicy RequireDualStack, a cluster IP in each family, and an
// EndpointSlice of each family with the lab's pods.
var (
	dualIP       = netip.MustParseAddr("198.19.0.66")
	dualIP6      = netlab.IPv6Of(dualIP)
	dualNodePort = int32(30066)
)

// TestSwitchDualStack moves a node iptables -> nftables -> iptables with
// a dual-stack Service (RequireDualStack: the model holds a service port
// in each family) under two clients that keep opening new connections,
// one over IPv4 and one over IPv6, each to the Service's cluster IP and
// NodePort of its family: none may fail in either family, both pods
// answer in both families after each switch, and the node reports no
// missing family.
func TestSwitchDualStack(t *testing.T) {
	netlab.RequireIPv6(t)
	w := newWorld(t, v1alpha1.ModeIPTables)
	w.dualStackService()
	w.startAgent("--cluster-cidr", netlab.PodCIDR.String()+","+netlab.IPv6PrefixOf(netlab.PodCIDR).String())
	w.waitActive(v1alpha1.ModeIPTables)
	w.requireDualStackTraffic()

	for _, to := range []v1alpha1.ProxyMode{v1alpha1.ModeNFTables, v1alpha1.ModeIPTables} {
		t.Run(string(other(to))+"-to-"+string(to), func(t *testing.T) {
			v4, v6 := w.dualStackTargets()
			loop4 := netlab.StartClientLoop(t, w.lab.Client.NS, v4...)
			loop6 := netlab.StartClientLoop(t, w.lab.OtherClient.NS, v6...)
			time.Sleep(300 * time.Millisecond)

			w.desire(to)
			pn := w.waitActive(to)
			time.Sleep(300 * time.Millisecond)
			loop4.RequireNoFailures(t, "IPv4 during the switch")
			loop6.RequireNoFailures(t, "IPv6 during the switch")

			if deg := meta.FindStatusCondition(pn.Status.Conditions, contract.ConditionDegraded); deg != nil && deg.Status == metav1.ConditionTrue {
				t.Errorf("node Degraded after the switch to %s: %s: %s", to, deg.Reason, deg.Message)
			}
			w.requireOnly(to)
			w.requireDualStackTraffic()
		})
	}
}

// dualStackService creates the dual-stack Service and its two
// EndpointSlices, with the world's pods.
func (w *world) dualStackService() {
	w.t.Helper()
	ctx := context.Background()
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := w.kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeNodePort,
			IPFamilyPolicy: &policy,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			ClusterIP:      dualIP.String(),
			ClusterIPs:     []string{dualIP.String(), dualIP6.String()},
			Ports:          []corev1.ServicePort{{Name: "p", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: dualNodePort, TargetPort: intstr.FromInt32(netlab.ServerPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Logf("dual-stack Service: families %v, cluster IPs %v", svc.Spec.IPFamilies, svc.Spec.ClusterIPs)
	v4 := slice("dual", corev1.ProtocolTCP, w.pods...)
	v6 := slice("dual", corev1.ProtocolTCP, w.pods...)
	v6.Name, v6.AddressType = "dual-ipv6", discoveryv1.AddressTypeIPv6
	for i, p := range w.pods {
		v6.Endpoints[i].Addresses = []string{p.IP6.String()}
	}
	for _, s := range []*discoveryv1.EndpointSlice{v4, v6} {
		if _, err := w.kube.DiscoveryV1().EndpointSlices("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			w.t.Fatal(err)
		}
	}
}

// dualStackTargets are the dual-stack Service's cluster IP and NodePort
// on the node, in each family.
func (w *world) dualStackTargets() (v4, v6 []netip.AddrPort) {
	v4 = []netip.AddrPort{netip.AddrPortFrom(dualIP, 80), netip.AddrPortFrom(netlab.NodeIP, uint16(dualNodePort))}
	v6 = []netip.AddrPort{netip.AddrPortFrom(dualIP6, 80), netip.AddrPortFrom(w.lab.Node.IP6, uint16(dualNodePort))}
	return v4, v6
}

// requireDualStackTraffic checks that both pods answer through each of
// the dual-stack Service's targets, in both families, waiting up to 15s
// for the rules.
func (w *world) requireDualStackTraffic() {
	w.t.Helper()
	v4, v6 := w.dualStackTargets()
	for _, target := range append(v4, v6...) {
		deadline := time.Now().Add(15 * time.Second)
		for {
			tally := w.lab.Client.NS.Spread(netlab.TCP, target, 20, time.Second)
			if len(tally.Answers) == len(w.pods) && tally.Answered() == 20 {
				break
			}
			if time.Now().After(deadline) {
				w.t.Fatalf("%s: not every pod answered: %v", target, tally)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if pn := w.proxyNode(); strings.Contains(statusText(pn), contract.ReasonFamilyMissing) {
		w.t.Errorf("the node reports a missing family: %s", statusText(pn))
	}
}
