package model

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestShouldSkip(t *testing.T) {
	tests := []struct {
		name       string
		svc        *corev1.Service
		wantSkip   bool
		wantReason string
	}{
		{"cluster IP", service(), false, ""},
		{"headless None", service(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }), true, "headless"},
		{"headless empty", service(func(s *corev1.Service) { s.Spec.ClusterIP = "" }), true, "headless"},
		{"ExternalName", service(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }), true, "ExternalName"},
		{"other proxy", service(func(s *corev1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: "cilium"}
		}), true, `service.kubernetes.io/service-proxy-name="cilium"`},
		{"other proxy, empty value", service(func(s *corev1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: ""}
		}), true, "service-proxy-name"},
		{"unrelated label", service(func(s *corev1.Service) { s.Labels = map[string]string{"app": "web"} }), false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			skip, reason := ShouldSkip(tt.svc)
			if skip != tt.wantSkip || !strings.Contains(reason, tt.wantReason) || (!skip && reason != "") {
				t.Errorf("ShouldSkip = %v, %q; want %v, containing %q", skip, reason, tt.wantSkip, tt.wantReason)
			}
			if skip {
				sps, errs := BuildServicePorts(tt.svc, slicesOf([]*discoveryv1.EndpointSlice{slice("s", discoveryv1.AddressTypeIPv4, http(80), ep("10.1.0.1"))}), Node{Name: node})
				if sps != nil || errs != nil {
					t.Errorf("BuildServicePorts of skipped service = %v, %v; want nothing", sps, errs)
				}
			}
		})
	}
}

// TestBuildServicePortsFull checks every field of a port.
func TestBuildServicePortsFull(t *testing.T) {
	vip, proxy := corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc := service(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalIPs = []string{"198.18.0.1", "2001:db8::1", "198.18.0.2"}
		s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", " 192.168.1.1 ", "2001:db8::/32", "172.16.5.5/12"}
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &local
		s.Spec.HealthCheckNodePort = 31000
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: "198.18.1.1"},
			{IP: "198.18.1.2", IPMode: &vip},
			{IP: "198.18.1.3", IPMode: &proxy},
			{Hostname: "lb.example.com"},
			{IP: "2001:db8::2"},
		}
	})
	zone := "zone-1"
	eps := []*discoveryv1.EndpointSlice{slice("web-1", discoveryv1.AddressTypeIPv4, http(8080),
		ep("10.1.0.2", on("node-b")),
		ep("10.1.0.1", on(node), func(e *discoveryv1.Endpoint) { e.Zone = &zone }),
	)}

	got, errs := BuildServicePorts(svc, slicesOf(eps), Node{Name: node})
	if errs != nil {
		t.Fatalf("errors: %v", errs)
	}
	want := []*ServicePort{{
		Name:                     ServicePortName{Namespace: "ns", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP},
		Family:                   corev1.IPv4Protocol,
		ClusterIP:                addr("10.0.0.1"),
		Protocol:                 corev1.ProtocolTCP,
		Port:                     80,
		NodePort:                 30080,
		ExternalIPs:              []netip.Addr{addr("198.18.0.1"), addr("198.18.0.2")},
		LoadBalancerIPs:          []netip.Addr{addr("198.18.1.1"), addr("198.18.1.2")},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.1/32"), netip.MustParsePrefix("172.16.0.0/12")},
		AffinityTimeout:          DefaultAffinityTimeout,
		ExternalPolicyLocal:      true,
		InternalPolicyLocal:      true,
		HealthCheckNodePort:      31000,
		Endpoints: []Endpoint{
			{IP: addr("10.1.0.1"), Port: 8080, Ready: true, Serving: true, IsLocal: true},
			{IP: addr("10.1.0.2"), Port: 8080, Ready: true, Serving: true},
		},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%+v\nwant\n%+v", *got[0], *want[0])
	}
}

