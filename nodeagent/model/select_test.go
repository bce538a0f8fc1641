package model

import (
	"net/netip"
	"slices"
	"testing"
)

func TestEndpointSelection(t *testing.T) {
	// Endpoints by state and place; the last octet says which is which.
	var (
		readyLocal        = Endpoint{IP: addr("10.1.0.1"), Port: 80, Ready: true, Serving: true, IsLocal: true}
		readyRemote       = Endpoint{IP: addr("10.1.0.2"), Port: 80, Ready: true, Serving: true}
		drainingLocal     = Endpoint{IP: addr("10.1.0.3"), Port: 80, Serving: true, Terminating: true, IsLocal: true}
		drainingRemote    = Endpoint{IP: addr("10.1.0.4"), Port: 80, Serving: true, Terminating: true}
		deadLocal         = Endpoint{IP: addr("10.1.0.5"), Port: 80, Terminating: true, IsLocal: true}
		notReadyRemote    = Endpoint{IP: addr("10.1.0.6"), Port: 80}
		readyTermLocal    = Endpoint{IP: addr("10.1.0.7"), Port: 80, Ready: true, Serving: true, Terminating: true, IsLocal: true}
		servingOnlyRemote = Endpoint{IP: addr("10.1.0.8"), Port: 80, Serving: true}
	)
	tests := []struct {
		name         string
		eps          []Endpoint
		wantCluster  []string
		wantLocal    []string
		internalLoc  bool
		externalLoc  bool
		wantInternal []string
		wantExternal []string
	}{{
		name: "no endpoints",
	}, {
		name:         "ready present: terminating ignored",
		eps:          []Endpoint{readyLocal, readyRemote, drainingLocal, drainingRemote, deadLocal, notReadyRemote},
		wantCluster:  []string{"10.1.0.1:80", "10.1.0.2:80"},
		wantLocal:    []string{"10.1.0.1:80"},
		wantInternal: []string{"10.1.0.1:80", "10.1.0.2:80"},
		wantExternal: []string{"10.1.0.1:80", "10.1.0.2:80"},
	}, {
		name:         "none ready: serving terminating used",
		eps:          []Endpoint{drainingLocal, drainingRemote, deadLocal, notReadyRemote, servingOnlyRemote},
		wantCluster:  []string{"10.1.0.3:80", "10.1.0.4:80"},
		wantLocal:    []string{"10.1.0.3:80"},
		wantInternal: []string{"10.1.0.3:80", "10.1.0.4:80"},
		wantExternal: []string{"10.1.0.3:80", "10.1.0.4:80"},
	}, {
		name:         "fallback decided per scope: remote ready, local draining",
		eps:          []Endpoint{readyRemote, drainingLocal},
		wantCluster:  []string{"10.1.0.2:80"},
		wantLocal:    []string{"10.1.0.3:80"},
		internalLoc:  true,
		wantInternal: []string{"10.1.0.3:80"},
		wantExternal: []string{"10.1.0.2:80"},
	}, {
		name:         "ready and terminating counts as ready",
		eps:          []Endpoint{readyTermLocal, drainingRemote},
		wantCluster:  []string{"10.1.0.7:80"},
		wantLocal:    []string{"10.1.0.7:80"},
		wantInternal: []string{"10.1.0.7:80"},
		wantExternal: []string{"10.1.0.7:80"},
	}, {
		name:         "nothing usable",
		eps:          []Endpoint{deadLocal, notReadyRemote, servingOnlyRemote},
		internalLoc:  true,
		externalLoc:  true,
		wantInternal: nil,
		wantExternal: nil,
	}, {
		name:         "external Local: only local endpoints",
		eps:          []Endpoint{readyLocal, readyRemote},
		wantCluster:  []string{"10.1.0.1:80", "10.1.0.2:80"},
		wantLocal:    []string{"10.1.0.1:80"},
		externalLoc:  true,
		wantInternal: []string{"10.1.0.1:80", "10.1.0.2:80"},
		wantExternal: []string{"10.1.0.1:80"},
	}, {
		name:         "Local with no local endpoint: none",
		eps:          []Endpoint{readyRemote, drainingRemote},
		wantCluster:  []string{"10.1.0.2:80"},
		internalLoc:  true,
		externalLoc:  true,
		wantInternal: nil,
		wantExternal: nil,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := &ServicePort{Endpoints: tt.eps, InternalPolicyLocal: tt.internalLoc, ExternalPolicyLocal: tt.externalLoc}
			for _, c := range []struct {
				name      string
				got, want []string
			}{
				{"ClusterEndpoints", epStrings(sp.ClusterEndpoints()), tt.wantCluster},
				{"LocalEndpoints", epStrings(sp.LocalEndpoints()), tt.wantLocal},
				{"InternalEndpoints", epStrings(sp.InternalEndpoints()), tt.wantInternal},
				{"ExternalEndpoints", epStrings(sp.ExternalEndpoints()), tt.wantExternal},
			} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
				}
			}
		})
	}
}

func TestUsesExternal(t *testing.T) {
	tests := []struct {
		name string
		sp   ServicePort
		want bool
	}{
		{"cluster IP only", ServicePort{}, false},
		{"node port", ServicePort{NodePort: 30000}, true},
		{"external IP", ServicePort{ExternalIPs: []netip.Addr{addr("198.18.0.1")}}, true},
		{"load-balancer IP", ServicePort{LoadBalancerIPs: []netip.Addr{addr("198.18.0.1")}}, true},
	}
	for _, tt := range tests {
		if got := tt.sp.UsesExternal(); got != tt.want {
			t.Errorf("%s: UsesExternal = %v, want %v", tt.name, got, tt.want)
		}
	}
}
