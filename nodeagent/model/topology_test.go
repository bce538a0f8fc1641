package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Topology-aware routing: the cases of kube-proxy v1.37's
// CategorizeEndpoints (pkg/proxy/topology.go) that involve hints, run from
// the API objects (Service, EndpointSlice hints, the node's name and zone)
// through BuildServicePorts to the endpoints each traffic policy uses.

// forZones gives an endpoint zone hints.
func forZones(zones ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

// forNodes gives an endpoint node hints.
func forNodes(nodes ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

func TestTopologyAwareRouting(t *testing.T) {
	inZoneA := Node{Name: node, Zone: "zone-a"}
	nodePortLocal := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	internalLocal := func(s *corev1.Service) {
		p := corev1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &p
	}
	// fourZones are endpoints hinted for zones a, b, c and a, the third
	// and fourth on other nodes, the first two on this one.
	fourZones := []discoveryv1.Endpoint{
		ep("10.1.0.1", on(node), forZones("zone-a")),
		ep("10.1.0.2", on(node), forZones("zone-b")),
		ep("10.1.0.3", on("node-c"), forZones("zone-c")),
		ep("10.1.0.4", on("node-d"), forZones("zone-a")),
	}
	// sameNode are endpoints hinted for their own node and zone, as the
	// EndpointSlice controller writes them for PreferSameNode.
	sameNode := []discoveryv1.Endpoint{
		ep("10.1.0.1", on(node), forZones("zone-a"), forNodes(node)),
		ep("10.1.0.2", on("node-b"), forZones("zone-b"), forNodes("node-b")),
		ep("10.1.0.3", on("node-c"), forZones("zone-c"), forNodes("node-c")),
		ep("10.1.0.4", on("node-d"), forZones("zone-a"), forNodes("node-d")),
	}
	with := func(eps []discoveryv1.Endpoint, i int, opts ...func(*discoveryv1.Endpoint)) []discoveryv1.Endpoint {
		eps = slices.Clone(eps)
		e := eps[i].DeepCopy()
		for _, o := range opts {
			o(e)
		}
		eps[i] = *e
		return eps
	}
	noHints := func(e *discoveryv1.Endpoint) { e.Hints = nil }
	all := []string{"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080", "10.1.0.4:8080"}

	tests := []struct {
		name string
		node Node
		svc  []func(*corev1.Service)
		eps  []discoveryv1.Endpoint
		// Internal and External are compared only when set; for the
		// ports below without external destinations External is
		// Internal's rule applied to the Cluster policy.
		wantCluster, wantLocal, wantInternal, wantExternal []string
	}{{
		name:         "every endpoint hinted, some for the node's zone: that zone's",
		node:         inZoneA,
		eps:          fourZones,
		wantCluster:  []string{"10.1.0.1:8080", "10.1.0.4:8080"},
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: []string{"10.1.0.1:8080", "10.1.0.4:8080"},
	}, {
		name:         "externalTrafficPolicy Local: node port ignores hints, cluster IP follows them",
		node:         inZoneA,
		svc:          []func(*corev1.Service){nodePortLocal},
		eps:          fourZones,
		wantCluster:  []string{"10.1.0.1:8080", "10.1.0.4:8080"},
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: []string{"10.1.0.1:8080", "10.1.0.4:8080"},
		wantExternal: []string{"10.1.0.1:8080", "10.1.0.2:8080"},
	}, {
		name:         "internalTrafficPolicy Local: cluster IP ignores hints",
		node:         inZoneA,
		svc:          []func(*corev1.Service){internalLocal},
		eps:          fourZones,
		wantCluster:  []string{"10.1.0.1:8080", "10.1.0.4:8080"},
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: []string{"10.1.0.1:8080", "10.1.0.2:8080"},
	}, {
		name:         "node without a zone label: hints ignored",
		node:         Node{Name: node},
		eps:          fourZones,
		wantCluster:  all,
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: all,
	}, {
		name:         "node in a zone no hint names: hints ignored",
		node:         Node{Name: node, Zone: "zone-x"},
		eps:          fourZones,
		wantCluster:  all,
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: all,
	}, {
		name:         "one endpoint without hints: hints ignored",
		node:         inZoneA,
		eps:          with(fourZones, 2, noHints),
		wantCluster:  all,
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: all,
	}, {
		name:         "one endpoint with empty hints: hints ignored",
		node:         inZoneA,
		eps:          with(fourZones, 2, func(e *discoveryv1.Endpoint) { e.Hints = &discoveryv1.EndpointHints{} }),
		wantCluster:  all,
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: all,
	}, {
		name:         "an unready endpoint without hints does not count",
		node:         inZoneA,
		eps:          with(fourZones, 2, noHints, ready(false)),
		wantCluster:  []string{"10.1.0.1:8080", "10.1.0.4:8080"},
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: []string{"10.1.0.1:8080", "10.1.0.4:8080"},
	}, {
		name:         "an unready endpoint for the zone is not used",
		node:         inZoneA,
		eps:          with(fourZones, 3, ready(false)),
		wantCluster:  []string{"10.1.0.1:8080"},
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: []string{"10.1.0.1:8080"},
	}, {
		name:         "the zone's endpoints all unready: hints ignored",
		node:         inZoneA,
		eps:          with(with(fourZones, 0, ready(false)), 3, ready(false)),
		wantCluster:  []string{"10.1.0.2:8080", "10.1.0.3:8080"},
		wantLocal:    []string{"10.1.0.2:8080"},
		wantInternal: []string{"10.1.0.2:8080", "10.1.0.3:8080"},
	}, {
		name:         "none ready: serving terminating endpoints of every zone",
		node:         inZoneA,
		eps:          with(with(with(with(fourZones, 0, draining), 1, draining), 2, draining), 3, ready(false)),
		wantCluster:  []string{"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"},
		wantLocal:    []string{"10.1.0.1:8080", "10.1.0.2:8080"},
		wantInternal: []string{"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"},
	}, {
		name: "several zones per endpoint: every endpoint naming the zone",
		node: Node{Name: node, Zone: "zone-c"},
		eps: []discoveryv1.Endpoint{
			ep("10.1.0.1", forZones("zone-a", "zone-b", "zone-c")),
			ep("10.1.0.2", forZones("zone-b", "zone-c")),
			ep("10.1.0.3", forZones("zone-b", "zone-d")),
			ep("10.1.0.4", forZones("zone-c")),
		},
		wantCluster:  []string{"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.4:8080"},
		wantInternal: []string{"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.4:8080"},
	}, {
		name:         "PreferSameNode: the endpoint hinted for this node",
		node:         inZoneA,
		eps:          sameNode,
		wantCluster:  []string{"10.1.0.1:8080"},
		wantLocal:    []string{"10.1.0.1:8080"},
		wantInternal: []string{"10.1.0.1:8080"},
	}, {
		name:         "PreferSameNode, one endpoint without hints: every endpoint",
		node:         inZoneA,
		eps:          with(sameNode, 1, noHints),
		wantCluster:  all,
		wantLocal:    []string{"10.1.0.1:8080"},
		wantInternal: all,
	}, {
		name:         "PreferSameNode, one endpoint without a node hint: the zone's",
		node:         inZoneA,
		eps:          with(sameNode, 1, func(e *discoveryv1.Endpoint) { e.Hints.ForNodes = nil }),
		wantCluster:  []string{"10.1.0.1:8080", "10.1.0.4:8080"},
		wantLocal:    []string{"10.1.0.1:8080"},
		wantInternal: []string{"10.1.0.1:8080", "10.1.0.4:8080"},
	}, {
		name:         "PreferSameNode, no endpoint for this node: the zone's",
		node:         Node{Name: "node-x", Zone: "zone-a"},
		eps:          sameNode,
		wantCluster:  []string{"10.1.0.1:8080", "10.1.0.4:8080"},
		wantInternal: []string{"10.1.0.1:8080", "10.1.0.4:8080"},
	}, {
		name:         "PreferSameNode, this node's endpoint unready: the zone's",
		node:         inZoneA,
		eps:          with(sameNode, 0, ready(false)),
		wantCluster:  []string{"10.1.0.4:8080"},
		wantInternal: []string{"10.1.0.4:8080"},
	}, {
		name:         "PreferSameNode, no endpoint for this node or its zone: every endpoint",
		node:         Node{Name: "node-x", Zone: "zone-x"},
		eps:          sameNode,
		wantCluster:  all,
		wantInternal: all,
	}, {
		name: "node hints only, for another node's endpoint: followed",
		node: inZoneA,
		eps: []discoveryv1.Endpoint{
			ep("10.1.0.1", on(node), forNodes("node-b")),
			ep("10.1.0.2", on("node-b"), forNodes(node)),
		},
		wantCluster:  []string{"10.1.0.2:8080"},
		wantLocal:    []string{"10.1.0.1:8080"},
		wantInternal: []string{"10.1.0.2:8080"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sps, errs := BuildServicePorts(service(tt.svc...), slicesOf([]*discoveryv1.EndpointSlice{slice("s", discoveryv1.AddressTypeIPv4, http(8080), tt.eps...)}), tt.node)
			if len(errs) > 0 || len(sps) != 1 {
				t.Fatalf("build: %d ports, errors %v", len(sps), errs)
			}
			sp := sps[0]
			wantExternal := tt.wantExternal
			if wantExternal == nil && !sp.ExternalPolicyLocal {
				wantExternal = tt.wantCluster
			}
			for _, c := range []struct {
				name      string
				got, want []string
			}{
				{"ClusterEndpoints", epStrings(sp.ClusterEndpoints()), tt.wantCluster},
				{"LocalEndpoints", epStrings(sp.LocalEndpoints()), tt.wantLocal},
				{"InternalEndpoints", epStrings(sp.InternalEndpoints()), tt.wantInternal},
				{"ExternalEndpoints", epStrings(sp.ExternalEndpoints()), wantExternal},
			} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
				}
			}
		})
	}
}

