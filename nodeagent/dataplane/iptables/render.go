package iptables

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// chain is one chain and its rules, each rule the text that follows
// "-A <chain> " in iptables-restore's input.
type chain struct {
	table string
	name  string
	rules []string
}

// sharedRule is a rule a service port puts into one of the fixed chains.
// Its comment starts with the port's name, which makes it unique: a sync
// can delete it by its text.
type sharedRule struct {
	table, chain, spec string
}

// portRules are everything one service port adds: its own chains and its
// rules in the fixed chains.
type portRules struct {
	// key is the port's prefix (portNames.key): its block of a restore
	// input, and what collisions claims.
	key string
	// chains are sorted by table, then name.
	chains []*chain
	shared []sharedRule
	// endpoints is the number of DNAT rules: one for each endpoint each
	// of the port's chains chooses among (an endpoint's affinity chain
	// serves both of them).
	endpoints int
	// clash, if not nil, says two endpoints of a port with ClientIP
	// affinity got one chain name: the port cannot be synced.
	clash *NameCollisionError
}

// jumpRule hooks a fixed chain into a built-in chain.
type jumpRule struct {
	table, chain, target, spec string
}

// jumps are the rules that hook proxyshift into the built-in chains, the
// only rules outside its own chains. The nat chains see every packet
// (conntrack hands NAT only the first packet of a connection anyway); the
// filter chains only new connections, except FORWARD's, which accepts
// forwarded service traffic on hosts whose FORWARD policy is DROP (see
// renderFixed).
var jumps = []jumpRule{
	{tableNAT, "PREROUTING", chainServices, `-m comment --comment "proxyshift service portals" -j ` + chainServices},
	{tableNAT, "OUTPUT", chainServices, `-m comment --comment "proxyshift service portals" -j ` + chainServices},
	{tableNAT, "POSTROUTING", chainPostrouting, `-m comment --comment "proxyshift masquerading" -j ` + chainPostrouting},
	{tableFilter, "INPUT", chainFilter, `-m conntrack --ctstate NEW -m comment --comment "proxyshift service checks" -j ` + chainFilter},
	{tableFilter, "FORWARD", chainForward, `-m comment --comment "proxyshift forwarding" -j ` + chainForward},
	{tableFilter, "OUTPUT", chainFilter, `-m conntrack --ctstate NEW -m comment --comment "proxyshift service checks" -j ` + chainFilter},
}

// ruleset is everything proxyshift programs in one family.
type ruleset struct {
	// fixed are the chains every family has, with their static rules;
	// in the kernel the ports' shared rules come before those.
	fixed []*chain
	ports map[model.ServicePortName]*portRules
	// keys are the ports' prefixes.
	keys portKeys
}

// render describes everything proxyshift programs in one family for the
// model's ports of that family, as np (the node's policy for the family)
// decides them. It is pure: the same input always gives the same ruleset.
func render(np *dataplane.NodePolicy, ports map[model.ServicePortName]*model.ServicePort) *ruleset {
	rs := &ruleset{fixed: renderFixed(np), ports: make(map[model.ServicePortName]*portRules, len(ports))}
	for name, sp := range ports {
		rs.ports[name] = renderPort(np, sp)
	}
	return rs
}

// collisions returns the first *NameCollisionError of the ruleset, in
// the ports' order: two ports with one port prefix, or two endpoints of
// a port with one chain; nil when every name is unique. It records the
// ports' prefixes for later incremental syncs (ruleset.keys).
func (rs *ruleset) collisions() error {
	rs.keys = portKeys{}
	for _, name := range model.SortedNames(rs.ports) {
		if err := rs.keys.claim(name, rs.ports[name].key); err != nil {
			return err
		}
		if c := rs.ports[name].clash; c != nil {
			return c
		}
	}
	return nil
}

