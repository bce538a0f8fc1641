package dataplane_test

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Topology-aware routing, with real packets, in every backend. The
// Services and their EndpointSlices, hints included, go through the
// model's Tracker as the agent's informers feed it, with the lab's node
// named node-1 and labelled with a zone; the backend programs the
// snapshot and the client counts which pods answer. The four pods all sit
// on the lab node's bridge, but their EndpointSlices place them on nodes
// and in zones:
//
//	pod-a  node-1 (this node)  zone-a
//	pod-b  node-2              zone-a
//	pod-c  node-3              zone-b  (node-1 for the Local service)
//	pod-d  node-4              zone-b
//
// so a backend sending traffic to a pod the hints rule out gets an answer
// from it and is caught.

var (
	zonalIP      = netip.MustParseAddr("198.19.0.40")
	partialIP    = netip.MustParseAddr("198.19.0.41")
	sameNodeIP   = netip.MustParseAddr("198.19.0.42")
	zonalLocalIP = netip.MustParseAddr("198.19.0.43")
)

const (
	zonalNodePort      = 30090
	zonalLocalNodePort = 30091
)

// placed is an endpoint's pod with the node and zone its EndpointSlice
// names.
type placed struct {
	pod        *netlab.Pod
	node, zone string
}

// topologyService is one Service of the topology checks and the hints
// its EndpointSlice controller would have written.
type topologyService struct {
	name      string
	clusterIP netip.Addr
	nodePort  int32
	etpLocal  bool
	eps       []placed
	// zoneHints and nodeHints give each endpoint a forZones hint for its
	// own zone, and a forNodes hint for its own node (PreferSameNode).
	zoneHints, nodeHints bool
	// unhinted is the index of an endpoint left without hints, -1 for
	// none: a controller that has not written every hint yet.
	unhinted int
}

func (s topologyService) objects() (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "topology", Name: s.name}, Spec: corev1.ServiceSpec{
		Type:       corev1.ServiceTypeClusterIP,
		ClusterIP:  s.clusterIP.String(),
		ClusterIPs: []string{s.clusterIP.String()},
		IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
		Ports:      []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: s.nodePort}},
	}}
	if s.nodePort != 0 {
		svc.Spec.Type = corev1.ServiceTypeNodePort
	}
	if s.etpLocal {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "topology", Name: s.name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: s.name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("p"), Port: new(int32(netlab.ServerPort)), Protocol: new(corev1.ProtocolTCP)}},
	}
	for i, p := range s.eps {
		e := discoveryv1.Endpoint{Addresses: []string{p.pod.IP.String()}, NodeName: new(p.node), Zone: new(p.zone)}
		if i != s.unhinted && (s.zoneHints || s.nodeHints) {
			e.Hints = &discoveryv1.EndpointHints{}
			if s.zoneHints {
				e.Hints.ForZones = []discoveryv1.ForZone{{Name: p.zone}}
			}
			if s.nodeHints {
				e.Hints.ForNodes = []discoveryv1.ForNode{{Name: p.node}}
			}
		}
		slice.Endpoints = append(slice.Endpoints, e)
	}
	return svc, slice
}

func TestTopologyAwareRouting(t *testing.T) {
	netlab.RequireRoot(t)
	for _, row := range backends {
		t.Run(row.name, func(t *testing.T) { skipHostRowInVM(t, row); runTopology(t, row) })
	}
}