func TestBuildHints(t *testing.T) {
	n := Node{Name: node, Zone: "zone-a"}
	tests := []struct {
		name           string
		opts           []func(*discoveryv1.Endpoint)
		zone, nodeHint Hint
	}{
		{"no hints", nil, NoHint, NoHint},
		{"empty hints", []func(*discoveryv1.Endpoint){func(e *discoveryv1.Endpoint) { e.Hints = &discoveryv1.EndpointHints{} }}, NoHint, NoHint},
		{"the node's zone", []func(*discoveryv1.Endpoint){forZones("zone-b", "zone-a")}, HintHere, NoHint},
		{"another zone", []func(*discoveryv1.Endpoint){forZones("zone-b")}, HintElsewhere, NoHint},
		{"this node", []func(*discoveryv1.Endpoint){forNodes("node-b", node)}, NoHint, HintHere},
		{"another node", []func(*discoveryv1.Endpoint){forZones("zone-a"), forNodes("node-b")}, HintHere, HintElsewhere},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sps, errs := BuildServicePorts(service(), slicesOf([]*discoveryv1.EndpointSlice{slice("s", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1", tt.opts...))}), n)
			if len(errs) > 0 || len(sps) != 1 || len(sps[0].Endpoints) != 1 {
				t.Fatalf("build: %v, errors %v", sps, errs)
			}
			if e := sps[0].Endpoints[0]; e.ZoneHint != tt.zone || e.NodeHint != tt.nodeHint {
				t.Errorf("ZoneHint, NodeHint = %d, %d; want %d, %d", e.ZoneHint, e.NodeHint, tt.zone, tt.nodeHint)
			}
		})
	}
}

// TestTrackerNodeZone checks that the node's zone reaches the model: a
// change of it changes the ports whose endpoints have zone hints, and
// only those, and a repeated zone changes nothing.
func TestTrackerNodeZone(t *testing.T) {
	tr := NewTracker(node, nil)
	tr.OnServiceAdd(service())
	tr.OnEndpointSliceAdd(SliceOf(slice("web-1", discoveryv1.AddressTypeIPv4, http(8080),
		ep("10.1.0.1", forZones("zone-a")), ep("10.1.0.2", forZones("zone-b")))))
	plain := service(func(s *corev1.Service) {
		s.Name, s.Spec.ClusterIP, s.Spec.ClusterIPs = "api", "10.0.0.2", []string{"10.0.0.2"}
	})
	tr.OnServiceAdd(plain)
	apiSlice := slice("api-1", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.3"))
	apiSlice.Labels[discoveryv1.LabelServiceName] = "api"
	tr.OnEndpointSliceAdd(SliceOf(apiSlice))
	tr.Snapshot()

	web := ServicePortName{Namespace: "ns", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	for _, step := range []struct {
		zone        string
		wantChanged []string
		wantWeb     []string
	}{
		{"zone-a", []string{"ns/web:http/TCP"}, []string{"10.1.0.1:8080"}},
		{"zone-a", nil, []string{"10.1.0.1:8080"}},
		{"zone-b", []string{"ns/web:http/TCP"}, []string{"10.1.0.2:8080"}},
		{"", []string{"ns/web:http/TCP"}, []string{"10.1.0.1:8080", "10.1.0.2:8080"}},
	} {
		tr.SetNodeZone(step.zone)
		if got := signalled(tr); got != (len(step.wantChanged) > 0) {
			t.Errorf("zone %q: Changed signalled = %v, want %v", step.zone, got, len(step.wantChanged) > 0)
		}
		snap, changes := tr.Snapshot()
		if got := changeNames(changes); !slices.Equal(got, step.wantChanged) {
			t.Errorf("zone %q: changes = %v, want %v", step.zone, got, step.wantChanged)
		}
		if got := epStrings(snap.Ports[corev1.IPv4Protocol][web].ClusterEndpoints()); !slices.Equal(got, step.wantWeb) {
			t.Errorf("zone %q: web's ClusterEndpoints = %v, want %v\nmodel:\n%s", step.zone, got, step.wantWeb, strings.Join(modelLines(snap), "\n"))
		}
	}
}

// FuzzTopology checks the promises of topology-aware routing over every
// mix of endpoint states and hints the fuzzer makes (one byte per
// endpoint: ready, serving, terminating, local, then two bits each for
// the zone and the node hint): hints never leave the Cluster policy
// without endpoints while one is ready; they narrow it only when every
// ready endpoint has hints of the kind followed, to the ready endpoints
// whose hint names this node or its zone; and the Local policy never
// follows them. hack/fuzz.sh runs it for a few seconds in `make test`.
func FuzzTopology(f *testing.F) {
	f.Add([]byte{0b1001_0001, 0b0101_0001, 0b0000_1001})
	f.Add([]byte{0b1010_0001, 0b0110_0001, 0b0000_0001})
	f.Add([]byte{0b1001_0110, 0b0101_0001})
	f.Fuzz(func(t *testing.T, spec []byte) {
		if len(spec) > 64 {
			return
		}
		sp := &ServicePort{}
		var ready, readyLocal, drainingLocal []Endpoint
		for i, b := range spec {
			e := Endpoint{
				IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Port: 80,
				Ready: b&1 != 0, Serving: b&2 != 0, Terminating: b&4 != 0, IsLocal: b&8 != 0,
				ZoneHint: Hint(b >> 4 & 3 % 3), NodeHint: Hint(b >> 6 % 3),
			}
			sp.Endpoints = append(sp.Endpoints, e)
			switch {
			case e.Ready:
				ready = append(ready, e)
				if e.IsLocal {
					readyLocal = append(readyLocal, e)
				}
			case e.Serving && e.Terminating && e.IsLocal:
				drainingLocal = append(drainingLocal, e)
			}
		}
		cluster := sp.ClusterEndpoints()
		if len(ready) > 0 && len(cluster) == 0 {
			t.Fatalf("%d ready endpoints, none for the Cluster policy (spec %08b)", len(ready), spec)
		}
		if len(ready) > 0 && len(cluster) < len(ready) {
			followed := func(h func(Endpoint) Hint) bool {
				return !slices.ContainsFunc(ready, func(e Endpoint) bool { return h(e) == NoHint }) &&
					!slices.ContainsFunc(cluster, func(e Endpoint) bool { return !e.Ready || h(e) != HintHere }) &&
					len(cluster) == len(slices.DeleteFunc(slices.Clone(ready), func(e Endpoint) bool { return h(e) != HintHere }))
			}
			if !followed(func(e Endpoint) Hint { return e.NodeHint }) && !followed(func(e Endpoint) Hint { return e.ZoneHint }) {
				t.Fatalf("Cluster policy narrowed to %v of ready %v without hints to follow (spec %08b)", cluster, ready, spec)
			}
		}
		wantLocal := readyLocal
		if len(wantLocal) == 0 {
			wantLocal = drainingLocal
		}
		if got := sp.LocalEndpoints(); !slices.Equal(epStrings(got), epStrings(wantLocal)) {
			t.Fatalf("LocalEndpoints = %v, want %v whatever the hints", got, wantLocal)
		}
	})
}
