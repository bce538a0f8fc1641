package model

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// svcAt returns Service ns/name with one TCP port 80 (or those given by
// opts) and the cluster IP, created at minute created of the test's clock.
func svcAt(ns, name, clusterIP string, created int, opts ...func(*corev1.Service)) *corev1.Service {
	return service(append([]func(*corev1.Service){func(s *corev1.Service) {
		s.Namespace, s.Name = ns, name
		s.Spec.ClusterIP, s.Spec.ClusterIPs = clusterIP, []string{clusterIP}
		s.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, created, 0, 0, time.UTC))
	}}, opts...)...)
}

func externalIPs(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

func lbIngress(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
	}
}

// externalOf renders the external addresses the model holds for every
// port of every service, as "ns/name:port ext=... lb=... ranges=N".
func externalOf(s *Snapshot) []string {
	var out []string
	for _, byName := range s.Ports {
		for name, sp := range byName {
			out = append(out, fmt.Sprintf("%s ext=%v lb=%v ranges=%d", name, sp.ExternalIPs, sp.LoadBalancerIPs, len(sp.LoadBalancerSourceRanges)))
		}
	}
	slices.Sort(out)
	return out
}

// refusalTexts keeps the Refusals among errs, as text.
func refusalTexts(errs []error) []string {
	var out []string
	for _, err := range errs {
		if r := (*Refusal)(nil); errors.As(err, &r) {
			out = append(out, r.Error())
		}
	}
	slices.Sort(out)
	return out
}

