package contract

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestInterpret(t *testing.T) {
	settings := &v1alpha1.ProxySettings{
		ClusterCIDRs:      []v1alpha1.CIDR{"10.244.1.7/16"},
		NodePortAddresses: []v1alpha1.NodePortAddress{"primary"},
		IPTables:          &v1alpha1.IPTablesSettings{MasqueradeBit: ptr.To[int32](9), MinSyncPeriod: "0", SyncPeriod: "1m"},
		NFTables:          &v1alpha1.NFTablesSettings{SyncPeriod: "2m"},
		IPVS:              &v1alpha1.IPVSSettings{Scheduler: "sh"},
	}
	s, err := Interpret(v1alpha1.ModeIPTables, settings)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.ClusterCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}) || !slices.Equal(s.NodePortAddresses, []string{"primary"}) {
		t.Errorf("cluster CIDRs %v, nodePort addresses %v", s.ClusterCIDRs, s.NodePortAddresses)
	}
	if s.MasqueradeAll == nil || *s.MasqueradeAll || s.MasqueradeBit == nil || *s.MasqueradeBit != 9 {
		t.Errorf("iptables: masqueradeAll %v, bit %v; want false (set by the section) and 9", s.MasqueradeAll, s.MasqueradeBit)
	}
	if s.MinSyncPeriod == nil || *s.MinSyncPeriod != 0 || s.SyncPeriod == nil || *s.SyncPeriod != time.Minute {
		t.Errorf("iptables periods %v, %v; want 0 and 1m", s.MinSyncPeriod, s.SyncPeriod)
	}
	if s.Section != settings.IPTables || s.Scheduler != "" {
		t.Errorf("iptables: section %v, scheduler %q", s.Section, s.Scheduler)
	}

	s, err = Interpret(v1alpha1.ModeNFTables, settings)
	if err != nil {
		t.Fatal(err)
	}
	if s.MasqueradeAll != nil || s.MasqueradeBit != nil || s.MinSyncPeriod != nil || s.SyncPeriod == nil || *s.SyncPeriod != 2*time.Minute {
		t.Errorf("nftables reads only its own section: %+v", s)
	}
	s, err = Interpret(v1alpha1.ModeIPVS, settings)
	if err != nil || s.Scheduler != "sh" || s.Section != settings.IPVS || s.SyncPeriod != nil {
		t.Errorf("ipvs: %+v, %v", s, err)
	}
	if s, err := Interpret(v1alpha1.ModeIPVS, nil); err != nil || s.Scheduler != DefaultScheduler || s.Section != nil {
		t.Errorf("ipvs without settings: %+v, %v; want the default scheduler", s, err)
	}

	for _, bad := range []*v1alpha1.ProxySettings{
		{ClusterCIDRs: []v1alpha1.CIDR{"10.0.0.1"}},
		{NFTables: &v1alpha1.NFTablesSettings{MinSyncPeriod: "soon"}},
	} {
		if _, err := Interpret(v1alpha1.ModeNFTables, bad); err == nil {
			t.Errorf("Interpret(%+v) succeeded", bad)
		}
	}
}

func TestIPVSOptions(t *testing.T) {
	o, err := IPVSOptions(&v1alpha1.IPVSSettings{
		Scheduler: "sh", StrictARP: true, TCPTimeout: "15m", TCPFinTimeout: "30s",
		ExcludeCIDRs: []v1alpha1.CIDR{"198.18.200.7/24", "fd00::/64"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.Scheduler != "sh" || !o.StrictARP {
		t.Errorf("scheduler %q, strictARP %v; want sh and true", o.Scheduler, o.StrictARP)
	}
	if o.TCPTimeout != 15*time.Minute || o.TCPFinTimeout != 30*time.Second || o.UDPTimeout != 0 {
		t.Errorf("timeouts %v, %v, %v", o.TCPTimeout, o.TCPFinTimeout, o.UDPTimeout)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("198.18.200.0/24"), netip.MustParsePrefix("fd00::/64")}; !slices.Equal(o.ExcludeCIDRs, want) {
		t.Errorf("excluded CIDRs %v, want %v", o.ExcludeCIDRs, want)
	}
	if o, err := IPVSOptions(nil); err != nil || o.Scheduler != DefaultScheduler || o.StrictARP || o.ExcludeCIDRs != nil {
		t.Errorf("nil settings give %+v, %v; want the defaults", o, err)
	}
	for _, bad := range []v1alpha1.IPVSSettings{
		{TCPTimeout: "1500ms"}, {UDPTimeout: "-1s"}, {TCPFinTimeout: "soon"}, {TCPTimeout: "2000000h"},
		{ExcludeCIDRs: []v1alpha1.CIDR{"198.18.0.1"}}, {Scheduler: "fifo"},
	} {
		if _, err := IPVSOptions(&bad); err == nil {
			t.Errorf("IPVSOptions(%+v) succeeded", bad)
		}
	}
}
