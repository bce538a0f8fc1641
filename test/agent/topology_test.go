package agent_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/agent"
	"github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// TestNodeZoneLabelSteersTopologyHints follows the node's zone label from
// the API server to the kernel: a Service whose EndpointSlice carries zone
// hints (pod zone-a-1 for zone-a, zone-b-1 for zone-b) is served by the
// agent on a Node labelled zone-a, then relabelled zone-b, then with the
// label removed; each time the client's connections must land in the
// node's zone, or on both pods once it has none.
func TestNodeZoneLabelSteersTopologyHints(t *testing.T) {
	netlab.RequireRoot(t)
	env := testenv.Start(t)
	lab := netlab.NewLab(t)
	inA, inB := lab.Node.AddPod(t, "zone-a-1"), lab.Node.AddPod(t, "zone-b-1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(env.Config)

	const nodeName = "lab-node"
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: nodeName, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "zonal"},
		Spec: corev1.ServiceSpec{
			Ports:               []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(netlab.ServerPort)}},
			TrafficDistribution: new(corev1.ServiceTrafficDistributionPreferSameZone),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The hints the EndpointSlice controller writes for PreferSameZone.
	hinted := func(p *netlab.Pod, node, zone string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses: []string{p.IP.String()}, NodeName: new(node), Zone: new(zone),
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)},
			Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
		}
	}
	if _, err := kube.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "zonal-1", Labels: map[string]string{discoveryv1.LabelServiceName: "zonal"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{hinted(inA, nodeName, "zone-a"), hinted(inB, "node-b", "zone-b")},
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Protocol: new(corev1.ProtocolTCP), Port: new(int32(netlab.ServerPort))}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, kube, agent.Options{
			NodeName: nodeName,
			Mode:     v1alpha1.ModeNFTables,
			Backends: map[v1alpha1.ProxyMode]backends.Factory{
				v1alpha1.ModeNFTables: backends.Factories(backends.Env{NS: lab.Node.NS.NS()})[v1alpha1.ModeNFTables],
			},
			ClusterCIDRs:  []netip.Prefix{lab.Node.PodCIDR},
			MasqueradeBit: 14,
			MinSyncPeriod: 100 * time.Millisecond,
			SyncPeriod:    time.Minute,
			MetricsAddr:   freeAddr(t),
			HealthzAddr:   freeAddr(t),
			NetNS:         lab.Node.NS.NS(),
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})

	clusterIP := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	relabel := func(zone string) {
		t.Helper()
		node, err := kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if zone == "" {
			delete(node.Labels, corev1.LabelTopologyZone)
		} else {
			node.Labels[corev1.LabelTopologyZone] = zone
		}
		if _, err := kube.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	onlyAnswer(t, lab, clusterIP, "zone-a-1")
	relabel("zone-b")
	onlyAnswer(t, lab, clusterIP, "zone-b-1")
	relabel("")
	onlyAnswer(t, lab, clusterIP, "zone-a-1", "zone-b-1")
}

// onlyAnswer waits up to 30 seconds until a burst of connections from the
// lab's client to target is answered, every one, by exactly the pods
// named, through the agent's rules.
func onlyAnswer(t *testing.T, lab *netlab.Lab, target netip.AddrPort, pods ...string) {
	t.Helper()
	const burst = 40
	deadline := time.Now().Add(30 * time.Second)
	for {
		tally := lab.Client.NS.Spread(netlab.TCP, target, burst, time.Second)
		if tally.Answered() == burst && slices.Equal(tally.Names(), pods) {
			t.Logf("%s: %v", target, tally)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: want every connection answered by exactly %v; last burst: %v", target, pods, tally)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