func TestClaims(t *testing.T) {
	evil := func(created int, opts ...func(*corev1.Service)) *corev1.Service {
		return svcAt("a", "evil", "10.0.0.66", created, opts...)
	}
	tests := []struct {
		name string
		// events run in order against a fresh Tracker for node-a.
		events       func(tr *Tracker)
		wantModel    []string
		wantRefusals []string
		wantRefused  int
	}{{
		name: "an externalIP equal to another Service's cluster IP is refused",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(dns(0))
			tr.OnServiceAdd(evil(1, externalIPs("10.0.0.10", "192.0.2.7")))
		},
		wantModel: []string{
			"a/evil:http/TCP ext=[192.0.2.7] lb=[] ranges=0",
			"kube-system/dns:http/TCP ext=[] lb=[] ranges=0",
		},
		wantRefusals: []string{"service a/evil: spec.externalIPs 10.0.0.10 not routed to it: it is the cluster IP of Service kube-system/dns"},
		wantRefused:  1,
	}, {
		name: "the cluster IP wins whichever Service arrives first",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(evil(0, externalIPs("10.0.0.10")))
			tr.OnServiceAdd(dns(1))
		},
		wantModel: []string{
			"a/evil:http/TCP ext=[] lb=[] ranges=0",
			"kube-system/dns:http/TCP ext=[] lb=[] ranges=0",
		},
		wantRefusals: []string{"service a/evil: spec.externalIPs 10.0.0.10 not routed to it: it is the cluster IP of Service kube-system/dns"},
		wantRefused:  1,
	}, {
		name: "the address returns when the cluster IP's Service is deleted",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(dns(0))
			tr.OnServiceAdd(evil(1, externalIPs("10.0.0.10")))
			tr.OnServiceDelete(dns(0))
		},
		wantModel:    []string{"a/evil:http/TCP ext=[10.0.0.10] lb=[] ranges=0"},
		wantRefusals: []string{"service a/evil: spec.externalIPs 10.0.0.10 not routed to it: it is the cluster IP of Service kube-system/dns"},
	}, {
		name: "a load-balancer IP equal to a node address is refused, with its source ranges",
		events: func(tr *Tracker) {
			tr.SetNodeAddrs([]netip.Addr{netip.MustParseAddr("192.0.2.1")})
			tr.OnServiceAdd(evil(0, lbIngress("192.0.2.1")))
		},
		wantModel:    []string{"a/evil:http/TCP ext=[] lb=[] ranges=0"},
		wantRefusals: []string{"service a/evil: status.loadBalancer.ingress 192.0.2.1 not routed to it: it is an address of node node-a"},
		wantRefused:  1,
	}, {
		name: "an externalIP refused when it becomes a node address, kept when it stops being one",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(evil(0, externalIPs("192.0.2.1")))
			tr.SetNodeAddrs([]netip.Addr{netip.MustParseAddr("192.0.2.1")})
			tr.SetNodeAddrs(nil)
		},
		wantModel:    []string{"a/evil:http/TCP ext=[192.0.2.1] lb=[] ranges=0"},
		wantRefusals: []string{"service a/evil: spec.externalIPs 192.0.2.1 not routed to it: it is an address of node node-a"},
	}, {
		name: "one externalIP on one port: the older Service keeps it, whatever the names",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(svcAt("z", "web", "10.0.0.2", 0, externalIPs("192.0.2.9")))
			tr.OnServiceAdd(evil(1, externalIPs("192.0.2.9")))
		},
		wantModel: []string{
			"a/evil:http/TCP ext=[] lb=[] ranges=0",
			"z/web:http/TCP ext=[192.0.2.9] lb=[] ranges=0",
		},
		wantRefusals: []string{"service a/evil: spec.externalIPs 192.0.2.9 port 80/TCP not routed to it: Service z/web takes it on this port (it is older)"},
		wantRefused:  1,
	}, {
		name: "one externalIP on different ports is shared",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(svcAt("z", "web", "10.0.0.2", 0, externalIPs("192.0.2.9")))
			tr.OnServiceAdd(evil(1, externalIPs("192.0.2.9"), withPorts(svcPort("http", 8080, corev1.ProtocolTCP))))
		},
		wantModel: []string{
			"a/evil:http/TCP ext=[192.0.2.9] lb=[] ranges=0",
			"z/web:http/TCP ext=[192.0.2.9] lb=[] ranges=0",
		},
	}, {
		name: "a load-balancer IP goes before an older Service's externalIP",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(evil(0, externalIPs("192.0.2.9")))
			tr.OnServiceAdd(svcAt("z", "web", "10.0.0.2", 1, lbIngress("192.0.2.9")))
		},
		wantModel: []string{
			"a/evil:http/TCP ext=[] lb=[] ranges=0",
			"z/web:http/TCP ext=[] lb=[192.0.2.9] ranges=1",
		},
		wantRefusals: []string{"service a/evil: spec.externalIPs 192.0.2.9 port 80/TCP not routed to it: Service z/web takes it on this port (a load-balancer IP goes before an externalIP)"},
		wantRefused:  1,
	}, {
		name: "the winner deleted: the other Service takes the address",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(svcAt("z", "web", "10.0.0.2", 0, externalIPs("192.0.2.9")))
			tr.OnServiceAdd(evil(1, externalIPs("192.0.2.9")))
			tr.OnServiceDelete(svcAt("z", "web", "10.0.0.2", 0))
		},
		wantModel:    []string{"a/evil:http/TCP ext=[192.0.2.9] lb=[] ranges=0"},
		wantRefusals: []string{"service a/evil: spec.externalIPs 192.0.2.9 port 80/TCP not routed to it: Service z/web takes it on this port (it is older)"},
	}, {
		name: "same age: namespace/name order decides",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(svcAt("z", "web", "10.0.0.2", 0, externalIPs("192.0.2.9")))
			tr.OnServiceAdd(evil(0, externalIPs("192.0.2.9")))
		},
		wantModel: []string{
			"a/evil:http/TCP ext=[192.0.2.9] lb=[] ranges=0",
			"z/web:http/TCP ext=[] lb=[] ranges=0",
		},
		wantRefusals: []string{"service z/web: spec.externalIPs 192.0.2.9 port 80/TCP not routed to it: Service a/evil takes it on this port (same age; first by namespace/name)"},
		wantRefused:  1,
	}, {
		name: "a Service's own cluster IP as its externalIP is its own",
		events: func(tr *Tracker) {
			tr.OnServiceAdd(dns(0, externalIPs("10.0.0.10")))
		},
		wantModel: []string{"kube-system/dns:http/TCP ext=[10.0.0.10] lb=[] ranges=0"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errs []error
			tr := NewTracker(node, func(err error) { errs = append(errs, err) })
			tt.events(tr)
			snap, _ := tr.Snapshot()
			if got := externalOf(snap); !slices.Equal(got, tt.wantModel) {
				t.Errorf("model:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.wantModel, "\n  "))
			}
			if got := refusalTexts(errs); !slices.Equal(got, tt.wantRefusals) {
				t.Errorf("refusals reported:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.wantRefusals, "\n  "))
			}
			if got := tr.Refused(); got != tt.wantRefused {
				t.Errorf("Refused() = %d, want %d", got, tt.wantRefused)
			}
		})
	}
}

