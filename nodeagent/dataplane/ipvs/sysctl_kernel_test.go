package ipvs

import (
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

// TestVMKernelSettings checks that a sync sets the sysctls IPVS mode
// needs, strictARP included, and that KernelSettings reports them.
func TestVMKernelSettings(t *testing.T) {
	lab, pods := newLab(t, 1)
	b := newLabBackend(t, lab, WithStrictARP(true))
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(labService("web", "198.19.0.60", pods...)), Full: true})
	settings, err := b.KernelSettings()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range settings {
		names[s.Name] = true
		if s.Value != s.Want {
			t.Errorf("%s = %q, want %q", s.Name, s.Value, s.Want)
		}
	}
	for _, want := range []string{"net.ipv4.vs.conntrack", "net.ipv4.vs.conn_reuse_mode", "net.ipv4.vs.expire_nodest_conn",
		"net.ipv4.conf.all.arp_ignore", "net.ipv4.conf.all.arp_announce"} {
		if !names[want] {
			t.Errorf("settings %+v lack %s", settings, want)
		}
	}
	// The namespace's setting, not the VM's own.
	if v, err := lab.Client.NS.Sysctl("net/ipv4/conf/all/arp_ignore"); err != nil || v != "0" {
		t.Errorf("another namespace's arp_ignore is %q, %v; want it untouched (0)", v, err)
	}
}