// renderFixed returns the fixed chains of the family np is for.
func renderFixed(np *dataplane.NodePolicy) []*chain {
	mark := fmt.Sprintf("0x%x", np.MasqueradeMark)
	// nodePortDsts are the matches of a packet to a NodePort address.
	var nodePortDsts []string
	switch {
	case np.NodePortsAnyLocal && np.LocalhostNodePorts:
		nodePortDsts = []string{"-m addrtype --dst-type LOCAL"}
	case np.NodePortsAnyLocal:
		nodePortDsts = []string{"! -d " + np.Loopback.String() + " -m addrtype --dst-type LOCAL"}
	}
	for _, ip := range np.NodePortIPs {
		nodePortDsts = append(nodePortDsts, "-d "+host(ip))
	}
	toNodePorts := func(target string) []string {
		var rules []string
		for _, dst := range nodePortDsts {
			rules = append(rules, dst+` -m comment --comment "proxyshift node ports" -j `+target)
		}
		return rules
	}

	chains := []*chain{
		{table: tableNAT, name: chainServices, rules: toNodePorts(chainNodePorts)},
		{table: tableNAT, name: chainNodePorts},
		{table: tableNAT, name: chainMarkMasq, rules: []string{"-j MARK --or-mark " + mark}},
		{table: tableNAT, name: chainPostrouting, rules: []string{
			"-m mark ! --mark " + mark + "/" + mark + " -j RETURN",
			"-j MARK --xor-mark " + mark,
			"-j MASQUERADE --random-fully",
		}},
		{table: tableFilter, name: chainFilter, rules: filterRules(np)},
		// Forwarded traffic: new connections pass the service checks
		// first (a firewall drop must not be overtaken by an accept);
		// then, as kube-proxy's KUBE-FORWARD, invalid packets are
		// dropped (conntrack would let them reset a connection), and
		// connections marked for masquerading (service traffic from
		// outside the pod networks) and the packets of established
		// connections are accepted, so that Services keep working on
		// hosts whose FORWARD policy is DROP (Docker sets it).
		{table: tableFilter, name: chainForward, rules: []string{
			"-m conntrack --ctstate NEW -j " + chainFilter,
			"-m conntrack --ctstate INVALID -j DROP",
			"-m mark --mark " + mark + "/" + mark + ` -m comment --comment "proxyshift forwarded service traffic" -j ACCEPT`,
			`-m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment "proxyshift forwarded service traffic, established" -j ACCEPT`,
		}},
		{table: tableFilter, name: chainFirewall},
		{table: tableFilter, name: chainEndpointsCheck, rules: toNodePorts(chainNodePortsCheck)},
		{table: tableFilter, name: chainNodePortsCheck},
	}
	if len(np.ClusterCIDRs) > 0 {
		// Marks a packet for masquerading unless it comes from a pod.
		c := &chain{table: tableNAT, name: chainMarkOffCluster}
		for _, p := range np.ClusterCIDRs {
			c.rules = append(c.rules, "-s "+p.String()+" -j RETURN")
		}
		c.rules = append(c.rules, "-j "+chainMarkMasq)
		chains = append(chains, c)
	}
	sortChains(chains)
	return chains
}

// filterRules are the rules of PROXYSHIFT-FILTER, which sees the new
// connections of INPUT, FORWARD and OUTPUT. With localhost NodePorts,
// the route_localnet sysctl lets the node accept packets to 127.0.0.0/8
// from other hosts, which the kernel otherwise drops as martians: the
// first rule drops such new connections unless they were DNATed (a
// NodePort), so that nothing listening on a loopback address becomes
// reachable from the network (kube-proxy's "block incoming localnet
// connections").
func filterRules(np *dataplane.NodePolicy) []string {
	var rules []string
	if np.LocalhostNodePorts {
		lo := np.Loopback.String()
		rules = append(rules, "-d "+lo+" ! -s "+lo+` -m conntrack ! --ctstate DNAT -m comment --comment "proxyshift block incoming localnet connections" -j DROP`)
	}
	return append(rules, "-j "+chainFirewall, "-j "+chainEndpointsCheck)
}

