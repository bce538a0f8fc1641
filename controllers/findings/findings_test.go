package findings

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// node is a ProxyNode served by active (kube-proxy in kpMode when active
// is kube-proxy).
func node(name string, active, kpMode v1alpha1.ProxyMode) *v1alpha1.ProxyNode {
	return &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1alpha1.ProxyNodeStatus{ActiveMode: active, KubeProxyMode: kpMode}}
}

var (
	kpIPTables = node("kp-iptables", v1alpha1.ModeKubeProxy, v1alpha1.ModeIPTables)
	kpNFTables = node("kp-nftables", v1alpha1.ModeKubeProxy, v1alpha1.ModeNFTables)
	kpIPVS     = node("kp-ipvs", v1alpha1.ModeKubeProxy, v1alpha1.ModeIPVS)
	psIPTables = node("ps-iptables", v1alpha1.ModeIPTables, "")
	psNFTables = node("ps-nftables", v1alpha1.ModeNFTables, "")
	psIPVS     = node("ps-ipvs", v1alpha1.ModeIPVS, "")
	idle       = node("idle", "", "")
)

// svc is a ClusterIP Service default/name, changed by the edits.
func svc(name string, edits ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Port: 80}}}}
	for _, e := range edits {
		e(s)
	}
	return s
}

func nodePort(s *corev1.Service) {
	s.Spec.Type = corev1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = 30080
}

func loadBalancer(s *corev1.Service) {
	nodePort(s)
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
}

func localPolicy(s *corev1.Service) {
	loadBalancer(s)
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = 32000
}

func affinity(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }
func ipv6(s *corev1.Service)     { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} }
func headless(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }
func otherProxy(s *corev1.Service) {
	s.Labels = map[string]string{LabelServiceProxyName: ""} // any value, even empty
}

