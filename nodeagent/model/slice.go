package model

import (
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Slice is what the model reads of an EndpointSlice, in the form the
// agent's informers keep: at 10 000 services they hold 100 000
// endpoints for as long as the agent runs, and the API type spends 96
// bytes on each (a list of addresses, three condition pointers and five
// more pointers the model never reads) where a SliceEndpoint takes 40.
// The Tracker and BuildServicePorts take Slices; SliceOf makes one.
//
// It is a runtime.Object with the EndpointSlice's metadata, so that an
// informer's transform can return it and the informer's store key it.
type Slice struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	AddressType discoveryv1.AddressType
	Ports       []discoveryv1.EndpointPort
	Endpoints   []SliceEndpoint
}

// SliceEndpoint is one endpoint of a Slice.
type SliceEndpoint struct {
	// Address is the endpoint's first address, the one the model uses
	// (all of an endpoint's addresses are the same backend, and
	// kube-proxy uses the first); HasAddress says it had one.
	Address string
	// NodeName and Hints are the endpoint's, as the API gives them.
	NodeName *string
	Hints    *discoveryv1.EndpointHints
	// Ready, Serving and Terminating are the endpoint's conditions, an
	// unset one read as kube-proxy reads it: ready, serving, not
	// terminating.
	Ready, Serving, Terminating bool
	HasAddress                  bool
}

// SliceOf returns what the model reads of s. The metadata, ports, node
// names and hints are s's own (not copied: the caller must not modify s
// afterwards, as informers never do); the endpoints' first addresses are
// copied into one string for the whole slice, one allocation where the
// decoder made one an address. SliceOf(nil) is nil.
func SliceOf(s *discoveryv1.EndpointSlice) *Slice {
	if s == nil {
		return nil
	}
	out := &Slice{
		TypeMeta:    s.TypeMeta,
		ObjectMeta:  s.ObjectMeta,
		AddressType: s.AddressType,
		Ports:       s.Ports,
	}
	if len(s.Endpoints) == 0 {
		return out
	}
	size := 0
	for _, e := range s.Endpoints {
		if len(e.Addresses) > 0 {
			size += len(e.Addresses[0])
		}
	}
	var b strings.Builder
	b.Grow(size)
	for _, e := range s.Endpoints {
		if len(e.Addresses) > 0 {
			b.WriteString(e.Addresses[0])
		}
	}
	text, at := b.String(), 0
	out.Endpoints = make([]SliceEndpoint, len(s.Endpoints))
	for i, e := range s.Endpoints {
		c := e.Conditions
		se := SliceEndpoint{
			NodeName:    e.NodeName,
			Hints:       e.Hints,
			Ready:       c.Ready == nil || *c.Ready,
			Serving:     c.Serving == nil || *c.Serving,
			Terminating: c.Terminating != nil && *c.Terminating,
			HasAddress:  len(e.Addresses) > 0,
		}
		if se.HasAddress {
			n := len(e.Addresses[0])
			se.Address = text[at : at+n]
			at += n
		}
		out.Endpoints[i] = se
	}
	return out
}

// DeepCopyObject returns a copy of s that shares nothing with it
// (runtime.Object).
func (s *Slice) DeepCopyObject() runtime.Object {
	if s == nil {
		return nil
	}
	out := &Slice{TypeMeta: s.TypeMeta, AddressType: s.AddressType}
	s.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if s.Ports != nil {
		out.Ports = make([]discoveryv1.EndpointPort, len(s.Ports))
		for i := range s.Ports {
			s.Ports[i].DeepCopyInto(&out.Ports[i])
		}
	}
	if s.Endpoints != nil {
		out.Endpoints = make([]SliceEndpoint, len(s.Endpoints))
		for i, e := range s.Endpoints {
			if e.NodeName != nil {
				name := *e.NodeName
				e.NodeName = &name
			}
			e.Hints = e.Hints.DeepCopy()
			out.Endpoints[i] = e
		}
	}
	return out
}
