package findings

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// rule is one documented behaviour difference. It applies to a node that
// moves from one proxy to another; a rule with a service predicate
// becomes a finding only when some Service matches it (the finding's
// objects are those Services), one without names the nodes.
type rule struct {
	code     string
	severity v1alpha1.FindingSeverity
	// applies says whether the difference exists when a node moves from
	// one proxy to another (never equal) with the target's settings.
	applies func(from, to Proxy, s *v1alpha1.ProxySettings) bool
	// service selects the Services the difference affects; nil: the
	// nodes are affected.
	service func(*corev1.Service) bool
	// message says what changes; %[1]s is the target proxy.
	message string
	action  string
}

// The codes of the findings. docs/behaviour-differences.md has a row for
// each, naming its test.
const (
	CodeLocalhostNodePortsNotServed = "LocalhostNodePortsNotServed"
	CodeStrictARPDisabled           = "StrictARPDisabled"
	CodeLeavingKubeProxy            = "LeavingKubeProxy"
	CodeServiceIPsBecomeLocal       = "ServiceIPsBecomeLocal"
	CodeServiceIPsNoLongerLocal     = "ServiceIPsNoLongerLocal"
	CodeSessionAffinityPerAddress   = "SessionAffinityPerAddress"
	CodeSessionAffinityReset        = "SessionAffinityReset"
	CodeExternalLocalForNodeClients = "ExternalLocalForNodeClients"
	CodeSourceRangesDropSilently    = "SourceRangesDropSilently"
	CodeUndeclaredPortsNotRejected  = "UndeclaredPortsNotRejected"
	CodeNodePortsOnEveryAddress     = "NodePortsOnEveryAddress"
)