func TestBuildServicePorts(t *testing.T) {
	v4, v6, fqdn := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	other := func(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
		s.Labels[discoveryv1.LabelServiceName] = "other"
		return s
	}
	otherNS := func(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
		s.Namespace = "elsewhere"
		return s
	}
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   []string
	}{{
		name: "no slices",
		svc:  service(),
		want: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps="},
	}, {
		name: "several slices merged and sorted",
		svc:  service(),
		slices: []*discoveryv1.EndpointSlice{
			slice("b", v4, http(8080), ep("10.1.0.9"), ep("10.1.0.10")),
			slice("a", v4, http(8080), ep("10.1.0.2")),
		},
		want: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.2:8080,10.1.0.9:8080,10.1.0.10:8080"},
	}, {
		name: "slices of other services, namespaces and address types ignored",
		svc:  service(),
		slices: []*discoveryv1.EndpointSlice{
			slice("mine", v4, http(8080), ep("10.1.0.1")),
			other(slice("theirs", v4, http(8080), ep("10.1.0.2"))),
			otherNS(slice("far", v4, http(8080), ep("10.1.0.3"))),
			slice("names", fqdn, http(8080), ep("db.example.com")),
			slice("six", v6, http(8080), ep("fd01::1")),
		},
		want: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name: "same endpoint in two slices counted once",
		svc:  service(),
		slices: []*discoveryv1.EndpointSlice{
			slice("a", v4, http(8080), ep("10.1.0.1"), ep("10.1.0.2")),
			slice("b", v4, http(8080), ep("10.1.0.1")),
		},
		want: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080,10.1.0.2:8080"},
	}, {
		name: "same IP on another port number is another endpoint",
		svc:  service(),
		slices: []*discoveryv1.EndpointSlice{
			slice("a", v4, http(8080), ep("10.1.0.1")),
			slice("b", v4, http(8081), ep("10.1.0.1")),
		},
		want: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080,10.1.0.1:8081"},
	}, {
		name: "dual-stack: one port per family with that family's endpoints",
		svc:  service(dualStack, func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 30080 }),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-v6", v6, http(8080), ep("fd01::2"), ep("fd01::1")),
			slice("web-v4", v4, http(8080), ep("10.1.0.1")),
		},
		want: []string{
			"http: IPv4 10.0.0.1:80/TCP np=30080 eps=10.1.0.1:8080",
			"http: IPv6 [fd00::1]:80/TCP np=30080 eps=[fd01::1]:8080,[fd01::2]:8080",
		},
	}, {
		name: "IPv6 primary comes first",
		svc: service(func(s *corev1.Service) {
			s.Spec.ClusterIP = "fd00::1"
			s.Spec.ClusterIPs = []string{"fd00::1", "10.0.0.1"}
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
		}),
		want: []string{"http: IPv6 [fd00::1]:80/TCP np=0 eps=", "http: IPv4 10.0.0.1:80/TCP np=0 eps="},
	}, {
		name: "only spec.clusterIP set",
		svc:  service(func(s *corev1.Service) { s.Spec.ClusterIPs, s.Spec.IPFamilies = nil, nil }),
		want: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps="},
	}, {
		name: "named target ports resolve per slice",
		svc:  service(withPorts(svcPort("http", 80, tcp), svcPort("metrics", 9090, tcp))),
		slices: []*discoveryv1.EndpointSlice{
			// Pods of two versions expose "http" on different numbers.
			slice("v1", v4, ports(port("http", 8080, tcp), port("metrics", 9100, tcp)), ep("10.1.0.1"), ep("10.1.0.2")),
			slice("v2", v4, ports(port("http", 8081, tcp), port("metrics", 9100, tcp)), ep("10.1.0.3")),
		},
		want: []string{
			"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080,10.1.0.2:8080,10.1.0.3:8081",
			"metrics: IPv4 10.0.0.1:9090/TCP np=0 eps=10.1.0.1:9100,10.1.0.2:9100,10.1.0.3:9100",
		},
	}, {
		name: "ports match by name and protocol",
		svc:  service(withPorts(svcPort("dns", 53, udp), svcPort("dns", 53, tcp))),
		slices: []*discoveryv1.EndpointSlice{
			slice("a", v4, ports(port("dns", 5353, udp), port("dns", 5354, tcp)), ep("10.1.0.1")),
			slice("b", v4, ports(port("dns-other", 53, udp)), ep("10.1.0.2")),
		},
		want: []string{
			"dns: IPv4 10.0.0.1:53/UDP np=0 eps=10.1.0.1:5353",
			"dns: IPv4 10.0.0.1:53/TCP np=0 eps=10.1.0.1:5354",
		},
	}, {
		name: "unnamed port",
		svc:  service(withPorts(svcPort("", 80, ""))),
		slices: []*discoveryv1.EndpointSlice{
			slice("a", v4, []discoveryv1.EndpointPort{{Name: new(""), Port: new(int32(8080))}}, ep("10.1.0.1")),
		},
		want: []string{": IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name: "legacy IPv4 with leading zeros",
		svc: service(func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "010.000.000.001", []string{"010.000.000.001"}
		}),
		slices: []*discoveryv1.EndpointSlice{slice("a", v4, http(8080), ep("010.001.000.001"))},
		want:   []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := BuildServicePorts(tt.svc, slicesOf(tt.slices), Node{Name: node})
			if errs != nil {
				t.Fatalf("errors: %v", errs)
			}
			if s := summaries(got); !slices.Equal(s, tt.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(s, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestBuildEndpointConditions(t *testing.T) {
	tests := []struct {
		name string
		opts []func(*discoveryv1.Endpoint)
		want Endpoint
	}{
		{"nil conditions", nil, Endpoint{Ready: true, Serving: true}},
		{"not ready, nil serving counts as serving", []func(*discoveryv1.Endpoint){ready(false)}, Endpoint{Serving: true}},
		{"draining", []func(*discoveryv1.Endpoint){draining}, Endpoint{Serving: true, Terminating: true}},
		{"terminating, not serving", []func(*discoveryv1.Endpoint){ready(false), serving(false), terminating(true)}, Endpoint{Terminating: true}},
		{"ready and terminating", []func(*discoveryv1.Endpoint){ready(true), terminating(true)}, Endpoint{Ready: true, Serving: true, Terminating: true}},
		{"local", []func(*discoveryv1.Endpoint){on(node)}, Endpoint{Ready: true, Serving: true, IsLocal: true}},
		{"remote", []func(*discoveryv1.Endpoint){on("node-b")}, Endpoint{Ready: true, Serving: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1", tt.opts...))
			got, errs := BuildServicePorts(service(), slicesOf([]*discoveryv1.EndpointSlice{s}), Node{Name: node})
			if errs != nil || len(got) != 1 || len(got[0].Endpoints) != 1 {
				t.Fatalf("got %v, %v; want one port with one endpoint", got, errs)
			}
			tt.want.IP, tt.want.Port = addr("10.1.0.1"), 8080
			if got[0].Endpoints[0] != tt.want {
				t.Errorf("got %+v, want %+v", got[0].Endpoints[0], tt.want)
			}
		})
	}
	t.Run("no node name, nothing is local", func(t *testing.T) {
		s := slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1"))
		got, _ := BuildServicePorts(service(), slicesOf([]*discoveryv1.EndpointSlice{s}), Node{})
		if got[0].Endpoints[0].IsLocal {
			t.Error("endpoint without node name is local on a node without name")
		}
	})
}

// TestBuildDuplicatePreference checks which copy of an endpoint found in
// two slices wins, whatever the order of the slices.
func TestBuildDuplicatePreference(t *testing.T) {
	tests := []struct {
		name string
		a, b []func(*discoveryv1.Endpoint)
		want Endpoint
	}{
		{"ready beats not ready", []func(*discoveryv1.Endpoint){ready(false), on("old")}, []func(*discoveryv1.Endpoint){on(node)},
			Endpoint{Ready: true, Serving: true, IsLocal: true}},
		{"ready beats draining", []func(*discoveryv1.Endpoint){draining, on("old")}, []func(*discoveryv1.Endpoint){ready(true), on(node)},
			Endpoint{Ready: true, Serving: true, IsLocal: true}},
		{"not terminating beats terminating", []func(*discoveryv1.Endpoint){ready(true), terminating(true), on("old")}, []func(*discoveryv1.Endpoint){ready(true), on(node)},
			Endpoint{Ready: true, Serving: true, IsLocal: true}},
		{"draining beats not serving", []func(*discoveryv1.Endpoint){ready(false), serving(false), terminating(true), on("old")}, []func(*discoveryv1.Endpoint){draining, on(node)},
			Endpoint{Serving: true, Terminating: true, IsLocal: true}},
	}
	for _, tt := range tests {
		for _, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
			t.Run(tt.name+" "+order[0]+order[1], func(t *testing.T) {
				worse := slice(order[0], discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1", tt.a...))
				better := slice(order[1], discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1", tt.b...))
				got, errs := BuildServicePorts(service(), slicesOf([]*discoveryv1.EndpointSlice{worse, better}), Node{Name: node})
				if errs != nil || len(got[0].Endpoints) != 1 {
					t.Fatalf("got %v, %v; want one endpoint", got[0].Endpoints, errs)
				}
				tt.want.IP, tt.want.Port = addr("10.1.0.1"), 8080
				if got[0].Endpoints[0] != tt.want {
					t.Errorf("got %+v, want %+v", got[0].Endpoints[0], tt.want)
				}
			})
		}
	}
}

// TestBuildDuplicateTie: of two copies of an endpoint that are equally
// preferred, the one in the slice first by name wins, whatever order the
// slices come in; and the endpoints come out sorted, each once.
func TestBuildDuplicateTie(t *testing.T) {
	// Slice a's endpoints are on this node, slice b's elsewhere.
	a := slice("a", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.2", on(node)), ep("10.1.0.1", on(node)))
	b := slice("b", discoveryv1.AddressTypeIPv4, http(8080), ep("10.1.0.1", on("b")), ep("10.1.0.3", on("b")), ep("10.1.0.2", on("b")))
	for _, in := range [][]*discoveryv1.EndpointSlice{{a, b}, {b, a}} {
		got, errs := BuildServicePorts(service(), slicesOf(in), Node{Name: node})
		if errs != nil || len(got) != 1 {
			t.Fatalf("got %v, %v; want one port", got, errs)
		}
		var seen []string
		for _, e := range got[0].Endpoints {
			from := "b"
			if e.IsLocal {
				from = "a"
			}
			seen = append(seen, e.String()+" from "+from)
		}
		want := []string{"10.1.0.1:8080 from a", "10.1.0.2:8080 from a", "10.1.0.3:8080 from b"}
		if !slices.Equal(seen, want) {
			t.Errorf("slices %s, %s: endpoints %v, want %v", in[0].Name, in[1].Name, seen, want)
		}
	}
}

func TestBuildSessionAffinityAndRanges(t *testing.T) {
	timeout := func(sec int32) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &sec}}
		}
	}
	ranges := func(r ...string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = r }
	}
	tests := []struct {
		name        string
		svc         *corev1.Service
		wantTimeout time.Duration
		wantRanges  []string // per family, IPv4 then IPv6
	}{
		{"no affinity", service(), 0, []string{""}},
		{"ClientIP without config", service(func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }), 3 * time.Hour, []string{""}},
		{"ClientIP with empty config", service(func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
		}), 3 * time.Hour, []string{""}},
		{"ClientIP 60s", service(timeout(60)), time.Minute, []string{""}},
		{"config without ClientIP affinity", service(timeout(60), func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityNone }), 0, []string{""}},
		{"ranges split by family", service(dualStack, ranges("2001:db8::/64", "10.0.0.0/8", "fd00::5")), 0, []string{"10.0.0.0/8", "2001:db8::/64,fd00::5/128"}},
		{"host bits masked", service(ranges("10.1.2.3/16")), 0, []string{"10.1.0.0/16"}},
		{"IPv4-mapped ranges read as IPv4", service(dualStack, ranges("::ffff:10.0.0.0/104", "::ffff:192.168.1.1")), 0, []string{"10.0.0.0/8,192.168.1.1/32", ""}},
		{"zero range allows all of its family", service(dualStack, ranges("10.0.0.0/8", "0.0.0.0/0", "2001:db8::/64")), 0, []string{"", "2001:db8::/64"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := BuildServicePorts(tt.svc, slicesOf(nil), Node{Name: node})
			if errs != nil {
				t.Fatalf("errors: %v", errs)
			}
			var gotRanges []string
			for _, sp := range got {
				if sp.AffinityTimeout != tt.wantTimeout {
					t.Errorf("%s: AffinityTimeout = %v, want %v", sp.Family, sp.AffinityTimeout, tt.wantTimeout)
				}
				var rs []string
				for _, p := range sp.LoadBalancerSourceRanges {
					rs = append(rs, p.String())
				}
				gotRanges = append(gotRanges, strings.Join(rs, ","))
			}
			if !slices.Equal(gotRanges, tt.wantRanges) {
				t.Errorf("source ranges = %q, want %q", gotRanges, tt.wantRanges)
			}
		})
	}
}

