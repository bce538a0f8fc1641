package switchtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/agent"
	"github.com/proxyshift/proxyshift/nodeagent/healthcheck"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The LoadBalancer Service with externalTrafficPolicy Local these tests
// create, and the ports the agent serves in kube-proxy's place.
var (
	frontIP       = netip.MustParseAddr("198.19.0.20")
	frontNodePort = int32(30090)
	frontHCPort   = int32(32100)
	kubeProxyPort = uint16(10256)
)

// createFront creates default/front, type LoadBalancer with
// externalTrafficPolicy Local and health-check node port frontHCPort,
// with pods as its endpoints on this node.
func (w *world) createFront(pods ...*netlab.Pod) {
	w.t.Helper()
	w.createLocalLB("front", frontIP, frontNodePort, frontHCPort, pods...)
}

// setFrontSlice replaces front's EndpointSlice with s (made by slice).
func (w *world) setFrontSlice(s *discoveryv1.EndpointSlice) {
	w.t.Helper()
	if _, err := w.kube.DiscoveryV1().EndpointSlices("default").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// answer is one HTTP answer seen from the client namespace.
type answer struct {
	code   int
	header http.Header
	body   string
}

// get fetches http://NodeIP:port/path from the client namespace; a
// refused connection is errRefused.
func (w *world) get(port uint16, path string) (answer, error) {
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: w.lab.Client.NS.DialContext, DisableKeepAlives: true}}
	resp, err := hc.Get(fmt.Sprintf("http://%s%s", netip.AddrPortFrom(netlab.NodeIP, port), path))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return answer{}, errRefused
		}
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

var errRefused = errors.New("connection refused")

