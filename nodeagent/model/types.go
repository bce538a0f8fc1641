// Package model turns Services and EndpointSlices into the mode-independent
// service model every dataplane renders: one ServicePort per (service, port,
// IP family), with its addresses, policies and merged endpoints, and the
// choice of the endpoints each traffic policy uses (select.go: readiness,
// the terminating fallback, topology hints). Building and choosing once,
// in one place, is what keeps the three dataplanes behaving alike.
package model

import (
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ServicePortName identifies one port of one Service. It is the unit of
// change tracking and the key dataplanes name their per-service objects by.
type ServicePortName struct {
	Namespace string
	Name      string
	// Port is the port's name in the Service ("" for an unnamed port).
	Port     string
	Protocol corev1.Protocol
}

// String renders the name as namespace/name:port/protocol.
func (n ServicePortName) String() string {
	return fmt.Sprintf("%s/%s:%s/%s", n.Namespace, n.Name, n.Port, n.Protocol)
}

// ServiceName is the namespace/name of the Service the port belongs to.
func (n ServicePortName) ServiceName() ServiceName {
	return ServiceName{Namespace: n.Namespace, Name: n.Name}
}

// ServiceName identifies a Service.
type ServiceName struct {
	Namespace string
	Name      string
}

// String renders the name as namespace/name.
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Endpoint is one backend of a service port, merged from every
// EndpointSlice of the service.
type Endpoint struct {
	IP   netip.Addr
	Port int32
	// Ready, Serving and Terminating are the EndpointSlice conditions. In
	// the slice a nil Ready counts as ready, a nil Serving as serving
	// and a nil Terminating as not terminating, as kube-proxy reads them.
	Ready       bool
	Serving     bool
	Terminating bool
	// IsLocal says the endpoint runs on this node (its nodeName is the
	// node's). The node and zone names themselves are not kept: what they
	// decide is resolved when the model is built (IsLocal and the hints
	// below), and 100 000 endpoints held 3 MB of them.
	IsLocal bool
	// ZoneHint and NodeHint say what the endpoint's topology hints
	// (hints.forZones and hints.forNodes in its EndpointSlice, which the
	// EndpointSlice controller writes for spec.trafficDistribution) say
	// about this node: whether they name its zone, its name, or neither.
	// See select.go for how they narrow the Cluster policy's endpoints.
	ZoneHint Hint
	NodeHint Hint
}

// String renders the endpoint as ip:port.
func (e Endpoint) String() string { return netip.AddrPortFrom(e.IP, uint16(e.Port)).String() }

// Hint is what one kind of topology hint of an endpoint (its zones or its
// nodes) says about the node the model is built for. It is resolved when
// the model is built, as IsLocal is: the model holds only what this node
// needs, and a change of the node's zone changes only the ports whose
// endpoints have zone hints.
type Hint uint8

// The hint values.
const (
	// NoHint: the endpoint has no hint of this kind.
	NoHint Hint = iota
	// HintElsewhere: the hints of this kind name other zones (or nodes)
	// only.
	HintElsewhere
	// HintHere: a hint names this node's zone (or this node).
	HintHere
)

// Node is what the model knows of the node it is built for: its name,
// which decides the endpoints that are local and those a forNodes hint
// names for it, and its zone (its topology.kubernetes.io/zone label, ""
// without one), which decides those a forZones hint names for it.
type Node struct {
	Name string
	Zone string
}

// ServicePort is one port of one Service in one IP family: everything a
// dataplane needs to program it.
type ServicePort struct {
	Name      ServicePortName
	Family    corev1.IPFamily
	ClusterIP netip.Addr
	Protocol  corev1.Protocol
	Port      int32
	// NodePort is 0 when the service has none.
	NodePort int32
	// ExternalIPs and LoadBalancerIPs are the addresses of this family only.
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges of this family; empty allows every source.
	LoadBalancerSourceRanges []netip.Prefix
	// AffinityTimeout is the ClientIP session affinity timeout; 0 means no
	// affinity.
	AffinityTimeout time.Duration
	// ExternalPolicyLocal is externalTrafficPolicy: Local.
	ExternalPolicyLocal bool
	// InternalPolicyLocal is internalTrafficPolicy: Local.
	InternalPolicyLocal bool
	// HealthCheckNodePort is the port of the service's health check, 0 if none.
	HealthCheckNodePort int32
	// Endpoints are all endpoints of the port, deduplicated and sorted by
	// address and port, whatever their conditions.
	Endpoints []Endpoint
}