// renderPort describes the rules of one service port, as np's policy for
// it decides.
func renderPort(np *dataplane.NodePolicy, sp *model.ServicePort) *portRules {
	pol := np.PortPolicy(sp)
	n := namesFor(sp.Name)
	pr := &portRules{key: n.key}
	proto := strings.ToLower(string(sp.Protocol))
	share := func(table, chain, spec string) {
		pr.shared = append(pr.shared, sharedRule{table: table, chain: chain, spec: spec})
	}
	// dst matches the first packet to addr (if valid) and port.
	dst := func(addr netip.Addr, port int32, what string) string {
		var b strings.Builder
		if addr.IsValid() {
			b.WriteString("-d " + host(addr) + " ")
		}
		fmt.Fprintf(&b, `-p %s -m comment --comment "%s %s" -m %s --dport %d`, proto, n.id, what, proto, port)
		return b.String()
	}
	reject := " -j REJECT"
	if sp.Protocol == corev1.ProtocolTCP {
		// A reset refuses the connection at once in both families (see
		// the README).
		reject += " --reject-with tcp-reset"
	}
	targetChain := map[dataplane.Target]string{dataplane.TargetCluster: n.service, dataplane.TargetLocal: n.local}

	// Cluster IP traffic: DNAT in the nat table; drops and rejects in the
	// filter table, which only sees connections that were not DNATed.
	if pol.ClusterIP.IsValid() {
		switch pol.Internal {
		case dataplane.TargetCluster, dataplane.TargetLocal:
			share(tableNAT, chainServices, dst(pol.ClusterIP, sp.Port, "cluster IP")+" -j "+targetChain[pol.Internal])
		case dataplane.TargetDrop:
			share(tableFilter, chainEndpointsCheck, dst(pol.ClusterIP, sp.Port, "has no local endpoints")+" -j DROP")
		case dataplane.TargetReject:
			share(tableFilter, chainEndpointsCheck, dst(pol.ClusterIP, sp.Port, "has no endpoints")+reject)
		}
	}

	// External destinations: to the external chain, or rejected when
	// there is no endpoint at all. A packet the external chain drops
	// leaves it without DNAT, and the filter table drops it.
	drops := slices.ContainsFunc(pol.External, func(r dataplane.ExternalRule) bool { return r.To == dataplane.TargetDrop })
	for _, addr := range pol.ExternalAddrs {
		what := "external IP"
		if slices.Contains(sp.LoadBalancerIPs, addr) {
			what = "load balancer IP"
		}
		switch {
		case pol.ExternalReject:
			share(tableFilter, chainEndpointsCheck, dst(addr, sp.Port, "has no endpoints")+reject)
		default:
			share(tableNAT, chainServices, dst(addr, sp.Port, what)+" -j "+n.external)
			if drops {
				share(tableFilter, chainEndpointsCheck, dst(addr, sp.Port, "has no local endpoints")+" -j DROP")
			}
		}
	}
	if pol.NodePort != 0 {
		switch {
		case pol.ExternalReject:
			share(tableFilter, chainNodePortsCheck, dst(netip.Addr{}, pol.NodePort, "has no endpoints")+reject)
		default:
			share(tableNAT, chainNodePorts, dst(netip.Addr{}, pol.NodePort, "node port")+" -j "+n.external)
			if drops {
				share(tableFilter, chainNodePortsCheck, dst(netip.Addr{}, pol.NodePort, "has no local endpoints")+" -j DROP")
			}
		}
	}

	// loadBalancerSourceRanges: checked in the filter table, on the
	// destination the connection had before DNAT.
	if fw := pol.Firewall; fw != nil {
		c := &chain{table: tableFilter, name: n.firewall}
		for _, p := range fw.SourceRanges {
			c.rules = append(c.rules, "-s "+p.String()+" -j RETURN")
		}
		if fw.AllowIPs {
			for _, ip := range fw.IPs {
				c.rules = append(c.rules, "-s "+host(ip)+" -j RETURN")
			}
		}
		c.rules = append(c.rules, "-j DROP")
		pr.chains = append(pr.chains, c)
		for _, ip := range fw.IPs {
			share(tableFilter, chainFirewall, fmt.Sprintf(`-p %s -m comment --comment "%s loadBalancerSourceRanges" -m conntrack --ctorigdst %s --ctorigdstport %d -j %s`,
				proto, n.id, host(ip), sp.Port, n.firewall))
		}
	}

	if len(pol.External) > 0 {
		pr.chains = append(pr.chains, externalChain(np, &pol, n, targetChain))
	}

	if pol.Cluster != nil {
		pr.addPolicyChain(sp, &pol, n, n.service, pol.Cluster, pol.Internal == dataplane.TargetCluster)
	}
	if pol.Local != nil {
		pr.addPolicyChain(sp, &pol, n, n.local, pol.Local, pol.Internal == dataplane.TargetLocal)
	}
	seen := map[netip.Addr]bool{}
	affinityChains := map[string]model.Endpoint{}
	for _, ep := range pol.Endpoints() {
		// Hairpin: an endpoint reaching its own service must see the
		// reply come from the node, not from itself. Only this node's
		// endpoints can hairpin through its rules (a pod elsewhere
		// reaches its service through its own node's), so only they get
		// a rule: at POSTROUTING, before the masquerade bit is tested, a
		// DNATed connection from the endpoint to itself is marked.
		if ep.IsLocal && !seen[ep.IP] {
			seen[ep.IP] = true
			share(tableNAT, chainPostrouting, fmt.Sprintf(`-s %s -d %s -m conntrack --ctstate DNAT -m comment --comment "%s hairpin" -j %s`,
				host(ep.IP), host(ep.IP), n.id, chainMarkMasq))
		}
		if sp.AffinityTimeout == 0 {
			continue
		}
		// ClientIP affinity: a chain per endpoint, whose DNAT rule also
		// records the client in the endpoint's recent list.
		name := endpointChain(n, ep)
		if o, ok := affinityChains[name]; ok && pr.clash == nil {
			pr.clash = collision(name, n.id+" -> "+o.String(), n.id+" -> "+ep.String())
		}
		affinityChains[name] = ep
		pr.chains = append(pr.chains, &chain{table: tableNAT, name: name, rules: []string{dnatTo(proto, ep, "-m recent --set --name "+name+" ")}})
		pr.endpoints++
	}
	sortChains(pr.chains)
	return pr
}

