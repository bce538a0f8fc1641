package nftables

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
)

// testConfig is the node most tests render for.
var testConfig = dt.Node

// familyOf is the table family of a model family.
func familyOf(f corev1.IPFamily) *family {
	if f == corev1.IPv6Protocol {
		return ipv6
	}
	return ipv4
}

func TestRenderGolden(t *testing.T) {
	for _, sc := range dt.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			f := familyOf(sc.Family)
			rs, _ := render(f, dt.PortsOf(sc.Ports...), newNodePolicy(f, sc.Config))
			again, _ := render(f, dt.PortsOf(sc.Ports...), newNodePolicy(f, sc.Config))
			got := rs.String()
			if again.String() != got {
				t.Fatal("rendering is not deterministic")
			}
			dt.Golden(t, sc.Name, got)
		})
	}
}
