package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/syncloop"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// serverWorld is a Server in a fresh network namespace, with settable
// proxy health and Node.
type serverWorld struct {
	t  *testing.T
	ns *netlab.NetNS
	s  *Server

	mu        sync.Mutex
	healthErr error
	node      *corev1.Node
}

func newServerWorld(t *testing.T) *serverWorld {
	w := &serverWorld{t: t, ns: netlab.NewNetNS(t, "hc"), node: &corev1.Node{}}
	w.s = &Server{
		NS: w.ns.NS(), ProxyAddr: "127.0.0.1:10256",
		Health: func() error { w.mu.Lock(); defer w.mu.Unlock(); return w.healthErr },
		Node:   func() *corev1.Node { w.mu.Lock(); defer w.mu.Unlock(); return w.node },
	}
	t.Cleanup(func() { w.s.SetServing(false) })
	return w
}

// get fetches http://127.0.0.1:port/path inside the namespace; a refused
// connection returns code 0.
func (w *serverWorld) get(port int, path string) (int, http.Header, string) {
	w.t.Helper()
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: w.ns.DialContext, DisableKeepAlives: true}}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if errors.Is(err, syscall.ECONNREFUSED) {
		return 0, nil, ""
	}
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		w.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// service checks a Service's answer: its code and body.
func (w *serverWorld) service(port, code, count int, healthy bool) {
	w.t.Helper()
	got, h, body := w.get(port, "/")
	var b ServiceBody
	if got != code || json.Unmarshal([]byte(body), &b) != nil || b.LocalEndpoints != count || b.ServiceProxyHealthy != healthy {
		w.t.Errorf("port %d answered %d %q, want %d with localEndpoints %d, serviceProxyHealthy %v", port, got, body, code, count, healthy)
	}
	if got != 0 && (h.Get("Content-Type") != "application/json" || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Load-Balancing-Endpoint-Weight") != fmt.Sprint(count)) {
		w.t.Errorf("port %d headers %v", port, h)
	}
}

// proxy checks /healthz or /livez.
func (w *serverWorld) proxy(path string, code int, eligible *bool) {
	w.t.Helper()
	got, _, body := w.get(10256, path)
	var b ProxyBody
	if got != code || json.Unmarshal([]byte(body), &b) != nil {
		w.t.Fatalf("%s answered %d %q, want %d", path, got, body, code)
	}
	if (b.NodeEligible == nil) != (eligible == nil) || (eligible != nil && *b.NodeEligible != *eligible) {
		w.t.Errorf("%s nodeEligible %v, want %v (body %s)", path, b.NodeEligible, eligible, body)
	}
}

func check(name string, port int32, count int) Check {
	return Check{CheckKey: CheckKey{Service: model.ServiceName{Namespace: "shop", Name: name}, Family: corev1.IPv4Protocol}, Port: port, LocalEndpoints: count}
}