// TestRules checks each rule: the subtest named after a code lists moves
// that must report it (with the objects and count) and moves that must
// not. docs/behaviour-differences.md names these subtests.
func TestRules(t *testing.T) {
	type move struct {
		target   v1alpha1.ProxyMode
		settings *v1alpha1.ProxySettings
		nodes    []*v1alpha1.ProxyNode
		services []*corev1.Service
	}
	type tc struct {
		code string
		// hit must report the code with these objects; miss must not.
		hit     []move
		objects []string
		miss    []move
	}
	strict := &v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{StrictARP: true}}
	// noLocalhost turns localhost NodePorts off in the iptables mode.
	noLocalhost := &v1alpha1.ProxySettings{IPTables: &v1alpha1.IPTablesSettings{LocalhostNodePorts: new(false)}}
	// primary keeps NodePorts on the node's primary addresses.
	primary := &v1alpha1.ProxySettings{NodePortAddresses: []v1alpha1.NodePortAddress{v1alpha1.NodePortAddressPrimary}}
	lb, hc, web, np, aff := svc("lb", loadBalancer), svc("hc", localPolicy), svc("web"), svc("np", nodePort), svc("aff", affinity)
	cases := []tc{
		{code: CodeLocalhostNodePortsNotServed, objects: []string{"default/lb", "default/np"},
			hit: []move{
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{np, lb, web, svc("np6", nodePort, ipv6)}},
				{target: v1alpha1.ModeIPTables, settings: noLocalhost, nodes: []*v1alpha1.ProxyNode{kpIPTables, psNFTables}, services: []*corev1.Service{np, lb}},
			},
			miss: []move{
				{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{np, lb}},
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpNFTables, kpIPVS, psIPTables}, services: []*corev1.Service{np}},
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{web, svc("np6", nodePort, ipv6)}},
			}},
		{code: CodeStrictARPDisabled, objects: []string{"default/ext", "default/lb"},
			hit: []move{{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{
				lb, web, svc("ext", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"198.18.0.1"} })}}},
			miss: []move{
				{target: v1alpha1.ModeIPVS, settings: strict, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{lb}},
				{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{kpIPVS}, services: []*corev1.Service{lb}},
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{lb}},
			}},
		{code: CodeLeavingKubeProxy, objects: []string{"node/kp-iptables", "node/kp-ipvs"},
			hit: []move{{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpIPVS, psIPTables, kpIPTables, idle}}},
			miss: []move{
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{psIPTables, psIPVS, idle}},
				{target: v1alpha1.ModeKubeProxy, nodes: []*v1alpha1.ProxyNode{kpIPTables}},
			}},
		{code: CodeServiceIPsBecomeLocal, objects: []string{"default/lb", "default/web"},
			hit: []move{{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{psNFTables}, services: []*corev1.Service{web, lb, svc("none", headless)}}},
			miss: []move{
				{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{kpIPVS}, services: []*corev1.Service{web}},
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{web}},
			}},
		{code: CodeServiceIPsNoLongerLocal, objects: []string{"default/web"},
			hit: []move{
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{psIPVS}, services: []*corev1.Service{web}},
				{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{kpIPVS}, services: []*corev1.Service{web}},
			},
			miss: []move{
				{target: v1alpha1.ModeKubeProxy, nodes: []*v1alpha1.ProxyNode{psIPVS}, services: []*corev1.Service{web}},
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{psIPTables}, services: []*corev1.Service{web}},
			}},
		{code: CodeSessionAffinityPerAddress, objects: []string{"default/aff"},
			hit: []move{{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{aff, web}}},
			miss: []move{
				{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{kpIPVS}, services: []*corev1.Service{aff}},
				{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{web}},
			}},
		{code: CodeSessionAffinityReset, objects: []string{"default/aff"},
			hit: []move{
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{psIPTables}, services: []*corev1.Service{aff, web}},
				{target: v1alpha1.ModeKubeProxy, nodes: []*v1alpha1.ProxyNode{psIPVS}, services: []*corev1.Service{aff}},
			},
			miss: []move{
				{target: v1alpha1.ModeKubeProxy, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{aff}}, // stays on kube-proxy
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{psNFTables, idle}, services: []*corev1.Service{aff}},
			}},
		{code: CodeExternalLocalForNodeClients, objects: []string{"default/hc"},
			hit:  []move{{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{psIPTables}, services: []*corev1.Service{hc, lb}}},
			miss: []move{{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{psIPTables}, services: []*corev1.Service{hc}}}},
		{code: CodeSourceRangesDropSilently, objects: []string{"default/ranged"},
			hit: []move{{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{
				lb, svc("ranged", loadBalancer, func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16"} })}}},
			miss: []move{{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{psNFTables}, services: []*corev1.Service{
				svc("ranged", loadBalancer, func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16"} })}}}},
		{code: CodeUndeclaredPortsNotRejected, objects: []string{"default/web"},
			hit: []move{
				{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{web}},
				{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{psNFTables}, services: []*corev1.Service{web}},
			},
			miss: []move{
				{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{kpIPTables}, services: []*corev1.Service{web}},
				{target: v1alpha1.ModeIPVS, nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{web}},
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{web}},
			}},
		{code: CodeNodePortsOnEveryAddress, objects: []string{"default/lb", "default/np", "default/np6"},
			hit: []move{
				{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{np, lb, web, svc("np6", nodePort, ipv6)}},
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpIPTables, kpNFTables}, services: []*corev1.Service{np, lb, svc("np6", nodePort, ipv6)}},
			},
			miss: []move{
				{target: v1alpha1.ModeNFTables, settings: primary, nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{np}},
				{target: v1alpha1.ModeIPVS, settings: &v1alpha1.ProxySettings{NodePortAddresses: []v1alpha1.NodePortAddress{"198.18.0.0/15"}},
					nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{np}},
				{target: v1alpha1.ModeNFTables, nodes: []*v1alpha1.ProxyNode{kpIPTables, kpIPVS, psNFTables}, services: []*corev1.Service{np}},
				{target: v1alpha1.ModeIPTables, nodes: []*v1alpha1.ProxyNode{kpNFTables}, services: []*corev1.Service{web}},
			}},
	}
	tested := map[string]bool{}
	for _, c := range cases {
		tested[c.code] = true
		t.Run(c.code, func(t *testing.T) {
			for i, m := range c.hit {
				f, ok := find(Compute(Input{Target: m.target, Settings: m.settings, Nodes: m.nodes, Services: m.services}), c.code)
				if !ok {
					t.Errorf("hit %d: no %s finding", i, c.code)
					continue
				}
				if !reflect.DeepEqual(f.Objects, c.objects) || f.Count != int32(len(c.objects)) {
					t.Errorf("hit %d: objects %v count %d, want %v", i, f.Objects, f.Count, c.objects)
				}
				if f.Message == "" || f.Action == "" || strings.Contains(f.Message, "%!") {
					t.Errorf("hit %d: message %q, action %q", i, f.Message, f.Action)
				}
			}
			for i, m := range c.miss {
				if f, ok := find(Compute(Input{Target: m.target, Settings: m.settings, Nodes: m.nodes, Services: m.services}), c.code); ok {
					t.Errorf("miss %d: unexpected finding %+v", i, f)
				}
			}
		})
	}
	for _, r := range rules {
		if !tested[r.code] {
			t.Errorf("rule %s has no test case", r.code)
		}
	}
}

func find(fs []v1alpha1.Finding, code string) (v1alpha1.Finding, bool) {
	i := slices.IndexFunc(fs, func(f v1alpha1.Finding) bool { return f.Code == code })
	if i < 0 {
		return v1alpha1.Finding{}, false
	}
	return fs[i], true
}

// TestComputeShape checks what every finding shares: most severe first,
// objects cut at ten with the exact count, the nodes and their proxies
// named in the message.
func TestComputeShape(t *testing.T) {
	var svcs []*corev1.Service
	for i := 24; i >= 0; i-- {
		svcs = append(svcs, svc(fmt.Sprintf("hc-%02d", i), localPolicy, affinity))
	}
	fs := Compute(Input{Target: v1alpha1.ModeIPVS, Nodes: []*v1alpha1.ProxyNode{kpIPTables, kpNFTables, idle}, Services: svcs})
	var codes []string
	for _, f := range fs {
		codes = append(codes, string(f.Severity)+" "+f.Code)
	}
	want := []string{
		"Warning LocalhostNodePortsNotServed", "Warning NodePortsOnEveryAddress", "Warning StrictARPDisabled",
		"Info ExternalLocalForNodeClients", "Info LeavingKubeProxy", "Info ServiceIPsBecomeLocal",
		"Info SessionAffinityPerAddress", "Info SessionAffinityReset",
	}
	if !reflect.DeepEqual(codes, want) {
		t.Fatalf("findings\n got %q\nwant %q", codes, want)
	}
	first := fs[0]
	if first.Count != 25 || len(first.Objects) != v1alpha1.MaxFindingObjects || first.Objects[0] != "default/hc-00" || first.Objects[9] != "default/hc-09" {
		t.Errorf("objects %v count %d, want the first ten of 25 by name", first.Objects, first.Count)
	}
	if !strings.Contains(first.Message, "proxyshift ipvs does not") || !strings.HasSuffix(first.Message, "(25 Services on 1 node now served by kube-proxy (iptables))") {
		t.Errorf("message %q does not name the target and the one kube-proxy iptables node", first.Message)
	}
	if want := "(25 Services on 2 nodes now served by kube-proxy (iptables), kube-proxy (nftables))"; !strings.HasSuffix(fs[2].Message, want) {
		t.Errorf("message %q does not end with %q", fs[2].Message, want)
	}
	for _, f := range fs {
		if len(f.Message) > 1024 || len(f.Action) > 1024 {
			t.Errorf("%s: message or action longer than the API allows", f.Code)
		}
	}
}

func TestUnacknowledged(t *testing.T) {
	fs := []v1alpha1.Finding{
		{Code: "A", Severity: v1alpha1.SeverityCritical},
		{Code: "B", Severity: v1alpha1.SeverityCritical},
		{Code: "C", Severity: v1alpha1.SeverityWarning},
		{Code: "D", Severity: v1alpha1.SeverityInfo},
	}
	var got []string
	for _, f := range Unacknowledged(fs, []string{"B", "C"}) {
		got = append(got, f.Code)
	}
	if !reflect.DeepEqual(got, []string{"A"}) {
		t.Errorf("unacknowledged %v, want [A]: only Critical findings not listed", got)
	}
	if u := Unacknowledged(fs, []string{"A", "B"}); len(u) != 0 {
		t.Errorf("all Critical codes acknowledged, still %v", u)
	}
}

// TestTrimKeepsWhatRulesRead checks that every rule sees the same on a
// trimmed Service as on the whole one, and that the rest is gone.
func TestTrimKeepsWhatRulesRead(t *testing.T) {
	full := svc("full", localPolicy, affinity, func(s *corev1.Service) {
		s.Labels = map[string]string{"app": "web", LabelServiceProxyName: ""}
		s.Annotations = map[string]string{corev1.AnnotationTopologyMode: "Auto", "kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 4096)}
		s.Spec.Selector = map[string]string{"app": "web"}
		s.Spec.ExternalIPs = []string{"198.18.0.1"}
		s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16"}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.0.2"}}
	})
	tr := Trim(full)
	for _, r := range rules {
		if r.service != nil && r.service(full) != r.service(tr) {
			t.Errorf("rule %s: %v on the whole Service, %v on the trimmed one", r.code, r.service(full), r.service(tr))
		}
	}
	if served(tr) {
		t.Error("Trim dropped the service-proxy-name label")
	}
	if tr.Spec.Selector != nil || len(tr.Status.LoadBalancer.Ingress) != 0 || len(tr.Annotations) != 0 || tr.Labels["app"] != "" || tr.Spec.Ports[0].Port != 0 {
		t.Errorf("Trim kept what no rule reads: %+v", tr)
	}
}
