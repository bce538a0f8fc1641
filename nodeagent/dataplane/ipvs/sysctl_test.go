package ipvs

import (
	"reflect"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

func TestKernelSettingsKeepNameWantAndValueInOrder(t *testing.T) {
	if got := kernelSettings(nil); got != nil {
		t.Errorf("kernelSettings(nil) = %v; want nil", got)
	}
	got := kernelSettings([]Setting{
		{Name: "net.ipv4.vs.conntrack", Want: "1", Value: "1", Why: "masquerading"},
		{Name: "net.ipv4.vs.conn_reuse_mode", Want: "0", Why: "old kernel"},
	})
	want := []dataplane.KernelSetting{
		{Name: "net.ipv4.vs.conntrack", Want: "1", Value: "1"},
		{Name: "net.ipv4.vs.conn_reuse_mode", Want: "0"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kernelSettings = %+v; want %+v", got, want)
	}
}

// TestKernelSettingsListsWhatTheBackendSets reads back the sysctls of the
// test's own namespace (their values depend on the host, and are empty
// without ip_vs), so it checks the names and wanted values only.
func TestKernelSettingsListsWhatTheBackendSets(t *testing.T) {
	for _, strictARP := range []bool{false, true} {
		b := &Backend{strictARP: strictARP}
		got, err := b.KernelSettings()
		if err != nil {
			t.Fatal(err)
		}
		wanted := b.settings(kernelRelease())
		if len(got) != len(wanted) {
			t.Fatalf("strictARP=%v: KernelSettings = %+v; want one per setting of %+v", strictARP, got, wanted)
		}
		for i, s := range got {
			if s.Name != wanted[i].Name || s.Want != wanted[i].Want {
				t.Errorf("strictARP=%v: setting %d = %+v; want %s=%s", strictARP, i, s, wanted[i].Name, wanted[i].Want)
			}
		}
		names := map[string]bool{}
		for _, s := range got {
			names[s.Name] = true
		}
		if names["net.ipv4.conf.all.arp_ignore"] != strictARP || !names["net.ipv4.vs.conntrack"] {
			t.Errorf("strictARP=%v: settings %+v", strictARP, got)
		}
	}
}