// runTopology checks one backend: the node in zone-a, then moved to
// zone-b, then without a zone label, each time synced incrementally with
// the ports the model says changed, as the agent's sync loop does.
func runTopology(t *testing.T, row backend) {
	lab := netlab.NewLab(t)
	node := lab.Node
	row.skip(t, node.NS)
	a, b, c, d := node.AddPod(t, "pod-a"), node.AddPod(t, "pod-b"), node.AddPod(t, "pod-c"), node.AddPod(t, "pod-d")
	spread := []placed{{a, "node-1", "zone-a"}, {b, "node-2", "zone-a"}, {c, "node-3", "zone-b"}, {d, "node-4", "zone-b"}}
	withLocalC := slices.Clone(spread)
	withLocalC[2].node = "node-1"

	tr := model.NewTracker(nodeConfig.NodeName, nil)
	tr.SetNodeZone("zone-a")
	for _, s := range []topologyService{
		// PreferClose / PreferSameZone: zone hints on every endpoint.
		{name: "zonal", clusterIP: zonalIP, nodePort: zonalNodePort, eps: spread, zoneHints: true, unhinted: -1},
		// The same with one endpoint not hinted yet: hints are ignored.
		{name: "partial", clusterIP: partialIP, eps: spread, zoneHints: true, unhinted: 2},
		// PreferSameNode: node and zone hints.
		{name: "same-node", clusterIP: sameNodeIP, eps: spread, zoneHints: true, nodeHints: true, unhinted: -1},
		// externalTrafficPolicy Local: the node port ignores hints
		// (this node's endpoints: pod-a, pod-c), the cluster IP
		// follows them.
		{name: "zonal-local", clusterIP: zonalLocalIP, nodePort: zonalLocalNodePort, etpLocal: true, eps: withLocalC, zoneHints: true, unhinted: -1},
	} {
		svc, slice := s.objects()
		tr.OnServiceAdd(svc)
		tr.OnEndpointSliceAdd(model.SliceOf(slice))
	}

	ctx := t.Context()
	be := row.new(t, node.NS, nodeConfig)
	snap, _ := tr.Snapshot()
	if _, err := be.Sync(ctx, dataplane.SyncRequest{Model: snap, Full: true}); err != nil {
		t.Fatalf("first full sync: %v\n%s", err, row.dump(node.NS))
	}
	client := lab.Client.NS
	svcAddr := func(ip netip.Addr, port int) netip.AddrPort { return netip.AddrPortFrom(ip, uint16(port)) }
	nodePortAddr := func(port int) netip.AddrPort { return netip.AddrPortFrom(netlab.NodeIP, uint16(port)) }
	all := []string{"pod-a", "pod-b", "pod-c", "pod-d"}

	// check runs one step's checks as a subtest and, if it fails, logs
	// what the backend has programmed.
	check := func(name string, fn func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("%s state in the node namespace:\n%s", row.name, row.dump(node.NS))
				}
			}()
			fn(t)
		})
	}
	// moveTo relabels the node and syncs what the model says changed.
	moveTo := func(t *testing.T, zone string) {
		t.Helper()
		tr.SetNodeZone(zone)
		snap, changed := tr.Snapshot()
		if len(changed) == 0 {
			t.Fatalf("the node's zone became %q and no port changed", zone)
		}
		if _, err := be.Sync(ctx, dataplane.SyncRequest{Model: snap, Changed: changed}); err != nil {
			t.Fatalf("sync after the zone became %q: %v\n%s", zone, err, row.dump(node.NS))
		}
	}

	check("zone-a", func(t *testing.T) {
		// Zone hints: the cluster IP and the node port stay in zone-a.
		expectSpread(t, client, netlab.TCP, svcAddr(zonalIP, 80), []string{"pod-a", "pod-b"})
		expectSpread(t, client, netlab.TCP, nodePortAddr(zonalNodePort), []string{"pod-a", "pod-b"})
		// One endpoint without hints: every endpoint.
		expectSpread(t, client, netlab.TCP, svcAddr(partialIP, 80), all)
		// Node hints: the endpoint hinted for this node.
		expectSpread(t, client, netlab.TCP, svcAddr(sameNodeIP, 80), []string{"pod-a"})
		// externalTrafficPolicy Local: hints for the cluster IP, this
		// node's endpoints for the node port.
		expectSpread(t, client, netlab.TCP, svcAddr(zonalLocalIP, 80), []string{"pod-a", "pod-b"})
		expectSpread(t, client, netlab.TCP, nodePortAddr(zonalLocalNodePort), []string{"pod-a", "pod-c"})
	})
	check("zone-b", func(t *testing.T) {
		moveTo(t, "zone-b")
		expectSpread(t, client, netlab.TCP, svcAddr(zonalIP, 80), []string{"pod-c", "pod-d"})
		expectSpread(t, client, netlab.TCP, nodePortAddr(zonalNodePort), []string{"pod-c", "pod-d"})
		expectSpread(t, client, netlab.TCP, svcAddr(partialIP, 80), all)
		// Node hints come before zone hints.
		expectSpread(t, client, netlab.TCP, svcAddr(sameNodeIP, 80), []string{"pod-a"})
		expectSpread(t, client, netlab.TCP, svcAddr(zonalLocalIP, 80), []string{"pod-c", "pod-d"})
		expectSpread(t, client, netlab.TCP, nodePortAddr(zonalLocalNodePort), []string{"pod-a", "pod-c"})
	})
	check("no-zone-label", func(t *testing.T) {
		// No zone: zone hints name no zone of this node and are ignored.
		moveTo(t, "")
		expectSpread(t, client, netlab.TCP, svcAddr(zonalIP, 80), all)
		expectSpread(t, client, netlab.TCP, nodePortAddr(zonalNodePort), all)
		expectSpread(t, client, netlab.TCP, svcAddr(sameNodeIP, 80), []string{"pod-a"})
		expectSpread(t, client, netlab.TCP, svcAddr(zonalLocalIP, 80), all)
	})
}
