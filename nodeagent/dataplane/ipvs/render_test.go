package ipvs

import (
	"strings"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// TestRenderGolden pins down what each kind of service becomes: virtual
// services and real servers, bound addresses and helper-table elements.
func TestRenderGolden(t *testing.T) {
	cases := []struct {
		name  string
		f     *family
		cfg   dataplane.NodeConfig
		ports []*model.ServicePort
	}{
		{"clusterip", ipv4, testConfig, []*model.ServicePort{
			svc("default", "web", "http", "10.96.0.10", 80, ep("10.244.1.2", 8080), ep("10.244.2.3", 8080), ep("10.244.3.4", 8080)),
			svc("default", "dns", "dns", "10.96.0.53", 53, udp, ep("10.244.1.9", 53)),
		}},
		{"nodeport", ipv4, testConfig, []*model.ServicePort{
			svc("default", "np", "http", "10.96.0.11", 80, nodePort(30080), ep("10.244.1.5", 8080, local), ep("10.244.2.5", 8080)),
		}},
		{"loadbalancer-source-ranges", ipv4, testConfig, []*model.ServicePort{
			svc("shop", "front", "https", "10.96.0.20", 443, lb("198.18.100.1"), externalIPs("198.18.50.6"),
				sourceRanges("203.0.113.0/24", "192.168.1.0/24"), ep("10.244.1.6", 8443)),
		}},
		{"etp-local", ipv4, testConfig, []*model.ServicePort{
			svc("default", "ingress", "http", "10.96.0.80", 80, nodePort(30081), lb("198.18.100.2"), etpLocal,
				ep("10.244.1.8", 8080, local), ep("10.244.2.8", 8080)),
		}},
		{"etp-local-no-local-endpoints", ipv4, testConfig, []*model.ServicePort{
			svc("default", "ingress", "http", "10.96.0.80", 80, nodePort(30081), etpLocal, ep("10.244.2.8", 8080)),
		}},
		{"itp-local-no-local-endpoints", ipv4, testConfig, []*model.ServicePort{
			svc("default", "node-local", "http", "10.96.0.81", 80, itpLocal, ep("10.244.2.9", 8080)),
		}},
		{"no-endpoints", ipv4, testConfig, []*model.ServicePort{
			svc("default", "empty", "http", "10.96.0.40", 80, nodePort(30040), externalIPs("198.18.50.7")),
		}},
		{"affinity", ipv4, testConfig, []*model.ServicePort{
			svc("default", "session", "http", "10.96.0.30", 80, affinity(3*time.Hour), ep("10.244.1.7", 8080), ep("10.244.2.7", 8080)),
		}},
		{"terminating", ipv4, testConfig, []*model.ServicePort{
			// pod .11 drains; .12 is terminating and no longer serving:
			// it drains too.
			svc("default", "rollout", "http", "10.96.0.90", 80, ep("10.244.1.10", 8080),
				ep("10.244.1.11", 8080, terminating), ep("10.244.1.12", 8080, terminating, notServing)),
			// Nothing ready: the serving terminating endpoint serves.
			svc("default", "fallback", "http", "10.96.0.91", 80, ep("10.244.1.13", 8080, terminating),
				ep("10.244.1.14", 8080, terminating, notServing)),
		}},
		{"masquerade-all", ipv4, dataplane.NodeConfig{MasqueradeAll: true, MasqueradeBit: 14, NodeIPs: testConfig.NodeIPs}, []*model.ServicePort{
			svc("default", "web", "http", "10.96.0.10", 80, ep("10.244.1.2", 8080)),
		}},
		{"shared-external-ip", ipv4, testConfig, []*model.ServicePort{
			// Both want 198.18.50.8:80; "a" is first by name and keeps
			// it, "b" keeps its cluster IP.
			svc("default", "a", "http", "10.96.0.60", 80, externalIPs("198.18.50.8"), ep("10.244.1.20", 8080)),
			svc("default", "b", "http", "10.96.0.61", 80, externalIPs("198.18.50.8"), ep("10.244.1.21", 8080)),
		}},
		{"ipv6", ipv6, testConfig, []*model.ServicePort{
			svc("default", "web", "http", "fd00:10:96::10", 80, nodePort(30080), ep("fd00:10:244:1::2", 8080), ep("fd00:10:244:2::3", 8080, local)),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, conflicts := newState(testRenderConfig(tc.f, tc.cfg), portsOf(tc.ports...), nil)
			if len(conflicts) > 0 {
				t.Errorf("conflicts without foreign virtual services: %v", conflicts)
			}
			dataplanetest.Golden(t, tc.name, dumpState(st))
		})
	}
}

// TestTableChains pins down the helper table's fixed chains.
func TestTableChains(t *testing.T) {
	var b strings.Builder
	for _, f := range families {
		p := dataplane.NewNodePolicy(testConfig, f.Model)
		b.WriteString(dumpTable(f, tableChains(f, p.ClusterCIDRs, p.MasqueradeMark)))
	}
	dataplanetest.Golden(t, "table", b.String())
}

// TestRenderIsPure checks that rendering the same model twice gives the
// same result.
func TestRenderIsPure(t *testing.T) {
	ports := portsOf(
		svc("default", "web", "http", "10.96.0.10", 80, nodePort(30080), lb("198.18.100.1"), sourceRanges("203.0.113.0/24"),
			ep("10.244.1.2", 8080), ep("10.244.2.3", 8080, local)),
		svc("default", "b", "http", "10.96.0.61", 80, externalIPs("198.18.50.8"), ep("10.244.1.21", 8080)),
	)
	a, _ := newState(testRenderConfig(ipv4, testConfig), ports, nil)
	b, _ := newState(testRenderConfig(ipv4, testConfig), ports, nil)
	if dumpState(a) != dumpState(b) {
		t.Errorf("two renders differ:\n%s\n---\n%s", dumpState(a), dumpState(b))
	}
}

// TestNodePortsOnEveryLocalAddress checks that node ports get a virtual
// service on each address the node has when none are configured.
func TestNodePortsOnEveryLocalAddress(t *testing.T) {
	cfg := testConfig
	cfg.NodeIPs = nil
	rc := testRenderConfig(ipv4, cfg)
	rc.nodePortIPs = addrs("10.0.0.5", "192.168.1.10")
	st, _ := newState(rc, portsOf(svc("default", "np", "http", "10.96.0.11", 80, nodePort(30080), ep("10.244.1.5", 8080))), nil)
	services := st.services()
	for _, want := range []string{"tcp/10.0.0.5:30080", "tcp/192.168.1.10:30080", "tcp/10.96.0.11:80"} {
		found := false
		for k := range services {
			found = found || k.String() == want
		}
		if !found {
			t.Errorf("no virtual service %s in\n%s", want, dumpState(st))
		}
	}
	if len(services) != 3 {
		t.Errorf("%d virtual services, want 3:\n%s", len(services), dumpState(st))
	}
}

func TestKernelBefore(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"6.1.0-57-cloud-amd64", false},
		{"5.9.0", false},
		{"5.8.18-100.fc31.x86_64", true},
		{"4.19.0-21-amd64", true},
		{"5.10", false},
		{"garbage", false},
	} {
		if got := kernelBefore(tc.release, 5, 9); got != tc.want {
			t.Errorf("kernelBefore(%q, 5, 9) = %v, want %v", tc.release, got, tc.want)
		}
	}
}