// TestBuildMalformed feeds broken input: nothing panics, each broken piece
// is reported once by field and value, and everything else is built.
func TestBuildMalformed(t *testing.T) {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	tcp := corev1.ProtocolTCP
	good := slice("good", v4, http(8080), ep("10.1.0.1"))
	twoPorts := withPorts(svcPort("http", 80, tcp), svcPort("metrics", 9090, tcp))
	tests := []struct {
		name      string
		svc       *corev1.Service
		slices    []*discoveryv1.EndpointSlice
		wantErrs  []string // one substring per expected error, in order
		wantPorts []string
	}{{
		name:      "unparsable cluster IP of one family",
		svc:       service(dualStack, func(s *corev1.Service) { s.Spec.ClusterIPs[1] = "fd00::zz" }),
		slices:    []*discoveryv1.EndpointSlice{good},
		wantErrs:  []string{`service ns/web: spec.clusterIPs[1] "fd00::zz": not an IP address`},
		wantPorts: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name:      "cluster IP not in its family",
		svc:       service(dualStack, func(s *corev1.Service) { s.Spec.ClusterIPs[1] = "10.0.0.2" }),
		slices:    []*discoveryv1.EndpointSlice{good},
		wantErrs:  []string{`spec.clusterIPs[1] "10.0.0.2": address is IPv4 but spec.ipFamilies[1] is "IPv6"`},
		wantPorts: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name: "two cluster IPs of one family",
		svc: service(func(s *corev1.Service) {
			s.Spec.ClusterIPs = []string{"10.0.0.1", "10.0.0.2"}
			s.Spec.IPFamilies = nil
		}),
		wantErrs:  []string{`spec.clusterIPs[1] "10.0.0.2": second cluster IP of family IPv4`},
		wantPorts: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps="},
	}, {
		name:      "cluster IP with zone",
		svc:       service(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"fe80::1%eth0"} }),
		wantErrs:  []string{`spec.clusterIPs[0] "fe80::1%eth0": not an IP address`},
		wantPorts: nil,
	}, {
		name:      "only spec.clusterIP, unparsable",
		svc:       service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "bogus", nil }),
		wantErrs:  []string{`spec.clusterIP "bogus": not an IP address`},
		wantPorts: nil,
	}, {
		name:     "bad service ports",
		svc:      service(withPorts(svcPort("neg", -1, tcp), svcPort("big", 65536, tcp), svcPort("icmp", 1, "ICMP"), svcPort("http", 80, tcp), svcPort("http", 81, tcp))),
		slices:   []*discoveryv1.EndpointSlice{good},
		wantErrs: []string{`spec.ports[0].port "-1"`, `spec.ports[1].port "65536"`, `spec.ports[2].protocol "ICMP"`, `spec.ports[4].name "http": duplicate`},
		wantPorts: []string{
			"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080",
		},
	}, {
		name:      "bad node port clears only the node port",
		svc:       service(func(s *corev1.Service) { s.Spec.Ports[0].NodePort = -5 }),
		slices:    []*discoveryv1.EndpointSlice{good},
		wantErrs:  []string{`spec.ports[0].nodePort "-5"`},
		wantPorts: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}, {
		name: "bad external, load-balancer and source-range addresses",
		svc: service(func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"198.18.0.1", "198.18.0"}
			s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33", "10.0.0.0/8", "::ffff:0:0/95"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "lb"}, {IP: "198.18.1.1"}}
		}),
		wantErrs: []string{
			`spec.externalIPs[1] "198.18.0": not an IP address`,
			`status.loadBalancer.ingress[0].ip "lb": not an IP address`,
			`spec.loadBalancerSourceRanges[0] "10.0.0.0/33": not a CIDR or IP address`,
			`spec.loadBalancerSourceRanges[2] "::ffff:0:0/95": not a CIDR or IP address`,
		},
		wantPorts: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps="},
	}, {
		name: "bad affinity timeout and health check port",
		svc: service(func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(-5))}}
			s.Spec.HealthCheckNodePort = 70000
		}),
		wantErrs: []string{
			`spec.sessionAffinityConfig.clientIP.timeoutSeconds "-5": not 1-86400; using the default 10800`,
			`spec.healthCheckNodePort "70000"`,
		},
		wantPorts: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps="},
	}, {
		name: "bad slice ports skip only that port",
		svc:  service(twoPorts),
		slices: []*discoveryv1.EndpointSlice{slice("bad", v4, []discoveryv1.EndpointPort{
			{Port: new(int32(8080))},
			{Name: new("http")},
			{Name: new("http"), Port: new(int32(0))},
			port("metrics", 9100, tcp),
			port("metrics", 9101, tcp),
		}, ep("10.1.0.1")), good},
		wantErrs: []string{
			`service ns/web endpointslice bad: ports[0].name "<nil>": missing port name`,
			`endpointslice bad: ports[1].port "<nil>": missing port number`,
			`endpointslice bad: ports[2].port "0"`,
			`endpointslice bad: ports[4].name "metrics": duplicate`,
		},
		wantPorts: []string{
			"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080",
			"metrics: IPv4 10.0.0.1:9090/TCP np=0 eps=10.1.0.1:9100",
		},
	}, {
		name: "bad endpoint addresses skip only that endpoint",
		svc:  service(dualStack),
		slices: []*discoveryv1.EndpointSlice{
			slice("bad", v4, http(8080), ep("10.1.0.9"), discoveryv1.Endpoint{}, ep("10.1.0.300"), ep("fd01::1")),
			slice("bad6", v6, http(8080), ep("10.1.0.8"), ep("fd01::2")),
			good,
		},
		wantErrs: []string{
			`endpointslice bad: endpoints[1].addresses "": no address`,
			`endpointslice bad: endpoints[2].addresses[0] "10.1.0.300": not an IP address`,
			`endpointslice bad: endpoints[3].addresses[0] "fd01::1": not an address of the slice's type IPv4`,
			`endpointslice bad6: endpoints[0].addresses[0] "10.1.0.8": not an address of the slice's type IPv6`,
		},
		wantPorts: []string{
			"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080,10.1.0.9:8080",
			"http: IPv6 [fd00::1]:80/TCP np=0 eps=[fd01::2]:8080",
		},
	}, {
		name:      "nil slice and slice without labels",
		svc:       service(),
		slices:    []*discoveryv1.EndpointSlice{nil, {AddressType: v4}, good},
		wantPorts: []string{"http: IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := BuildServicePorts(tt.svc, slicesOf(tt.slices), Node{Name: node})
			if len(errs) != len(tt.wantErrs) {
				t.Errorf("got %d errors, want %d: %v", len(errs), len(tt.wantErrs), errs)
			}
			for i, err := range errs {
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Service != (ServiceName{Namespace: "ns", Name: "web"}) {
					t.Errorf("error %d %v is not a FieldError of ns/web", i, err)
				}
				if i < len(tt.wantErrs) && !strings.Contains(err.Error(), tt.wantErrs[i]) {
					t.Errorf("error %d = %q, want it to contain %q", i, err, tt.wantErrs[i])
				}
			}
			if s := summaries(got); !slices.Equal(s, tt.wantPorts) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(s, "\n"), strings.Join(tt.wantPorts, "\n"))
			}
		})
	}
	t.Run("nil service", func(t *testing.T) {
		got, errs := BuildServicePorts(nil, slicesOf([]*discoveryv1.EndpointSlice{good}), Node{Name: node})
		if got != nil || len(errs) != 1 {
			t.Errorf("got %v, %v; want no ports and one error", got, errs)
		}
	})
}

