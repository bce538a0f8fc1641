package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/nodeagent/syncloop"
)

// retryEvery is how often a port that could not be bound is tried again.
const retryEvery = 5 * time.Second

// Server binds and answers the health checks while proxyshift serves the
// node. Update hands it the checks of each successful sync, SetServing
// whether the ports are proxyshift's to bind; each call opens the
// listeners that are missing, closes those no longer wanted and keeps the
// rest, so a load balancer's probes are never refused by a resync. A port
// that cannot be bound (another program holds it) is logged and tried
// again on the next call, and every retryEvery while Run runs; the
// checks that are bound keep answering meanwhile.
type Server struct {
	// NS is the node's network namespace, where the listeners are opened.
	NS nsexec.NS
	// ProxyAddr is where /healthz and /livez are served (kube-proxy's
	// healthzBindAddress, 0.0.0.0:10256); empty serves them nowhere.
	ProxyAddr string
	// Health is the service proxy's health: nil while it keeps up with
	// changes, else why not (syncloop.StalledError carries the last
	// successful sync). Nil Health is always healthy.
	Health func() error
	// Node is the agent's Node (nil when unknown), for /healthz's
	// eligibility.
	Node func() *corev1.Node
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// OnBindFailure, if set, hears once of each Service check whose port
	// cannot be bound (again after it was bound, or its port changed):
	// the agent records it as an Event on the Service, as kube-proxy does.
	OnBindFailure func(c Check, err error)

	mu      sync.Mutex
	serving bool
	nodeIPs []netip.Addr
	checks  map[CheckKey]Check
	open    map[CheckKey]*bound
	proxy   *bound
	failed  bool
	// told holds the port of each check OnBindFailure heard of.
	told map[CheckKey]int32
}

// bound is the listeners of one health check (or of /healthz): its port
// and addresses, and one HTTP server per address.
type bound struct {
	port    int32
	addrs   []netip.AddrPort
	servers []*http.Server
}

func (b *bound) close() {
	for _, s := range b.servers {
		_ = s.Close()
	}
}

// Update takes the checks of the last successful sync and the NodePort
// addresses it ran with (nil: every address) and reconciles the
// listeners.
func (s *Server) Update(checks []Check, nodeIPs []netip.Addr) {
	m := make(map[CheckKey]Check, len(checks))
	for _, c := range checks {
		m[c.CheckKey] = c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks, s.nodeIPs = m, slices.Clone(nodeIPs)
	s.reconcile()
}

// SetServing says whether proxyshift serves the node (see Serving). Going
// false closes every listener before it returns, so kube-proxy can bind
// the ports as soon as its pod starts.
func (s *Server) SetServing(serving bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if serving != s.serving {
		klog.InfoS("Health-check ports follow who serves the node", "proxyshiftServes", serving, "kubeProxyHealthz", s.ProxyAddr)
	}
	s.serving = serving
	s.reconcile()
}

// Run retries ports that could not be bound until ctx ends, then closes
// every listener.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(retryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.serving = false
			s.reconcile()
			s.mu.Unlock()
			return
		case <-t.C:
			s.mu.Lock()
			if s.failed {
				s.reconcile()
			}
			s.mu.Unlock()
		}
	}
}

// reconcile opens and closes listeners to match the wanted state; s.mu
// is held.
func (s *Server) reconcile() {
	s.failed = false
	if s.open == nil {
		s.open = map[CheckKey]*bound{}
	}
	for k, b := range s.open {
		c, ok := s.checks[k]
		if s.serving && ok && c.Port == b.port && slices.Equal(b.addrs, ListenAddrs(k.Family, s.nodeIPs, c.Port)) {
			continue
		}
		klog.V(2).InfoS("Closing health check", "service", k.Service, "family", k.Family, "port", b.port)
		b.close()
		delete(s.open, k)
	}
	if s.serving {
		for k, c := range s.checks {
			if s.open[k] != nil {
				continue
			}
			addrs := ListenAddrs(k.Family, s.nodeIPs, c.Port)
			b, err := s.listen(network(k.Family), c.Port, addrs, s.serviceHandler(k))
			if err != nil {
				s.failed = true
				klog.ErrorS(err, "Cannot open the Service's health-check node port; retrying", "service", k.Service, "family", k.Family, "port", c.Port)
				s.tell(c, err)
				continue
			}
			delete(s.told, k)
			klog.V(2).InfoS("Opened health check", "service", k.Service, "family", k.Family, "addresses", addrs)
			s.open[k] = b
		}
	}
	switch {
	case !s.serving && s.proxy != nil:
		s.proxy.close()
		s.proxy = nil
	case s.serving && s.proxy == nil && s.ProxyAddr != "":
		ap, err := netip.ParseAddrPort(s.ProxyAddr)
		if err == nil {
			s.proxy, err = s.listen("tcp", int32(ap.Port()), []netip.AddrPort{ap}, s.proxyHandler())
		}
		if err != nil {
			s.failed = true
			klog.ErrorS(err, "Cannot serve kube-proxy's /healthz and /livez; retrying", "address", s.ProxyAddr)
		}
	}
}

