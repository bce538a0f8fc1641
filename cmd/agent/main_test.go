package main

import (
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/agent"
)

// TestRunRefusesBadCIDRFlags checks that malformed CIDR flags stop the
// agent at once, naming the flag, before anything reaches a dataplane
// (an IPv4-mapped cluster CIDR used to panic the nftables backend).
func TestRunRefusesBadCIDRFlags(t *testing.T) {
	for _, tc := range []struct {
		name         string
		clusterCIDRs string
		nodePorts    []string
		want         []string
	}{
		{"mapped cluster CIDR", "::ffff:10.0.0.0/104", nil, []string{"--cluster-cidr", "IPv4-mapped", "write it as an IPv4 CIDR"}},
		{"prefix too long", "10.0.0.0/8,198.18.0.0/33", nil, []string{"--cluster-cidr", `"198.18.0.0/33" is not a CIDR`}},
		{"not an address", "pods", nil, []string{"--cluster-cidr", `"pods" is not a CIDR`}},
		{"mapped NodePort CIDR", "", []string{"::ffff:198.18.0.0/112"}, []string{"--nodeport-addresses", "IPv4-mapped"}},
		{"interface name", "", []string{"eth0"}, []string{"--nodeport-addresses", `"eth0" is not a CIDR`, `"primary" alone`}},
		{"primary with a CIDR", "", []string{"primary", "198.18.0.0/15"}, []string{"--nodeport-addresses", `"primary" is not a CIDR`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run("", false, agent.Options{NodeName: "node-a", MasqueradeBit: 14, NodePortAddresses: tc.nodePorts}, tc.clusterCIDRs)
			if err == nil {
				t.Fatal("run accepted the flags")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestRunRefusesBadKubeProxyHealthzAddress: kube-proxy's health address
// must be IP:port (or empty), as kube-proxy's healthzBindAddress is.
func TestRunRefusesBadKubeProxyHealthzAddress(t *testing.T) {
	for _, addr := range []string{":10256", "localhost:10256", "0.0.0.0"} {
		err := run("", false, agent.Options{NodeName: "node-a", MasqueradeBit: 14, KubeProxyHealthzAddr: addr}, "")
		if err == nil || !strings.Contains(err.Error(), "--kube-proxy-healthz-bind-address") {
			t.Errorf("%q: error %v, want one naming --kube-proxy-healthz-bind-address", addr, err)
		}
	}
}
