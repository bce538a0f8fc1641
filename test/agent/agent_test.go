// Package agent_test runs the agent's real informer-to-kernel path: a
// Service and EndpointSlice written to a real API server reach nftables in a
// lab node's namespace and carry traffic from a client namespace.
package agent_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/agent"
	"github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/testenv"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServiceThroughAPIServerReachesKernelAndCarriesTraffic(t *testing.T) {
	netlab.RequireRoot(t)
	env := testenv.Start(t)
	lab := netlab.NewLab(t)
	pods := []*netlab.Pod{lab.Node.AddPod(t, "web-a"), lab.Node.AddPod(t, "web-b")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(env.Config)

	const nodeName = "lab-node"
	svc := createWeb(t, kube, nodeName, pods)

	// The agent starts with the Service in place, so that its first
	// switch verifies through it (the API server's own "kubernetes"
	// Service is not reachable from the lab node).
	metrics, healthz := freeAddr(t), freeAddr(t)
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, kube, agent.Options{
			NodeName: nodeName,
			Mode:     v1alpha1.ModeNFTables,
			Backends: map[v1alpha1.ProxyMode]backends.Factory{
				v1alpha1.ModeNFTables: backends.Factories(backends.Env{NS: lab.Node.NS.NS()})[v1alpha1.ModeNFTables],
			},
			ClusterCIDRs:  []netip.Prefix{lab.Node.PodCIDR},
			MasqueradeBit: 14,
			MinSyncPeriod: 100 * time.Millisecond,
			SyncPeriod:    time.Minute,
			MetricsAddr:   metrics,
			HealthzAddr:   healthz,
			NetNS:         lab.Node.NS.NS(),
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})

	clusterIP := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	nodePort := netip.AddrPortFrom(netlab.NodeIP, uint16(svc.Spec.Ports[0].NodePort))
	for _, target := range []netip.AddrPort{clusterIP, nodePort} {
		everyPodAnswers(t, lab, target, pods)
	}

	// An endpoint removed through the API stops getting traffic.
	if err := kube.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := lab.Client.NS.Request(netlab.TCP, clusterIP, time.Second)
		if netlab.KindOf(err) == netlab.Refused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("service without endpoints not refused after the slice was deleted: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A slice that the endpoint controller would have stamped with its
	// trigger time is measured from it, as kube-proxy measures it.
	again := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-2", Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{pods[0].IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: boolPtr(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: strPtr("http"), Protocol: protoPtr(corev1.ProtocolTCP), Port: int32Ptr(netlab.ServerPort)}},
	}
	if _, err := kube.DiscoveryV1().EndpointSlices("default").Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if code, body := get("http://" + healthz + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %s", code, body)
	}
	// The switch to nftables ends Active, and web-2 is programmed, which
	// the metrics show.
	const active = `proxyshift_node_phase{mode="nftables",phase="Active"} 1`
	programmed := regexp.MustCompile(`kubeproxy_network_programming_duration_seconds_count\{ip_family="IPv4"\} [1-9]`)
	var code int
	var body string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code, body = get("http://" + metrics + "/metrics"); code == http.StatusOK && strings.Contains(body, active) && programmed.MatchString(body) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics: %d, without %s or %s:\n%s", code, active, programmed, body)
		}
	}
	if strings.Count(body, "proxyshift_node_phase{") != 1 {
		t.Errorf("/metrics shows more than one phase:\n%s", body)
	}
	for _, m := range []string{"proxyshift_sync_proxy_rules_duration_seconds_bucket", "proxyshift_network_programming_duration_seconds_count", "proxyshift_sync_proxy_rules_last_timestamp_seconds", "proxyshift_programmed_services",
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"}`, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"}`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`, "kubeproxy_sync_proxy_rules_endpoint_changes_total ", "kubeproxy_sync_proxy_rules_service_changes_total "} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}

// createWeb creates Node nodeName and a NodePort Service "web" (port 80)
// whose EndpointSlice lists pods, ready, on that node.
func createWeb(t *testing.T, kube kubernetes.Interface, nodeName string, pods []*netlab.Pod) *corev1.Service {
	t.Helper()
	ctx := context.Background()
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(netlab.ServerPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var endpoints []discoveryv1.Endpoint
	for _, p := range pods {
		endpoints = append(endpoints, discoveryv1.Endpoint{Addresses: []string{p.IP.String()}, NodeName: strPtr(nodeName), Conditions: discoveryv1.EndpointConditions{Ready: boolPtr(true)}})
	}
	if _, err := kube.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
		Ports:       []discoveryv1.EndpointPort{{Name: strPtr("http"), Protocol: protoPtr(corev1.ProtocolTCP), Port: int32Ptr(netlab.ServerPort)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return svc
}

// everyPodAnswers waits up to 30 seconds until every pod answers at
// target, from the lab's client, through the agent's rules.
func everyPodAnswers(t *testing.T, lab *netlab.Lab, target netip.AddrPort, pods []*netlab.Pod) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tally := lab.Client.NS.Spread(netlab.TCP, target, 40, time.Second)
		if len(tally.Answers) == len(pods) && tally.Answered() == 40 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not every pod answered through the agent's rules: %v", target, tally)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func boolPtr(b bool) *bool                        { return &b }
func strPtr(s string) *string                     { return &s }
func int32Ptr(i int32) *int32                     { return &i }
func protoPtr(p corev1.Protocol) *corev1.Protocol { return &p }