// TestServer drives a Server in a network namespace and probes it over
// real HTTP: nothing is bound until it serves; checks answer their
// counts, keep their listeners when only counts change, survive a port
// another program holds (retried once free); the proxy's health and the
// node's eligibility change the answers as kube-proxy's do; and when it
// stops serving every port is free at once.
func TestServer(t *testing.T) {
	w := newServerWorld(t)
	yes, no := true, false

	w.s.Update([]Check{check("front", 32000, 2), check("empty", 32001, 0)}, nil)
	if code, _, _ := w.get(32000, "/"); code != 0 {
		t.Fatalf("port 32000 answered %d before the Server serves", code)
	}
	if code, _, _ := w.get(10256, "/healthz"); code != 0 {
		t.Fatalf("10256 answered %d before the Server serves", code)
	}

	w.s.SetServing(true)
	w.service(32000, http.StatusOK, 2, true)
	w.service(32001, http.StatusServiceUnavailable, 0, true)
	w.proxy("/healthz", http.StatusOK, &yes)
	w.proxy("/livez", http.StatusOK, nil)

	// Only a count changes: same listener, new answer.
	before := w.s.open[check("front", 0, 0).CheckKey]
	w.s.Update([]Check{check("front", 32000, 1), check("empty", 32001, 0)}, nil)
	if w.s.open[check("front", 0, 0).CheckKey] != before {
		t.Error("a count change reopened the listener")
	}
	w.service(32000, http.StatusOK, 1, true)

	// A port another program holds: the others keep answering, it is
	// retried and bound once free.
	blocker, err := w.ns.Listen("tcp4", "0.0.0.0:32002")
	if err != nil {
		t.Fatal(err)
	}
	var told []string
	w.s.OnBindFailure = func(c Check, err error) { told = append(told, fmt.Sprintf("%s %d", c.Service, c.Port)) }
	w.s.Update([]Check{check("front", 32000, 1), check("empty", 32001, 0), check("late", 32002, 3)}, nil)
	w.s.Update([]Check{check("front", 32000, 1), check("empty", 32001, 0), check("late", 32002, 3)}, nil)
	w.service(32000, http.StatusOK, 1, true)
	if len(told) != 1 || told[0] != "shop/late 32002" {
		t.Errorf("OnBindFailure heard %q, want shop/late 32002 once", told)
	}
	if w.s.open[check("late", 0, 0).CheckKey] != nil || !w.s.failed {
		t.Error("a check whose port is taken counts as open")
	}
	_ = blocker.Close()
	w.s.Update([]Check{check("front", 32000, 1), check("late", 32002, 3)}, nil)
	w.service(32002, http.StatusOK, 3, true)
	if code, _, _ := w.get(32001, "/"); code != 0 {
		t.Errorf("the removed check still answers (%d)", code)
	}

	// Restricted to addresses: reopened on them.
	w.s.Update([]Check{check("front", 32000, 1)}, []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	w.service(32000, http.StatusOK, 1, true)
	if b := w.s.open[check("front", 0, 0).CheckKey]; b == before || len(b.addrs) != 1 || b.addrs[0].Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("listener after restricting the addresses: %+v", b)
	}

	// The proxy stalls: every check fails, /livez and /healthz too.
	w.mu.Lock()
	w.healthErr = &syncloop.StalledError{Since: time.Now().Add(-time.Hour), LastSuccess: time.Now().Add(-2 * time.Hour)}
	w.mu.Unlock()
	w.service(32000, http.StatusServiceUnavailable, 1, false)
	w.proxy("/livez", http.StatusServiceUnavailable, nil)
	w.proxy("/healthz", http.StatusServiceUnavailable, &yes)
	w.mu.Lock()
	w.healthErr = nil
	w.node = &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}}}
	w.mu.Unlock()
	w.proxy("/healthz", http.StatusServiceUnavailable, &no)
	w.proxy("/livez", http.StatusOK, nil)
	w.service(32000, http.StatusOK, 1, true)

	// Handing back: everything is free before SetServing returns.
	w.s.SetServing(false)
	for _, addr := range []string{"0.0.0.0:32000", "0.0.0.0:32002", "0.0.0.0:10256"} {
		l, err := w.ns.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s is still taken after SetServing(false): %v", addr, err)
			continue
		}
		_ = l.Close()
	}
}

// TestServerRetries: Run binds a port once the program holding it lets
// go, without another Update.
func TestServerRetries(t *testing.T) {
	w := newServerWorld(t)
	blocker, err := w.ns.Listen("tcp", "127.0.0.1:10256")
	if err != nil {
		t.Fatal(err)
	}
	w.s.SetServing(true)
	ctx := t.Context()
	go w.s.Run(ctx)
	_ = blocker.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _, _ := w.get(10256, "/livez"); code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("10256 not served 30s after it was freed")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestServerDualStack: a dual-stack Service's two checks share its port,
// each family's socket answering with that family's count.
func TestServerDualStack(t *testing.T) {
	w := newServerWorld(t)
	v4, v6 := check("front", 32000, 2), check("front", 32000, 1)
	v6.Family = corev1.IPv6Protocol
	w.s.Update([]Check{v4, v6}, nil)
	w.s.SetServing(true)
	if w.s.failed {
		t.Fatal("binding both families of one port failed")
	}
	w.service(32000, http.StatusOK, 2, true)
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: w.ns.DialContext, DisableKeepAlives: true}}
	resp, err := hc.Get("http://[::1]:32000/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b ServiceBody
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil || resp.StatusCode != http.StatusOK || b.LocalEndpoints != 1 {
		t.Errorf("over IPv6: %d %+v %v, want 200 with the IPv6 count 1", resp.StatusCode, b, err)
	}
}
