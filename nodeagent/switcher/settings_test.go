package switcher

import (
	"context"
	"reflect"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

// settingBackend is a backend that sets kernel settings.
type settingBackend struct {
	countingBackend
	settings []dataplane.KernelSetting
}

func (b *settingBackend) KernelSettings() ([]dataplane.KernelSetting, error) { return b.settings, nil }

func TestKernelSettingsAreTheServingBackends(t *testing.T) {
	ctx := context.Background()
	f := NewFanout()
	ipvsSettings := []dataplane.KernelSetting{{Name: "net.ipv4.vs.conntrack", Want: "1", Value: "1"}}
	ipvs := &settingBackend{countingBackend: countingBackend{mode: v1alpha1.ModeIPVS}, settings: ipvsSettings}
	nft := &countingBackend{mode: v1alpha1.ModeNFTables}

	if got, err := f.KernelSettings(); got != nil || err != nil {
		t.Errorf("empty Fanout: %v, %v; want none", got, err)
	}
	for _, m := range []struct {
		mode v1alpha1.ProxyMode
		b    dataplane.Backend
	}{{v1alpha1.ModeNFTables, nft}, {v1alpha1.ModeIPVS, ipvs}} {
		if _, err := f.Add(ctx, m.mode, m.b, ""); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := f.KernelSettings(); got != nil || err != nil {
		t.Errorf("no primary yet: %v, %v; want none", got, err)
	}
	f.SetPrimary(v1alpha1.ModeNFTables)
	if got, err := f.KernelSettings(); got != nil || err != nil {
		t.Errorf("nftables serving (ipvs programmed too): %v, %v; want none", got, err)
	}
	f.SetPrimary(v1alpha1.ModeIPVS)
	if got, err := f.KernelSettings(); !reflect.DeepEqual(got, ipvsSettings) || err != nil {
		t.Errorf("ipvs serving: %v, %v; want %v", got, err, ipvsSettings)
	}
}
