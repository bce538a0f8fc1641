package model

// Endpoint selection, as kube-proxy v1.37 does it (pkg/proxy/topology.go):
// a traffic policy uses the ready endpoints it may reach; only when none
// of them is ready does it fall back to those that are still serving
// while terminating, so that connections drain instead of failing during
// a rollout. The fallback is decided separately for the cluster-wide and
// the node-local set.
//
// Topology-aware routing narrows the cluster-wide set only. A Service's
// spec.trafficDistribution (PreferClose, PreferSameZone, PreferSameNode)
// or its topology-mode annotation is read by the EndpointSlice
// controller, not by the proxy: it writes hints on the endpoints
// (forZones, and forNodes for PreferSameNode), and the proxy follows the
// hints. Hints count only when every ready endpoint has them and one of
// them names this node (or its zone); otherwise they are ignored and
// traffic goes to every endpoint, so that a half-written or stale set of
// hints never leaves a node without endpoints. The Local policies
// (internal and external) ignore hints: they use this node's endpoints.

import "slices"

// topologyMode is the part of the cluster the Cluster policy's endpoints
// are chosen from on this node, as decided from the endpoints' hints.
type topologyMode int

// The modes.
const (
	// topologyCluster: no hints apply; every endpoint may be used.
	topologyCluster topologyMode = iota
	// topologySameNode: the endpoints whose forNodes hints name this
	// node (PreferSameNode).
	topologySameNode
	// topologySameZone: the endpoints whose forZones hints name this
	// node's zone (PreferClose, PreferSameZone).
	topologySameZone
)

// topologyMode decides which hints the Cluster policy follows on this
// node: forNodes hints if every ready endpoint has some and one names
// this node; else forZones hints if every ready endpoint has some and one
// names this node's zone; else none. Only ready endpoints count, so a
// port without any follows none: its fallback to serving terminating
// endpoints ignores topology, as kube-proxy's does.
func (sp *ServicePort) topologyMode() topologyMode {
	allNodeHints, nodeHere := true, false
	allZoneHints, zoneHere := true, false
	for _, e := range sp.Endpoints {
		if !e.Ready {
			continue
		}
		allNodeHints = allNodeHints && e.NodeHint != NoHint
		nodeHere = nodeHere || e.NodeHint == HintHere
		allZoneHints = allZoneHints && e.ZoneHint != NoHint
		zoneHere = zoneHere || e.ZoneHint == HintHere
	}
	switch {
	case allNodeHints && nodeHere:
		return topologySameNode
	case allZoneHints && zoneHere:
		return topologySameZone
	}
	return topologyCluster
}

// ClusterEndpoints returns the endpoints traffic under the Cluster policy
// goes to: the ready ones that topologyMode allows, or, if none is
// ready, the serving terminating ones. It is empty when the port has no
// usable endpoint.
func (sp *ServicePort) ClusterEndpoints() []Endpoint {
	switch sp.topologyMode() {
	case topologySameNode:
		return usable(sp.Endpoints, func(e Endpoint) bool { return e.NodeHint == HintHere })
	case topologySameZone:
		return usable(sp.Endpoints, func(e Endpoint) bool { return e.ZoneHint == HintHere })
	}
	return usable(sp.Endpoints, func(Endpoint) bool { return true })
}

// LocalEndpoints returns the endpoints traffic under the Local policy goes
// to: ClusterEndpoints' rule applied to the endpoints on this node only.
func (sp *ServicePort) LocalEndpoints() []Endpoint {
	return usable(sp.Endpoints, func(e Endpoint) bool { return e.IsLocal })
}

// InternalEndpoints returns the endpoints for traffic to the cluster IP:
// LocalEndpoints under internalTrafficPolicy Local, else ClusterEndpoints.
func (sp *ServicePort) InternalEndpoints() []Endpoint {
	if sp.InternalPolicyLocal {
		return sp.LocalEndpoints()
	}
	return sp.ClusterEndpoints()
}

// ExternalEndpoints returns the endpoints for traffic to the node port,
// external IPs and load-balancer IPs: LocalEndpoints under
// externalTrafficPolicy Local, else ClusterEndpoints.
func (sp *ServicePort) ExternalEndpoints() []Endpoint {
	if sp.ExternalPolicyLocal {
		return sp.LocalEndpoints()
	}
	return sp.ClusterEndpoints()
}

// UsesExternal says whether the port takes traffic other than to its
// cluster IP: it has a node port, external IPs or load-balancer IPs.
func (sp *ServicePort) UsesExternal() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// usable returns the ready endpoints among those in scope or, if there are
// none, the serving terminating ones; nil if neither exists. The result
// may share eps' array (when every endpoint is in scope and ready, the
// common case, it is eps): read it, never write it. It is counted before
// it is gathered, in one allocation: a full sync asks for every port's.
func usable(eps []Endpoint, inScope func(Endpoint) bool) []Endpoint {
	ready, draining := 0, 0
	for _, e := range eps {
		switch {
		case !inScope(e):
		case e.Ready:
			ready++
		case e.Serving && e.Terminating:
			draining++
		}
	}
	switch {
	case ready == 0 && draining == 0:
		return nil
	case ready == len(eps):
		return slices.Clip(eps)
	}
	n := ready
	if ready == 0 {
		n = draining
	}
	out := make([]Endpoint, 0, n)
	for _, e := range eps {
		if inScope(e) && (e.Ready || ready == 0 && e.Serving && e.Terminating) {
			out = append(out, e)
		}
	}
	return out
}
