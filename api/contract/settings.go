package contract

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Settings are a ProxyNode's spec.settings as they apply to one mode, read
// into plain values. A nil pointer or an empty list means "not set": the
// agent's own flags apply. Only the section of the mode counts (the API
// rejects the others on a ProxyConfig).
type Settings struct {
	// ClusterCIDRs are the pod networks, masked.
	ClusterCIDRs []netip.Prefix
	// NodePortAddresses are CIDRs, or the single word "primary".
	NodePortAddresses []string
	// MasqueradeAll and MasqueradeBit are set by the iptables section:
	// MasqueradeAll whenever the section is there.
	MasqueradeAll *bool
	MasqueradeBit *int
	// MinSyncPeriod and SyncPeriod pace the sync loop (iptables and
	// nftables sections).
	MinSyncPeriod, SyncPeriod *time.Duration
	// Scheduler is the IPVS scheduler (ipvs; DefaultScheduler when the
	// section does not set one).
	Scheduler v1alpha1.IPVSScheduler
	// Section is the API's section of the mode (*v1alpha1.IPTablesSettings,
	// *NFTablesSettings or *IPVSSettings), nil when absent: what a change
	// of the mode's own settings is recognised by.
	Section any
}

// Interpret reads settings for mode. The IPVS section's options beyond
// the scheduler are read by IPVSOptions, when the backend is built, so
// that a value the kernel cannot take fails the switch to ipvs rather
// than the reading of the spec.
func Interpret(mode v1alpha1.ProxyMode, settings *v1alpha1.ProxySettings) (Settings, error) {
	var s Settings
	if mode == v1alpha1.ModeIPVS {
		s.Scheduler = DefaultScheduler
	}
	if settings == nil {
		return s, nil
	}
	for _, c := range settings.ClusterCIDRs {
		p, err := c.Parse()
		if err != nil {
			return Settings{}, fmt.Errorf("spec.settings.clusterCIDRs: %w", err)
		}
		s.ClusterCIDRs = append(s.ClusterCIDRs, p)
	}
	for _, a := range settings.NodePortAddresses {
		s.NodePortAddresses = append(s.NodePortAddresses, string(a))
	}
	switch {
	case mode == v1alpha1.ModeIPTables && settings.IPTables != nil:
		sec := settings.IPTables
		s.Section = sec
		all := sec.MasqueradeAll
		s.MasqueradeAll = &all
		if sec.MasqueradeBit != nil {
			bit := int(*sec.MasqueradeBit)
			s.MasqueradeBit = &bit
		}
		if err := s.periods("iptables", sec.MinSyncPeriod, sec.SyncPeriod); err != nil {
			return Settings{}, err
		}
	case mode == v1alpha1.ModeNFTables && settings.NFTables != nil:
		sec := settings.NFTables
		s.Section = sec
		if err := s.periods("nftables", sec.MinSyncPeriod, sec.SyncPeriod); err != nil {
			return Settings{}, err
		}
	case mode == v1alpha1.ModeIPVS && settings.IPVS != nil:
		s.Section = settings.IPVS
		if settings.IPVS.Scheduler != "" {
			s.Scheduler = settings.IPVS.Scheduler
		}
	}
	return s, nil
}

// periods reads a section's sync periods; an empty one stays unset.
func (s *Settings) periods(section string, minSync, sync v1alpha1.Duration) error {
	for _, d := range []struct {
		field string
		value v1alpha1.Duration
		into  **time.Duration
	}{{"minSyncPeriod", minSync, &s.MinSyncPeriod}, {"syncPeriod", sync, &s.SyncPeriod}} {
		if d.value == "" {
			continue
		}
		v, err := d.value.Parse(0)
		if err != nil {
			return fmt.Errorf("spec.settings.%s.%s: %w", section, d.field, err)
		}
		*d.into = &v
	}
	return nil
}

// IPVS are the options of the IPVS section, read for the ipvs backend.
type IPVS struct {
	// Scheduler is the scheduler of every virtual service, one of
	// Schedulers.
	Scheduler v1alpha1.IPVSScheduler
	// StrictARP stops the node answering ARP for Service IPs.
	StrictARP bool
	// TCPTimeout, TCPFinTimeout and UDPTimeout are IPVS's connection
	// timeouts, whole seconds; zero keeps the kernel's.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
	// ExcludeCIDRs are the networks whose virtual services the backend
	// never deletes, masked.
	ExcludeCIDRs []netip.Prefix
}

// IPVSOptions reads the IPVS section (nil: every default). It fails on an
// unknown scheduler, and on a timeout or CIDR the kernel cannot take.
func IPVSOptions(s *v1alpha1.IPVSSettings) (IPVS, error) {
	if s == nil {
		return IPVS{Scheduler: DefaultScheduler}, nil
	}
	sched, err := Scheduler(s.Scheduler)
	if err != nil {
		return IPVS{}, fmt.Errorf("ipvs: %w", err)
	}
	o := IPVS{Scheduler: sched, StrictARP: s.StrictARP}
	for _, d := range []struct {
		name  string
		value v1alpha1.Duration
		into  *time.Duration
	}{{"tcpTimeout", s.TCPTimeout, &o.TCPTimeout}, {"tcpFinTimeout", s.TCPFinTimeout, &o.TCPFinTimeout}, {"udpTimeout", s.UDPTimeout, &o.UDPTimeout}} {
		v, err := d.value.Parse(0)
		if err != nil {
			return IPVS{}, fmt.Errorf("ipvs: %s: %w", d.name, err)
		}
		if v < 0 || v%time.Second != 0 || v/time.Second > math.MaxUint32 {
			return IPVS{}, fmt.Errorf("ipvs: %s %s is not a whole number of seconds (IPVS counts in seconds; 0 keeps the kernel's)", d.name, d.value)
		}
		*d.into = v
	}
	for _, c := range s.ExcludeCIDRs {
		p, err := c.Parse()
		if err != nil {
			return IPVS{}, fmt.Errorf("ipvs: excludeCIDRs: %w", err)
		}
		o.ExcludeCIDRs = append(o.ExcludeCIDRs, p)
	}
	return o, nil
}

// LocalhostNodePorts says whether NodePorts answer on 127.0.0.1 in
// iptables mode, from the iptables section (nil: the default): true
// unless the section sets localhostNodePorts to false, as in kube-proxy,
// whose iptables mode defaults to it. Only the iptables mode can (it
// needs the route_localnet sysctl and iptables' DNAT of loopback
// traffic); no other mode has the setting.
func LocalhostNodePorts(s *v1alpha1.IPTablesSettings) bool {
	return s == nil || s.LocalhostNodePorts == nil || *s.LocalhostNodePorts
}
