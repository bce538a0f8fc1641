package v1alpha1

import (
	"fmt"
	"net/netip"
	"time"
)

// ProxyMode is a service proxy: one of proxyshift's dataplanes, or the
// cluster's own kube-proxy DaemonSet.
// +kubebuilder:validation:Enum=iptables;nftables;ipvs;kube-proxy
type ProxyMode string

// The dataplanes proxyshift can run a node in.
const (
	ModeIPTables ProxyMode = "iptables"
	ModeNFTables ProxyMode = "nftables"
	ModeIPVS     ProxyMode = "ipvs"
)

// ModeKubeProxy is the cluster's kube-proxy: as a ProxyConfig's or a
// ProxyNode's desired mode it hands the nodes back to kube-proxy's
// DaemonSet; as a ProxyNode's active mode it says kube-proxy's rules serve
// the node and proxyshift programs nothing there.
const ModeKubeProxy ProxyMode = "kube-proxy"

// Duration is a non-negative Go duration string such as "500ms", "30s" or
// "1h30m". It is a string in the schema so that the API server can reject a
// malformed or negative value with a message, instead of a controller
// failing to parse it later.
// +kubebuilder:validation:MaxLength=32
// +kubebuilder:validation:XValidation:rule="self.matches('^(0|([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+)$')",message="must be a non-negative duration such as 500ms, 30s or 1h30m (units ns, us, ms, s, m, h)"
type Duration string

// Parse returns the duration, or def when d is empty.
func (d Duration) Parse(def time.Duration) (time.Duration, error) {
	if d == "" {
		return def, nil
	}
	return time.ParseDuration(string(d))
}

// CIDR is an IPv4 or IPv6 network in CIDR notation, such as 198.18.0.0/15.
// +kubebuilder:validation:MaxLength=64
// The API server's isCIDR refuses IPv4-mapped IPv6 networks, as Parse
// does.
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 198.18.0.0/15 or fd00::/64 (not an IPv4-mapped IPv6 network such as ::ffff:10.0.0.0/104: write the IPv4 form)"
type CIDR string

// Parse returns the network with its host bits cleared. It refuses what
// is not a CIDR and IPv4-mapped IPv6 networks (::ffff:10.0.0.0/104 means
// 10.0.0.0/8 in one family and nothing a dataplane can program in the
// other: write the IPv4 form).
func (c CIDR) Parse() (netip.Prefix, error) {
	p, err := netip.ParsePrefix(string(c))
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR such as 198.18.0.0/15 or fd00::/64", string(c))
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped IPv6 network: write it as an IPv4 CIDR", string(c))
	}
	return p.Masked(), nil
}

// NodePortAddress selects the node addresses NodePorts answer on: a CIDR,
// or "primary" for the node's primary addresses (one per IP family).
// +kubebuilder:validation:MaxLength=64
// +kubebuilder:validation:XValidation:rule="self == 'primary' || isCIDR(self)",message="must be a CIDR such as 198.18.0.0/15 (not an IPv4-mapped IPv6 network such as ::ffff:198.18.0.0/111: write the IPv4 form), or the word primary"
type NodePortAddress string

// NodePortAddressPrimary selects the node's primary addresses.
const NodePortAddressPrimary NodePortAddress = "primary"

// ProxySettings are the dataplane settings of a mode. Only the section of
// the selected mode may be set: settings for another mode are rejected
// rather than silently ignored, so a typo in the mode never looks applied.
type ProxySettings struct {
	// IPTables holds settings used only in iptables mode.
	// +optional
	IPTables *IPTablesSettings `json:"iptables,omitempty"`

	// NFTables holds settings used only in nftables mode.
	// +optional
	NFTables *NFTablesSettings `json:"nftables,omitempty"`

	// IPVS holds settings used only in ipvs mode.
	// +optional
	IPVS *IPVSSettings `json:"ipvs,omitempty"`

	// ClusterCIDRs are the pod networks. Traffic to a Service from outside
	// them is masqueraded so replies come back through this node.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=set
	ClusterCIDRs []CIDR `json:"clusterCIDRs,omitempty"`

	// NodePortAddresses limits the node addresses NodePorts answer on:
	// CIDRs, or the single word "primary". Empty means every local address.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="!self.exists(a, a == 'primary') || self.size() == 1",message="primary cannot be combined with CIDRs"
	// +listType=set
	NodePortAddresses []NodePortAddress `json:"nodePortAddresses,omitempty"`
}

// IPTablesSettings tune the iptables dataplane.
type IPTablesSettings struct {
	// MasqueradeAll masquerades all traffic sent to Service IPs.
	// +optional
	MasqueradeAll bool `json:"masqueradeAll,omitempty"`

	// MasqueradeBit is the bit of the packet mark that flags a packet for
	// masquerading.
	// +optional
	// +kubebuilder:default=14
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=31
	MasqueradeBit *int32 `json:"masqueradeBit,omitempty"`

	// MinSyncPeriod is the least time between two syncs of the rules.
	// +optional
	MinSyncPeriod Duration `json:"minSyncPeriod,omitempty"`

	// SyncPeriod is the time between two full resyncs of the rules.
	// +optional
	SyncPeriod Duration `json:"syncPeriod,omitempty"`

	// LocalhostNodePorts lets NodePorts answer on 127.0.0.1 (IPv4 only)
	// for clients on the node, as kube-proxy's iptables mode does: the
	// agent sets the route_localnet sysctl and drops connections to
	// 127.0.0.0/8 from other hosts. Unset means true, kube-proxy's
	// default; it applies when nodePortAddresses is empty or holds a
	// loopback address. Only the iptables mode has it.
	// +optional
	LocalhostNodePorts *bool `json:"localhostNodePorts,omitempty"`
}

// NFTablesSettings tune the nftables dataplane.
type NFTablesSettings struct {
	// MinSyncPeriod is the least time between two syncs of the rules.
	// +optional
	MinSyncPeriod Duration `json:"minSyncPeriod,omitempty"`

	// SyncPeriod is the time between two full resyncs of the rules.
	// +optional
	SyncPeriod Duration `json:"syncPeriod,omitempty"`
}

// IPVSScheduler is an IPVS scheduling algorithm; each needs its own kernel
// module (ip_vs_<name>).
// +kubebuilder:validation:Enum=rr;wrr;lc;wlc;lblc;lblcr;sh;dh;sed;nq;mh
type IPVSScheduler string

// IPVSSettings tune the IPVS dataplane.
type IPVSSettings struct {
	// Scheduler is the IPVS scheduling algorithm.
	// +optional
	// +kubebuilder:default=rr
	Scheduler IPVSScheduler `json:"scheduler,omitempty"`

	// StrictARP stops the node answering ARP for Service IPs bound to the
	// proxy's dummy interface (arp_ignore=1, arp_announce=2).
	// +optional
	StrictARP bool `json:"strictARP,omitempty"`

	// TCPTimeout is the idle timeout of established TCP connections.
	// +optional
	TCPTimeout Duration `json:"tcpTimeout,omitempty"`

	// TCPFinTimeout is the timeout of TCP connections after a FIN.
	// +optional
	TCPFinTimeout Duration `json:"tcpFinTimeout,omitempty"`

	// UDPTimeout is the idle timeout of UDP flows.
	// +optional
	UDPTimeout Duration `json:"udpTimeout,omitempty"`

	// ExcludeCIDRs are networks whose IPVS virtual services the proxy never
	// touches, even when they look stale.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=set
	ExcludeCIDRs []CIDR `json:"excludeCIDRs,omitempty"`
}