// dns returns the cluster DNS Service with options (its first argument
// is the minute it was created).
func dns(created int, opts ...func(*corev1.Service)) *corev1.Service {
	return svcAt("kube-system", "dns", "10.0.0.10", created, opts...)
}

// TestClaimChangesReachTheChangeSet checks that a Service whose claims
// change because of another Service is named in the change set, so an
// incremental sync reprograms it.
func TestClaimChangesReachTheChangeSet(t *testing.T) {
	tr := NewTracker(node, nil)
	tr.OnServiceAdd(svcAt("a", "evil", "10.0.0.66", 0, externalIPs("10.0.0.10")))
	tr.Snapshot()

	tr.OnServiceAdd(dns(1))
	_, changed := tr.Snapshot()
	if got, want := changeNames(changed), []string{"a/evil:http/TCP", "kube-system/dns:http/TCP"}; !slices.Equal(got, want) {
		t.Errorf("cluster IP arrived: changed %v, want %v", got, want)
	}

	tr.SetNodeAddrs([]netip.Addr{netip.MustParseAddr("192.0.2.1")})
	if _, changed := tr.Snapshot(); len(changed) != 0 {
		t.Errorf("a node address no Service names: changed %v, want nothing", changeNames(changed))
	}

	// An endpoint change of the winner leaves the loser alone.
	dnsSlice := slice("dns-1", discoveryv1.AddressTypeIPv4, http(53), ep("10.1.0.1"))
	dnsSlice.Namespace, dnsSlice.Labels[discoveryv1.LabelServiceName] = "kube-system", "dns"
	tr.OnEndpointSliceAdd(SliceOf(dnsSlice))
	if _, changed := tr.Snapshot(); !slices.Equal(changeNames(changed), []string{"kube-system/dns:http/TCP"}) {
		t.Errorf("endpoint of dns changed: changed %v, want only kube-system/dns:http/TCP", changeNames(changed))
	}
}

// TestRefusalsReportedOnce checks that a refusal is reported when it
// starts, not again while it stays the same.
func TestRefusalsReportedOnce(t *testing.T) {
	var errs []error
	tr := NewTracker(node, func(err error) { errs = append(errs, err) })
	tr.OnServiceAdd(dns(0))
	evil := svcAt("a", "evil", "10.0.0.66", 1, externalIPs("10.0.0.10"))
	tr.OnServiceAdd(evil)
	evil = evil.DeepCopy()
	evil.ResourceVersion = "2"
	tr.OnServiceUpdate(evil)
	tr.OnServiceUpdate(dns(0, func(s *corev1.Service) { s.ResourceVersion = "2" }))
	if got := refusalTexts(errs); len(got) != 1 {
		t.Errorf("refusals reported %d times, want once: %q", len(got), got)
	}
}
