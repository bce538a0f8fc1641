package backends

import (
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestIPTablesLocalhostNodePorts checks that spec.iptables.localhostNodePorts
// reaches the iptables backend, with kube-proxy's default: unset and true
// make the backend want route_localnet=1 (it serves NodePorts on
// 127.0.0.1), false makes it set no sysctl. The backend is built in a
// namespace of the test's; nothing is synced.
func TestIPTablesLocalhostNodePorts(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "backends")
	factory := Factories(Env{NS: ns.NS()})[v1alpha1.ModeIPTables]
	for _, tc := range []struct {
		name     string
		settings v1alpha1.ProxySettings
		want     bool
	}{
		{"unset", v1alpha1.ProxySettings{}, true},
		{"section without the field", v1alpha1.ProxySettings{IPTables: &v1alpha1.IPTablesSettings{}}, true},
		{"true", v1alpha1.ProxySettings{IPTables: &v1alpha1.IPTablesSettings{LocalhostNodePorts: new(true)}}, true},
		{"false", v1alpha1.ProxySettings{IPTables: &v1alpha1.IPTablesSettings{LocalhostNodePorts: new(false)}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := factory(dataplane.NodeConfig{NodeName: "n", MasqueradeBit: 14}, tc.settings)
			if err != nil {
				t.Skipf("iptables backend: %v", err)
			}
			settings, err := dataplane.KernelSettings(b)
			if err != nil {
				t.Fatal(err)
			}
			got := len(settings) == 1 && settings[0].Name == "net.ipv4.conf.all.route_localnet" && settings[0].Want == "1"
			if got != tc.want || (!tc.want && len(settings) != 0) {
				t.Errorf("kernel settings %+v; want route_localnet=1: %v", settings, tc.want)
			}
		})
	}
}
