package iptables

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
)

// TestLocalhostNodePortsRendering checks which NodePort dispatch and
// martian-packet rule each node renders with localhost NodePorts on:
// IPv4 NodePorts on every local address include loopback, with the drop
// of new non-DNATed connections to 127.0.0.0/8 from elsewhere; a
// loopback address in nodePortAddresses is served; IPv6 and nodes whose
// NodePort addresses hold no loopback address render as without it.
func TestLocalhostNodePortsRendering(t *testing.T) {
	martian := `-A PROXYSHIFT-FILTER -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate DNAT -m comment --comment "proxyshift block incoming localnet connections" -j DROP`
	withLoopback := dt.NodeWithIPs
	withLoopback.NodeIPs = append(dt.Addrs("127.0.0.1"), withLoopback.NodeIPs...)
	for _, tc := range []struct {
		name    string
		ipv6    bool
		cfgIPs  bool
		loop    bool
		want    []string
		notWant []string
	}{
		{name: "any local address", want: []string{
			`-A PROXYSHIFT-SERVICES -m addrtype --dst-type LOCAL -m comment --comment "proxyshift node ports" -j PROXYSHIFT-NODEPORTS`,
			martian}, notWant: []string{"! -d 127.0.0.0/8"}},
		{name: "node IPs without loopback", cfgIPs: true, notWant: []string{"127.0.0.", "route_localnet"}},
		{name: "node IPs with loopback", cfgIPs: true, loop: true, want: []string{
			`-A PROXYSHIFT-SERVICES -d 127.0.0.1/32 -m comment --comment "proxyshift node ports" -j PROXYSHIFT-NODEPORTS`,
			`-A PROXYSHIFT-SERVICES -d 192.168.1.10/32 -m comment --comment "proxyshift node ports" -j PROXYSHIFT-NODEPORTS`,
			martian}},
		{name: "ipv6", ipv6: true, want: []string{`-A PROXYSHIFT-SERVICES ! -d ::1/128 -m addrtype --dst-type LOCAL -m comment --comment "proxyshift node ports" -j PROXYSHIFT-NODEPORTS`}, notWant: []string{"localnet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, fam := dt.Node, corev1.IPv4Protocol
			if tc.cfgIPs {
				cfg = dt.NodeWithIPs
			}
			if tc.loop {
				cfg = withLoopback
			}
			if tc.ipv6 {
				fam = corev1.IPv6Protocol
			}
			np := policyFor(cfg, fam)
			served := np.ServeLoopbackNodePorts(cfg)
			if served != (len(tc.want) > 0 && !tc.ipv6) {
				t.Errorf("ServeLoopbackNodePorts = %v", served)
			}
			got := fullRestore(render(np, dt.PortsOf(dt.Scenarios()[0].Ports...)), nil).text(t)
			for _, w := range tc.want {
				if !strings.Contains(got, w+"\n") {
					t.Errorf("rendered rules lack\n%s\n%s", w, got)
				}
			}
			for _, nw := range tc.notWant {
				if strings.Contains(got, nw) {
					t.Errorf("rendered rules hold %q:\n%s", nw, got)
				}
			}
		})
	}
}