// Fixtures: a Service "ns/web" with cluster IP 10.0.0.1 and one TCP port
// "http" 80, and slices and endpoints built from short option lists.

const node = "node-a"

func service(opts ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.0.0.1",
			ClusterIPs: []string{"10.0.0.1"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func dualStack(s *corev1.Service) {
	s.Spec.ClusterIPs = []string{"10.0.0.1", "fd00::1"}
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
}

func withPorts(ports ...corev1.ServicePort) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Ports = ports }
}

func svcPort(name string, port int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, Protocol: proto}
}

// slice returns an EndpointSlice of service ns/web.
func slice(name string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: at,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func ports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

func port(name string, p int32, proto corev1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: &name, Port: &p, Protocol: &proto}
}

func http(p int32) []discoveryv1.EndpointPort { return ports(port("http", p, corev1.ProtocolTCP)) }

// ep returns an endpoint with nil conditions, modified by opts.
func ep(addr string, opts ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func on(n string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.NodeName = &n }
}

func ready(b bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Ready = &b }
}

func serving(b bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Serving = &b }
}

func terminating(b bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Terminating = &b }
}

// draining marks an endpoint as kubelet does during graceful termination.
func draining(e *discoveryv1.Endpoint) {
	ready(false)(e)
	serving(true)(e)
	terminating(true)(e)
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// summary renders a port compactly, e.g.
// "IPv4 10.0.0.1:80/TCP np=0 eps=10.1.0.1:8080,10.1.0.2:8080".
func summary(sp *ServicePort) string {
	var eps []string
	for _, e := range sp.Endpoints {
		eps = append(eps, e.String())
	}
	return fmt.Sprintf("%s %s/%s np=%d eps=%s", sp.Family,
		netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)), sp.Protocol, sp.NodePort, strings.Join(eps, ","))
}

func summaries(sps []*ServicePort) []string {
	var out []string
	for _, sp := range sps {
		out = append(out, sp.Name.Port+": "+summary(sp))
	}
	return out
}

// epStrings renders endpoints as ip:port.
func epStrings(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.String())
	}
	return out
}
