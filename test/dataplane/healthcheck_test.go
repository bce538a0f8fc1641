package dataplane_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/healthcheck"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The Service of the health-check test: LoadBalancer, externalTrafficPolicy
// Local, with a health-check node port.
var (
	checkedIP     = netip.MustParseAddr("198.19.0.22")
	checkedLBIP   = netip.MustParseAddr("198.19.2.22")
	checkedNode   = int32(30088)
	checkedHCPort = int32(32100)
)

// TestHealthCheckNodePortThroughRules checks, for every backend, that a
// load balancer's probe of a health-check node port on the node's address
// reaches the agent's listener through the rules the backend programmed
// for the Service (the port is no NodePort: no rule may take or reject
// it), and answers what the model says: 200 with two local endpoints,
// and, after a sync that left the Service only a remote endpoint, 503
// with none, while the Service's own NodePort keeps its Local policy.
func TestHealthCheckNodePortThroughRules(t *testing.T) {
	netlab.RequireRoot(t)
	for _, row := range backends {
		t.Run(row.name, func(t *testing.T) {
			skipHostRowInVM(t, row)
			lab := netlab.NewLab(t)
			node := lab.Node
			row.skip(t, node.NS)
			p := pods{a: node.AddPod(t, "pod-a"), b: node.AddPod(t, "pod-b"), d: node.AddPod(t, "pod-d")}
			ctx := t.Context()
			b := row.new(t, node.NS, nodeConfig)
			srv := &healthcheck.Server{NS: node.NS.NS()}
			t.Cleanup(func() { srv.SetServing(false) })
			srv.SetServing(true)
			program := func(eps ...*netlab.Pod) {
				t.Helper()
				sp := &model.ServicePort{
					Name:   model.ServicePortName{Namespace: "suite", Name: "checked", Port: "p", Protocol: corev1.ProtocolTCP},
					Family: corev1.IPv4Protocol, ClusterIP: checkedIP, Protocol: corev1.ProtocolTCP, Port: 80,
					NodePort: checkedNode, LoadBalancerIPs: []netip.Addr{checkedLBIP},
					ExternalPolicyLocal: true, HealthCheckNodePort: checkedHCPort,
				}
				for _, pod := range eps {
					sp.Endpoints = append(sp.Endpoints, endpoint(ipv4, pod, pod != p.d))
				}
				snap := snapshot(map[model.ServicePortName]*model.ServicePort{sp.Name: sp})
				if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: snap, Full: true}); err != nil {
					t.Fatalf("sync: %v\n%s", err, row.dump(node.NS))
				}
				srv.Update(healthcheck.Checks(snap), nodeConfig.NodeIPs)
			}
			probe := func(code, count int) {
				t.Helper()
				got, body, err := getFrom(lab.Client.NS, netip.AddrPortFrom(netlab.NodeIP, uint16(checkedHCPort)))
				var answer healthcheck.ServiceBody
				if err != nil || got != code || json.Unmarshal([]byte(body), &answer) != nil || answer.LocalEndpoints != count ||
					answer.Service.Namespace != "suite" || answer.Service.Name != "checked" {
					t.Fatalf("health check: %d %q %v, want %d with localEndpoints %d\n%s", got, body, err, code, count, row.dump(node.NS))
				}
			}

			program(p.a, p.b, p.d)
			probe(http.StatusOK, 2)
			expectSpread(t, lab.Client.NS, netlab.TCP, netip.AddrPortFrom(netlab.NodeIP, uint16(checkedNode)), []string{"pod-a", "pod-b"})

			program(p.d)
			probe(http.StatusServiceUnavailable, 0)
		})
	}
}

// getFrom makes one HTTP GET to addr from ns, without keep-alive.
func getFrom(ns *netlab.NetNS, addr netip.AddrPort) (int, string, error) {
	hc := &http.Client{Timeout: okTimeout, Transport: &http.Transport{DialContext: ns.DialContext, DisableKeepAlives: true}}
	resp, err := hc.Get(fmt.Sprintf("http://%s/", addr))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return 0, "", fmt.Errorf("refused: %w", err)
		}
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