// dnatTo is the rule that sends a connection of protocol proto to ep;
// matches (empty, or ending in a space) come between the protocol and the
// target.
func dnatTo(proto string, ep model.Endpoint, matches string) string {
	return "-p " + proto + " " + matches + "-j " + targetDNAT + " --to-destination " + netip.AddrPortFrom(ep.IP, uint16(ep.Port)).String()
}

// externalChain is where traffic to the node port, external IPs and
// load-balancer IPs goes before choosing an endpoint: the policy's
// external rules in order, each a masquerade mark if it asks for one and
// a jump to its target's chain. A dropping rule has nothing to do here:
// the packet leaves the chain without DNAT and the filter table drops it.
func externalChain(np *dataplane.NodePolicy, pol *dataplane.PortPolicy, n portNames, targetChain map[dataplane.Target]string) *chain {
	c := &chain{table: tableNAT, name: n.external}
	for _, r := range pol.External {
		var froms []string
		switch r.From {
		case dataplane.SourceAny:
			froms = []string{""}
		case dataplane.SourceClusterCIDRs:
			for _, p := range np.ClusterCIDRs {
				froms = append(froms, "-s "+p.String()+" ")
			}
		case dataplane.SourceNode:
			froms = []string{"-m addrtype --src-type LOCAL "}
		}
		for _, from := range froms {
			if r.Masquerade {
				c.rules = append(c.rules, from+"-j "+chainMarkMasq)
			}
			if r.To == dataplane.TargetDrop {
				c.rules = append(c.rules, from+`-m comment --comment "`+n.id+` has no local endpoints: dropped in the filter table"`)
			} else {
				c.rules = append(c.rules, from+"-j "+targetChain[r.To])
			}
		}
	}
	return c
}

// addPolicyChain adds a chain choosing one of eps: the endpoint a client
// reached within the affinity timeout, if any, else one at random. When
// it is the cluster IP's target (internal), it first applies the
// policy's masquerading of cluster-IP traffic.
//
// Without ClientIP affinity each choice DNATs in the chain itself, one
// rule per endpoint and no chain per endpoint: at 10 000 services of 10
// endpoints that is 10 000 chains instead of 110 000, which is what
// iptables-nft-restore's time grows with (see the README). With
// affinity, the choices go to the endpoints' chains, which record the
// client.
//
// The choices carry no comment: their chain is named in the comments of
// the rules that jump to it, and their DNAT target or endpoint chain
// tells them apart. A comment match per endpoint rule took about a
// seventh of iptables-nft-restore's time at 10 000 services (kube-proxy drops its
// own endpoint comments above 1 000 endpoints for the same reason).
func (pr *portRules) addPolicyChain(sp *model.ServicePort, pol *dataplane.PortPolicy, n portNames, name string, eps []model.Endpoint, internal bool) {
	c := &chain{table: tableNAT, name: name}
	if internal && pol.ClusterIP.IsValid() {
		switch pol.InternalMasquerade {
		case dataplane.MasqueradeAll:
			c.rules = append(c.rules, "-d "+host(pol.ClusterIP)+" -j "+chainMarkMasq)
		case dataplane.MasqueradeOutsideClusterCIDRs:
			c.rules = append(c.rules, "-d "+host(pol.ClusterIP)+" -j "+chainMarkOffCluster)
		}
	}
	proto := strings.ToLower(string(sp.Protocol))
	affinity := sp.AffinityTimeout > 0
	if affinity {
		seconds := strconv.Itoa(int(sp.AffinityTimeout.Seconds()))
		for _, ep := range eps {
			sep := endpointChain(n, ep)
			c.rules = append(c.rules, "-m recent --rcheck --seconds "+seconds+" --reap --name "+sep+" -j "+sep)
		}
	}
	// The i-th of n rules takes 1/(n-i) of what reaches it: each endpoint
	// gets 1/n of all packets.
	for i, ep := range eps {
		stat := ""
		if left := len(eps) - i; left > 1 {
			stat = fmt.Sprintf("-m statistic --mode random --probability %0.10f ", 1/float64(left))
		}
		if affinity {
			c.rules = append(c.rules, stat+"-j "+endpointChain(n, ep))
		} else {
			c.rules = append(c.rules, dnatTo(proto, ep, stat))
			pr.endpoints++
		}
	}
	pr.chains = append(pr.chains, c)
}

// sortChains orders chains by table (nat first), then name.
func sortChains(chains []*chain) {
	slices.SortFunc(chains, func(a, b *chain) int {
		return cmp.Or(-cmp.Compare(a.table, b.table), cmp.Compare(a.name, b.name))
	})
}