// rules are every difference the operator knows, in no particular order
// (Compute sorts the findings).
var rules = []rule{
	{
		code: CodeLocalhostNodePortsNotServed, severity: v1alpha1.SeverityWarning,
		applies: func(from, to Proxy, s *v1alpha1.ProxySettings) bool {
			return from == Proxy{KubeProxy: true, Mode: v1alpha1.ModeIPTables} && !to.KubeProxy && !servesLocalhostNodePorts(to, s)
		},
		service: hasIPv4NodePort,
		message: "Services use NodePorts, which clients on the node may reach on 127.0.0.1: kube-proxy's iptables mode serves that (localhostNodePorts, IPv4), " +
			"%[1]s does not",
		action: "Make clients on the nodes reach NodePorts on the node's own address, not on 127.0.0.1",
	},
	{
		code: CodeStrictARPDisabled, severity: v1alpha1.SeverityWarning,
		applies: func(from, to Proxy, s *v1alpha1.ProxySettings) bool {
			return intoIPVS(from, to, s) && (s.IPVS == nil || !s.IPVS.StrictARP)
		},
		service: hasExternalAddress,
		message: "Services have load-balancer or external IPs, which %[1]s binds to a local interface; without spec.ipvs.strictARP the node " +
			"answers ARP for them, which breaks L2 load balancers (MetalLB, kube-vip) announcing them from one node",
		action: "Set spec.ipvs.strictARP: true if an L2 load balancer announces these IPs",
	},
	{
		code: CodeLeavingKubeProxy, severity: v1alpha1.SeverityInfo,
		applies: leavesKubeProxy,
		message: "The nodes leave kube-proxy for %[1]s: kube-proxy's metrics endpoint (port 10249) stops answering; the agent serves " +
			"kube-proxy's sync metrics (kubeproxy_*) under the same names on 127.0.0.1:10265, and kube-proxy's /healthz and /livez (port 10256) " +
			"and the Services' health-check node ports in its place",
		action: "Point metrics scrapes at the proxyshift agent (127.0.0.1:10265)",
	},
	{
		code: CodeServiceIPsBecomeLocal, severity: v1alpha1.SeverityInfo,
		applies: intoIPVS, service: hasClusterIP,
		message: "%[1]s binds every Service IP to a local dummy interface: the node answers Service IPs on every port, so host-network programs " +
			"listening on all addresses are reachable through Service IPs on ports no Service declares, and Service IPs answer ping",
		action: "Bind host-network listeners to specific addresses, or filter traffic to Service IPs on undeclared ports",
	},
	{
		code: CodeServiceIPsNoLongerLocal, severity: v1alpha1.SeverityInfo,
		applies: func(from, to Proxy, _ *v1alpha1.ProxySettings) bool {
			return from.Mode == v1alpha1.ModeIPVS && !to.KubeProxy && to.Mode != v1alpha1.ModeIPVS
		},
		service: hasClusterIP,
		message: "Service IPs stop being local addresses under %[1]s: host-network programs reached through a Service IP on a port " +
			"the Service does not declare stop answering there, and Service IPs stop answering ping",
		action: "Reach host-network programs on the node's own addresses",
	},
	{
		code: CodeSessionAffinityPerAddress, severity: v1alpha1.SeverityInfo,
		applies: intoIPVS, service: clientIPAffinity,
		message: "Services use ClientIP session affinity, which %[1]s keeps per Service address (IPVS persistence), not per Service port: " +
			"a client reaching a Service by its cluster IP and by a node port or load-balancer IP may land on two endpoints; " +
			"and a client's affinity outlives sessionAffinityConfig.clientIP.timeoutSeconds while IPVS still tracks a connection of it (a persistence template expires only after its last connection entry, up to a minute after a connection closed)",
		action: "Make clients that need affinity reach each Service by one address, and do not rely on affinity ending at the timeout",
	},
	{
		code: CodeSessionAffinityReset, severity: v1alpha1.SeverityInfo,
		applies: func(Proxy, Proxy, *v1alpha1.ProxySettings) bool { return true },
		service: clientIPAffinity,
		message: "Services use ClientIP session affinity, whose memory of which client went where stays with the old proxy: " +
			"after the switch to %[1]s each client's next new connection may go to another endpoint",
		action: "None needed unless the Services' clients cannot move once; then switch these nodes in a quiet period",
	},
	{
		code: CodeExternalLocalForNodeClients, severity: v1alpha1.SeverityInfo,
		applies: intoIPVS, service: localExternalPolicy,
		message: "Services have externalTrafficPolicy Local: under %[1]s, pods and the node that reach their node ports or load-balancer IPs " +
			"get only the node's local endpoints when it has some (IPVS chooses by destination), where other modes use any endpoint",
		action: "None needed unless pods reach these Services by their external addresses; have them use the cluster IP",
	},
	{
		code: CodeSourceRangesDropSilently, severity: v1alpha1.SeverityInfo,
		applies: leavesKubeProxy, service: hasSourceRanges,
		message: "Services restrict their load-balancer IPs with loadBalancerSourceRanges; %[1]s drops disallowed sources in the filter table " +
			"even when the Service has no endpoints, where kube-proxy rejects them: those clients time out instead of being refused",
		action: "None needed; expect timeouts, not refusals, for disallowed sources",
	},
	{
		code: CodeUndeclaredPortsNotRejected, severity: v1alpha1.SeverityInfo,
		applies: func(from, to Proxy, _ *v1alpha1.ProxySettings) bool {
			// Both nftables modes reject (kube-proxy's and proxyshift's
			// cluster-ips-check); IPVS answers on every port of its local
			// service IPs, so only proxyshift's iptables mode routes.
			return from.Mode == v1alpha1.ModeNFTables && !to.KubeProxy && to.Mode == v1alpha1.ModeIPTables
		},
		service: hasClusterIP,
		message: "the nftables mode (kube-proxy's and proxyshift's) rejects traffic to a cluster IP on a port the Service does not declare; %[1]s routes it like any other " +
			"packet, so such clients time out instead of being refused",
		action: "None needed; expect timeouts, not refusals, on undeclared ports",
	},
	{
		code: CodeNodePortsOnEveryAddress, severity: v1alpha1.SeverityWarning,
		applies: func(from, to Proxy, s *v1alpha1.ProxySettings) bool {
			return from == Proxy{KubeProxy: true, Mode: v1alpha1.ModeNFTables} && !to.KubeProxy && len(s.NodePortAddresses) == 0
		},
		service: hasNodePort,
		message: "Services use NodePorts, which kube-proxy's nftables mode answers only on the node's primary addresses when its configuration sets no " +
			"nodePortAddresses; with spec.nodePortAddresses empty, %[1]s answers them on every local address of the node (every interface, not only the primary one)",
		action: "Set spec.nodePortAddresses: [primary] to keep NodePorts on the node's primary addresses (or the CIDRs kube-proxy's nodePortAddresses lists, if it sets any)",
	},
}

// leavesKubeProxy: kube-proxy serves the node now and a proxyshift mode
// will.
func leavesKubeProxy(from, to Proxy, _ *v1alpha1.ProxySettings) bool {
	return from.KubeProxy && !to.KubeProxy
}

// intoIPVS: the node moves into proxyshift's ipvs mode from a proxy that
// is not IPVS.
func intoIPVS(from, to Proxy, _ *v1alpha1.ProxySettings) bool {
	return to == Proxy{Mode: v1alpha1.ModeIPVS} && from.Mode != v1alpha1.ModeIPVS
}

// servesLocalhostNodePorts says whether proxyshift in mode to, with
// settings s, answers NodePorts on 127.0.0.1: its iptables mode with
// localhostNodePorts (unset is true); no other mode can.
func servesLocalhostNodePorts(to Proxy, s *v1alpha1.ProxySettings) bool {
	if to.Mode != v1alpha1.ModeIPTables {
		return false
	}
	var sec *v1alpha1.IPTablesSettings
	if s != nil {
		sec = s.IPTables
	}
	return contract.LocalhostNodePorts(sec)
}
