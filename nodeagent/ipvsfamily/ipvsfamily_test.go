package ipvsfamily

import "testing"

// TestListed: the dump finds the generic netlink controller's own family,
// which every kernel has, and no family that does not exist. (Whether IPVS
// is found before and after ip_vs loads, and that asking loads nothing,
// is nodeagent/kmod's TestVMAgentStartLoadsNoModule, in the test VM.)
func TestListed(t *testing.T) {
	for name, want := range map[string]bool{"nlctrl": true, "proxyshift-no-such-family": false} {
		got, err := listed(name)
		if err != nil || got != want {
			t.Errorf("listed(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
}