// tell passes a bind failure to OnBindFailure once per check and port.
func (s *Server) tell(c Check, err error) {
	if s.OnBindFailure == nil || s.told[c.CheckKey] == c.Port {
		return
	}
	if s.told == nil {
		s.told = map[CheckKey]int32{}
	}
	s.told[c.CheckKey] = c.Port
	s.OnBindFailure(c, err)
}

// network is the socket network of a family's checks: a wildcard
// address then takes only that family's connections, so both families
// of a dual-stack Service bind the same port.
func network(f corev1.IPFamily) string {
	if f == corev1.IPv6Protocol {
		return "tcp6"
	}
	return "tcp4"
}

// listen opens every address in the node's namespace and serves h on
// them; it opens all or none.
func (s *Server) listen(network string, port int32, addrs []netip.AddrPort, h http.Handler) (*bound, error) {
	b := &bound{port: port, addrs: addrs}
	for _, a := range addrs {
		var l net.Listener
		err := s.NS.Do(func() error {
			var err error
			l, err = net.Listen(network, a.String())
			return err
		})
		if err != nil {
			b.close()
			return nil, err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "Health-check listener stopped", "address", a)
			}
		}()
		b.servers = append(b.servers, srv)
	}
	return b, nil
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// health is the proxy's health and its last successful sync (now when
// healthy, as kube-proxy reports it).
func (s *Server) health() (bool, time.Time) {
	now := s.now()
	if s.Health == nil {
		return true, now
	}
	err := s.Health()
	if err == nil {
		return true, now
	}
	var stalled *syncloop.StalledError
	if errors.As(err, &stalled) {
		return false, stalled.LastSuccess
	}
	return false, time.Time{}
}

// ServiceBody is what a Service's health check answers, in kube-proxy's
// shape.
type ServiceBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// serviceHandler answers one Service's check: 200 when the node has
// local ready endpoints and the proxy is healthy, else 503; the body
// names the Service and the count, and X-Load-Balancing-Endpoint-Weight
// carries the count for load balancers that weigh nodes by it.
func (s *Server) serviceHandler(k CheckKey) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		count := s.checks[k].LocalEndpoints
		s.mu.Unlock()
		healthy, _ := s.health()
		var body ServiceBody
		body.Service.Namespace, body.Service.Name = k.Service.Namespace, k.Service.Name
		body.LocalEndpoints, body.ServiceProxyHealthy = count, healthy
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		code := http.StatusOK
		if count == 0 || !healthy {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, body, "\t")
	})
}

// ProxyBody is what /healthz and /livez answer, in kube-proxy's shape
// (without its per-family status: one sync loop serves both families).
type ProxyBody struct {
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is only in /healthz's answer.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	Healthy      bool  `json:"healthy"`
}

// proxyHandler serves /healthz (the proxy healthy and the node eligible)
// and /livez (the proxy healthy, whatever the node's state).
func (s *Server) proxyHandler() http.Handler {
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, withNode bool) {
		healthy, last := s.health()
		body := ProxyBody{LastUpdated: last, CurrentTime: s.now(), Healthy: healthy}
		if withNode {
			var node *corev1.Node
			if s.Node != nil {
				node = s.Node()
			}
			eligible := NodeEligible(node)
			body.NodeEligible = &eligible
			healthy = healthy && eligible
		}
		code := http.StatusOK
		if !healthy {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, body, "")
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { answer(w, true) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { answer(w, false) })
	return mux
}

// writeJSON answers v as JSON, indented with indent if not empty (a
// Service's check answers in kube-proxy's tab-indented layout).
func writeJSON(w http.ResponseWriter, code int, v any, indent string) {
	b, _ := json.Marshal(v)
	if indent != "" {
		b, _ = json.MarshalIndent(v, "", indent)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