// waitAnswer polls port/path until ok accepts the answer.
func (w *world) waitAnswer(what string, port uint16, path string, ok func(answer) bool) answer {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := w.get(port, path)
		if err == nil && ok(a) {
			return a
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: port %d%s answered %d %q (error %v) for 30s", what, port, path, a.code, a.body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitRefused polls until port refuses connections from the client.
func (w *world) waitRefused(what string, port uint16) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := w.get(port, "/")
		if errors.Is(err, errRefused) {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: port %d still answers (%d %q, error %v)", what, port, a.code, a.body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// frontCheck waits until front's health check answers code with count
// local endpoints, and checks the answer's shape.
func (w *world) frontCheck(code, count int) {
	w.t.Helper()
	a := w.waitAnswer(fmt.Sprintf("front's health check %d with %d local endpoints", code, count), uint16(frontHCPort), "/", func(a answer) bool {
		var b healthcheck.ServiceBody
		return a.code == code && json.Unmarshal([]byte(a.body), &b) == nil && b.LocalEndpoints == count
	})
	var b healthcheck.ServiceBody
	_ = json.Unmarshal([]byte(a.body), &b)
	if b.Service.Namespace != "default" || b.Service.Name != "front" || !b.ServiceProxyHealthy {
		w.t.Errorf("body %s, want service default/front, serviceProxyHealthy true", a.body)
	}
	if got := a.header.Get("Content-Type"); got != "application/json" {
		w.t.Errorf("Content-Type %q, want application/json", got)
	}
	if got := a.header.Get("X-Load-Balancing-Endpoint-Weight"); got != fmt.Sprint(count) {
		w.t.Errorf("X-Load-Balancing-Endpoint-Weight %q, want %d", got, count)
	}
}

// proxyHealth waits until kube-proxy's port answers path with code and
// returns the body.
func (w *world) proxyHealth(path string, code int) healthcheck.ProxyBody {
	w.t.Helper()
	a := w.waitAnswer(fmt.Sprintf("%s %d", path, code), kubeProxyPort, path, func(a answer) bool { return a.code == code })
	var b healthcheck.ProxyBody
	if err := json.Unmarshal([]byte(a.body), &b); err != nil {
		w.t.Fatalf("%s answered %q: %v", path, a.body, err)
	}
	return b
}

// setTaint puts the cluster autoscaler's ToBeDeleted taint on the Node,
// or takes it off.
func (w *world) setTaint(on bool) {
	w.t.Helper()
	ctx := context.Background()
	n, err := w.kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	n.Spec.Taints = nil
	if on {
		n.Spec.Taints = []corev1.Taint{{Key: healthcheck.ToBeDeletedTaint, Value: "1700000000", Effect: corev1.TaintEffectNoSchedule}}
	}
	if _, err := w.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// TestHealthCheckNodePort runs the agent on a node nothing served before,
// in each mode this host can run, with a LoadBalancer Service whose
// externalTrafficPolicy is Local, and probes over real HTTP from the
// client namespace what a cloud load balancer and a kubelet would:
//   - the Service's health-check node port answers 200 with the count of
//     the node's ready endpoints, and follows the EndpointSlice: fewer
//     endpoints, only terminating ones (503: they do not count), none on
//     this node (503);
//   - kube-proxy's /healthz and /livez answer 200 on port 10256; tainted
//     ToBeDeletedByClusterAutoscaler, /healthz says 503 (nodeEligible
//     false) and /livez still 200; untainted, 200 again.
func TestHealthCheckNodePort(t *testing.T) {
	for _, mode := range []v1alpha1.ProxyMode{v1alpha1.ModeNFTables, v1alpha1.ModeIPTables} {
		t.Run(string(mode), func(t *testing.T) {
			w := newWorld(t, mode)
			w.createFront(w.pods...)
			w.startAgent()
			w.waitActive(mode)

			w.frontCheck(http.StatusOK, 2)
			w.setFrontSlice(slice("front", corev1.ProtocolTCP, w.pods[0]))
			w.frontCheck(http.StatusOK, 1)

			terminating := slice("front", corev1.ProtocolTCP, w.pods[0])
			no, yes := false, true
			terminating.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
			w.setFrontSlice(terminating)
			w.frontCheck(http.StatusServiceUnavailable, 0)

			elsewhere := slice("front", corev1.ProtocolTCP, w.pods...)
			other := "other-node"
			for i := range elsewhere.Endpoints {
				elsewhere.Endpoints[i].NodeName = &other
			}
			w.setFrontSlice(elsewhere)
			w.frontCheck(http.StatusServiceUnavailable, 0)
			w.setFrontSlice(slice("front", corev1.ProtocolTCP, w.pods...))
			w.frontCheck(http.StatusOK, 2)

			if b := w.proxyHealth("/healthz", http.StatusOK); b.NodeEligible == nil || !*b.NodeEligible || !b.Healthy {
				t.Errorf("/healthz body %+v, want healthy and nodeEligible", b)
			}
			if b := w.proxyHealth("/livez", http.StatusOK); b.NodeEligible != nil || !b.Healthy {
				t.Errorf("/livez body %+v, want healthy, without nodeEligible", b)
			}
			w.setTaint(true)
			if b := w.proxyHealth("/healthz", http.StatusServiceUnavailable); b.NodeEligible == nil || *b.NodeEligible {
				t.Errorf("/healthz body %+v on a node tainted %s, want nodeEligible false", b, healthcheck.ToBeDeletedTaint)
			}
			w.proxyHealth("/livez", http.StatusOK)
			w.frontCheck(http.StatusOK, 2) // the Service's check follows its endpoints only
			w.setTaint(false)
			w.proxyHealth("/healthz", http.StatusOK)
		})
	}
}

// TestHealthCheckPortsFollowTakeover checks that the agent binds the
// ports kube-proxy owns only while proxyshift serves the node: nothing
// answers on them while kube-proxy serves and while a takeover waits for
// its pod to leave; they answer once the takeover is done; and from the
// first phase of a hand-back they are free again, so that kube-proxy's
// pod (played by the test, which binds them) can take them while
// proxyshift still serves the traffic.
func TestHealthCheckPortsFollowTakeover(t *testing.T) {
	w := newWorld(t, "")
	w.installKubeProxy(false)
	w.createFront(w.pods...)
	metrics := w.serveKubeProxyMetrics()
	w.startAgent("--mode=nftables", "--kube-proxy-metrics-url="+metrics.url)
	w.waitStatus("kube-proxy reported serving", 30*time.Second, func(pn *v1alpha1.ProxyNode) bool {
		return pn.Status.Phase == v1alpha1.NodeIdle && pn.Status.ActiveMode == v1alpha1.ModeKubeProxy
	})
	time.Sleep(time.Second)
	w.waitRefused("kube-proxy serves", uint16(frontHCPort))
	w.waitRefused("kube-proxy serves", kubeProxyPort)

	w.desire(v1alpha1.ModeNFTables)
	w.waitPhase(v1alpha1.NodeWaitingForKubeProxy)
	w.requireTraffic()
	w.waitRefused("waiting for kube-proxy's pod to leave", uint16(frontHCPort))
	w.waitRefused("waiting for kube-proxy's pod to leave", kubeProxyPort)

	w.setKubeProxyStopped(true)
	w.waitActive(v1alpha1.ModeNFTables)
	w.frontCheck(http.StatusOK, 2)
	w.proxyHealth("/healthz", http.StatusOK)

	w.setKubeProxyStopped(false)
	w.desire(v1alpha1.ModeKubeProxy)
	w.waitPhase(v1alpha1.NodeWaitingForKubeProxy)
	// kube-proxy's pod comes back: it binds its ports on every address.
	for _, port := range []uint16{uint16(frontHCPort), kubeProxyPort} {
		w.listenAsKubeProxy(port)
		a := w.waitAnswer(fmt.Sprintf("kube-proxy on port %d", port), port, "/", func(a answer) bool { return a.code == http.StatusTeapot })
		if !strings.Contains(a.body, "kube-proxy") {
			t.Errorf("port %d answered %q, want kube-proxy's answer", port, a.body)
		}
	}
	// proxyshift still serves the traffic meanwhile (the rest of the
	// hand-back is TestTakeoverAndHandBack's).
	w.requireTraffic()
}

// listenAsKubeProxy binds port on every address of the node namespace, as
// kube-proxy does, and answers 418 "kube-proxy" there until the test
// ends; it fails the test if the port is taken.
func (w *world) listenAsKubeProxy(port uint16) {
	w.t.Helper()
	l, err := w.lab.Node.NS.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		w.t.Fatalf("kube-proxy cannot bind port %d once the hand-back began: %v", port, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.WriteHeader(http.StatusTeapot)
		_, _ = rw.Write([]byte("kube-proxy"))
	})}
	go func() { _ = srv.Serve(l) }()
	w.t.Cleanup(func() { _ = srv.Close() })
}

// TestHealthCheckPortTaken: a Service whose health-check node port
// another program on the node holds gets a Warning Event saying so
// (kube-proxy's reason, FailedToStartServiceHealthcheck) while the other
// Services' checks answer; once the port is free the agent binds it
// within its retry interval, without any change to the Service.
func TestHealthCheckPortTaken(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeNFTables)
	taken, err := w.lab.Node.NS.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", frontHCPort))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	w.createFront(w.pods...)
	other := int32(32101)
	w.createLocalLB("back", netip.MustParseAddr("198.19.0.21"), 30091, other, w.pods[0])
	w.startAgent()
	w.waitActive(v1alpha1.ModeNFTables)
	w.waitAnswer("back's health check", uint16(other), "/", func(a answer) bool { return a.code == http.StatusOK })

	front, err := w.kube.CoreV1().Services("default").Get(context.Background(), "front", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := w.kube.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(evs.Items, func(e eventsv1.Event) bool {
			return e.Regarding.UID == front.UID && e.Reason == agent.ReasonHealthCheckNotServed
		})
		if i >= 0 {
			e := evs.Items[i]
			if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, "node "+nodeName) || !strings.Contains(e.Note, fmt.Sprint(frontHCPort)) {
				t.Errorf("Event %s %s: %q", e.Type, e.Reason, e.Note)
			}
			t.Logf("Event on default/front: %s", e.Note)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event on default/front within 30s", agent.ReasonHealthCheckNotServed)
		}
		time.Sleep(200 * time.Millisecond)
	}

	_ = taken.Close()
	w.frontCheck(http.StatusOK, 2)
}

// createLocalLB creates a LoadBalancer Service with
// externalTrafficPolicy Local and the given health-check node port, with
// pods as its endpoints on this node.
func (w *world) createLocalLB(name string, ip netip.Addr, nodePort, hcPort int32, pods ...*netlab.Pod) {
	w.t.Helper()
	ctx := context.Background()
	if _, err := w.kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: ip.String(),
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: hcPort,
			Ports: []corev1.ServicePort{{Name: "p", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: nodePort, TargetPort: intstr.FromInt32(netlab.ServerPort)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.kube.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(name, corev1.ProtocolTCP, pods...), metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}
