package model

import (
	"reflect"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// slicesOf is SliceOf of each of ss, for the builds of the tests.
func slicesOf(ss []*discoveryv1.EndpointSlice) []*Slice {
	if ss == nil {
		return nil
	}
	out := make([]*Slice, len(ss))
	for i, s := range ss {
		if s != nil {
			out[i] = SliceOf(s)
		}
	}
	return out
}

// TestSliceOf: the first address of each endpoint (in one string for
// the slice), the conditions as kube-proxy reads them (unset: ready,
// serving, not terminating), whether an endpoint had an address at all,
// and the slice's metadata, ports, node names and hints as they were.
func TestSliceOf(t *testing.T) {
	yes, no, node := true, false, "node-a"
	hints := &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"198.18.0.1", "198.18.0.9"}, NodeName: &node, Hints: hints},
			{Addresses: []string{"198.18.0.22"}, Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}},
			{Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &no, Terminating: &no}},
		},
	}
	got := SliceOf(s)
	want := []SliceEndpoint{
		{Address: "198.18.0.1", NodeName: &node, Hints: hints, Ready: true, Serving: true, HasAddress: true},
		{Address: "198.18.0.22", Serving: true, Terminating: true, HasAddress: true},
		{Ready: true},
	}
	if !reflect.DeepEqual(got.Endpoints, want) {
		t.Errorf("endpoints = %+v; want %+v", got.Endpoints, want)
	}
	if got.Name != "web-abc" || got.Namespace != "ns" || got.Labels[discoveryv1.LabelServiceName] != "web" ||
		got.AddressType != discoveryv1.AddressTypeIPv4 || !reflect.DeepEqual(got.Ports, s.Ports) {
		t.Errorf("metadata, type or ports not kept: %+v", got)
	}
	if got.Endpoints[0].NodeName != &node || got.Endpoints[0].Hints != hints {
		t.Error("node name and hints are copied; want the slice's own")
	}
}

// TestSliceDeepCopy: the copy equals the slice and shares none of its
// pointers.
func TestSliceDeepCopy(t *testing.T) {
	node := "node-a"
	s := SliceOf(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{"198.18.0.1"}, NodeName: &node,
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
		}},
	})
	c := s.DeepCopyObject().(*Slice)
	if !reflect.DeepEqual(c, s) {
		t.Fatalf("copy = %+v; want %+v", c, s)
	}
	if c.Endpoints[0].NodeName == s.Endpoints[0].NodeName || c.Endpoints[0].Hints == s.Endpoints[0].Hints ||
		c.Ports[0].Name == s.Ports[0].Name || &c.Endpoints[0] == &s.Endpoints[0] {
		t.Error("the copy shares pointers with the slice")
	}
	c.Labels["x"] = "y"
	if _, ok := s.Labels["x"]; ok {
		t.Error("the copy shares its labels with the slice")
	}
}
