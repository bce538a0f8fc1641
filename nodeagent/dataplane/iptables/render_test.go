package iptables

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
)

// The nodes tests render for (the golden scenarios').
var (
	node        = dt.Node
	nodeWithIPs = dt.NodeWithIPs
)

// policyFor returns the node policy of cfg for the family fam.
func policyFor(cfg dataplane.NodeConfig, fam corev1.IPFamily) *dataplane.NodePolicy {
	np := dataplane.NewNodePolicy(cfg, fam)
	return &np
}

// The golden scenarios are every backend's, so that they can be compared
// side by side.
func TestRenderGolden(t *testing.T) {
	for _, sc := range dt.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			np := policyFor(sc.Config, sc.Family)
			got := fullRestore(render(np, dt.PortsOf(sc.Ports...)), nil).text(t)
			if again := fullRestore(render(np, dt.PortsOf(sc.Ports...)), nil).text(t); again != got {
				t.Fatal("rendering is not deterministic")
			}
			for _, l := range strings.Split(got, "\n") {
				if strings.HasPrefix(l, ":") && len(strings.Fields(l)[0])-1 > maxChainLen {
					t.Errorf("chain name longer than %d characters: %s", maxChainLen, l)
				}
			}
			dt.Golden(t, sc.Name, got)
		})
	}
}
