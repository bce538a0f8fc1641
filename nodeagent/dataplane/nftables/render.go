package nftables

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// Base-chain priorities. They are chosen against kube-proxy's (filter
// chains at dstnat-10, nat chains at dstnat and srcnat) and iptables' nat
// table (dstnat, srcnat), so that on a node where either still runs,
// proxyshift sees each new connection first: see the README.
const (
	priorityFilter = nftables.ChainPriority(-120) // dstnat-20
	priorityDNAT   = nftables.ChainPriority(-110) // dstnat-10
	prioritySNAT   = nftables.ChainPriority(90)   // srcnat-10
)

// renderConfig is the part of the node's configuration one family's
// table depends on.
type renderConfig struct {
	// nodeIPs are the family's NodePort addresses; anyLocal says NodePorts
	// answer on every local address because none were configured at all.
	nodeIPs  []netip.Addr
	anyLocal bool
	// clusterCIDRs are the family's pod networks, without overlaps.
	clusterCIDRs  []netip.Prefix
	masqueradeAll bool
	mark          uint32
}

func newRenderConfig(f *family, cfg dataplane.NodeConfig) renderConfig {
	rc := renderConfig{
		anyLocal:      len(cfg.NodeIPs) == 0,
		masqueradeAll: cfg.MasqueradeAll,
		mark:          1 << uint(cfg.MasqueradeBit),
	}
	for _, ip := range cfg.NodeIPs {
		if f.has(ip) && !f.loopback.Contains(ip.Unmap()) {
			rc.nodeIPs = append(rc.nodeIPs, ip.Unmap())
		}
	}
	slices.SortFunc(rc.nodeIPs, netip.Addr.Compare)
	rc.nodeIPs = slices.Compact(rc.nodeIPs)
	rc.clusterCIDRs = disjoint(f, cfg.ClusterCIDRs)
	return rc
}

// disjoint returns the family's prefixes, masked, sorted and without any
// prefix another one contains (interval sets refuse overlaps).
func disjoint(f *family, in []netip.Prefix) []netip.Prefix {
	var ps []netip.Prefix
	for _, p := range in {
		if p.IsValid() && f.has(p.Addr()) {
			ps = append(ps, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked())
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	var out []netip.Prefix
	for _, p := range ps {
		if len(out) == 0 || !out[len(out)-1].Contains(p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}

// render describes the whole table of family f for the model's ports of
// that family. It is pure: the same input always gives the same ruleset.
// When two ports claim the same key in a shared map (two services with
// one external IP and port), the first by name keeps it; claims records
// who holds which key.
func render(f *family, ports map[model.ServicePortName]*model.ServicePort, rc renderConfig) (rs *ruleset, claims claimIndex) {
	rs = &ruleset{f: f, ports: make(map[model.ServicePortName]*portObjects, len(ports))}
	rs.chains, rs.sets = renderFixed(f, rc)
	claims = claimIndex{}
	for _, name := range sortedNames(ports) {
		objs := renderPort(f, ports[name], rc)
		claims.claim(name, objs)
		rs.ports[name] = objs
	}
	return rs, claims
}

func sortedNames[V any](m map[model.ServicePortName]V) []model.ServicePortName {
	names := make([]model.ServicePortName, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, compareNames)
	return names
}

func compareNames(a, b model.ServicePortName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}

// claimIndex records which port owns each key of the shared maps.
type claimIndex map[string]map[string]model.ServicePortName

// claim takes the keys of objs' shared elements for name, dropping from
// objs those another port holds, and duplicates.
func (c claimIndex) claim(name model.ServicePortName, objs *portObjects) {
	for m, elems := range objs.shared {
		if c[m] == nil {
			c[m] = map[string]model.ServicePortName{}
		}
		kept := elems[:0]
		seen := map[string]bool{}
		for _, e := range elems {
			if owner, ok := c[m][e.text]; seen[e.text] || ok && owner != name {
				continue
			}
			seen[e.text] = true
			c[m][e.text] = name
			kept = append(kept, e)
		}
		objs.shared[m] = kept
	}
}

// release gives up name's keys in objs.
func (c claimIndex) release(name model.ServicePortName, objs *portObjects) {
	for m, elems := range objs.shared {
		for _, e := range elems {
			if c[m][e.text] == name {
				delete(c[m], e.text)
			}
		}
	}
}

// renderFixed returns the chains and sets every table has.
func renderFixed(f *family, rc renderConfig) ([]*chain, []*set) {
	base := func(name string, typ nftables.ChainType, hookName string, num uint32, prio nftables.ChainPriority, rules ...*ruleBuilder) *chain {
		return &chain{name: name, hook: &hook{typ: typ, hookName: hookName, num: nftables.ChainHook(num), priority: prio}, rules: built(rules)}
	}
	regular := func(name string, rules ...*ruleBuilder) *chain {
		return &chain{name: name, rules: built(rules)}
	}
	r := func() *ruleBuilder { return newRule(f) }

	chains := []*chain{
		// Before DNAT: the destination is still the service address.
		base(chainFilterPrerouting, nftables.ChainTypeFilter, "prerouting", unix.NF_INET_PRE_ROUTING, priorityFilter,
			r().ctStateNew().jump(chainFirewallCheck)),
		base(chainFilterInput, nftables.ChainTypeFilter, "input", unix.NF_INET_LOCAL_IN, priorityFilter,
			r().ctStateNew().jump(chainEndpointCheck)),
		base(chainFilterForward, nftables.ChainTypeFilter, "forward", unix.NF_INET_FORWARD, priorityFilter,
			r().ctStateNew().jump(chainEndpointCheck)),
		base(chainFilterOutput, nftables.ChainTypeFilter, "output", unix.NF_INET_LOCAL_OUT, priorityFilter,
			r().ctStateNew().jump(chainFirewallCheck),
			r().ctStateNew().jump(chainEndpointCheck)),
		base(chainNATPrerouting, nftables.ChainTypeNAT, "prerouting", unix.NF_INET_PRE_ROUTING, priorityDNAT,
			r().jump(chainServices)),
		base(chainNATOutput, nftables.ChainTypeNAT, "output", unix.NF_INET_LOCAL_OUT, priorityDNAT,
			r().jump(chainServices)),
		base(chainNATPostrouting, nftables.ChainTypeNAT, "postrouting", unix.NF_INET_POST_ROUTING, prioritySNAT,
			r().jump(chainMasquerading)),
	}

	services := []*ruleBuilder{r().vmapAddrProtoPort(mapServiceIPs)}
	endpointCheck := []*ruleBuilder{r().vmapAddrProtoPort(mapNoEndpointServices)}
	if np := nodePortMatch(f, rc); np != nil {
		services = append(services, np().vmapProtoPort(mapServiceNodePorts))
		endpointCheck = append(endpointCheck, np().vmapProtoPort(mapNoEndpointNodePorts))
	}
	chains = append(chains,
		regular(chainServices, services...),
		regular(chainEndpointCheck, endpointCheck...),
		regular(chainFirewallCheck, r().vmapAddrProtoPort(mapFirewallIPs)),
		// TCP gets a reset rather than ICMP: ICMPv6 port unreachable for a
		// forwarded or local connection did not reliably reach the
		// client's socket in our tests, a reset does in both families.
		regular(chainReject, r().rejectTCP(), r().reject()),
		regular(chainMarkMasq, r().markSet(rc.mark)),
		regular(chainMasquerading,
			r().markUnset(rc.mark).ret(),
			r().markClear(rc.mark),
			r().masquerade()),
	)
	slices.SortFunc(chains[len(baseChainNames):], func(a, b *chain) int { return cmp.Compare(a.name, b.name) })

	addrProtoPort := nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService)
	protoPort := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	addrText := f.addrType.Name + " . inet_proto . inet_service"
	vmap := func(name string, t nftables.SetDatatype, text string) *set {
		return &set{name: name, keyType: t, keyText: text, verdictMap: true}
	}
	sets := []*set{
		vmap(mapFirewallIPs, addrProtoPort, addrText),
		vmap(mapNoEndpointNodePorts, protoPort, "inet_proto . inet_service"),
		vmap(mapNoEndpointServices, addrProtoPort, addrText),
		vmap(mapServiceIPs, addrProtoPort, addrText),
		vmap(mapServiceNodePorts, protoPort, "inet_proto . inet_service"),
	}
	if len(rc.clusterCIDRs) > 0 {
		s := &set{name: setClusterCIDRs, keyType: f.addrType, keyText: f.addrType.Name, interval: true}
		for _, p := range rc.clusterCIDRs {
			s.elems = append(s.elems, prefixElement(f, p))
		}
		sets = append(sets, s)
	}
	if !rc.anyLocal && len(rc.nodeIPs) > 0 {
		s := &set{name: setNodePortIPs, keyType: f.addrType, keyText: f.addrType.Name}
		for _, ip := range rc.nodeIPs {
			s.elems = append(s.elems, element{key: f.bytes(ip), text: ip.String()})
		}
		sets = append(sets, s)
	}
	slices.SortFunc(sets, func(a, b *set) int { return cmp.Compare(a.name, b.name) })
	return chains, sets
}

// baseChainNames lists the base chains in the order renderFixed returns
// them.
var baseChainNames = []string{chainFilterPrerouting, chainFilterInput, chainFilterForward, chainFilterOutput,
	chainNATPrerouting, chainNATOutput, chainNATPostrouting}

// nodePortMatch returns a function starting a rule that matches packets
// to a NodePort address, or nil if the family has no NodePort addresses.
func nodePortMatch(f *family, rc renderConfig) func() *ruleBuilder {
	switch {
	case rc.anyLocal:
		return func() *ruleBuilder { return newRule(f).fibLocal("daddr").addrIn("daddr", true, f.loopback) }
	case len(rc.nodeIPs) > 0:
		return func() *ruleBuilder { return newRule(f).addrInSet("daddr", false, setNodePortIPs) }
	default:
		return nil
	}
}

func built(rbs []*ruleBuilder) []rule {
	rules := make([]rule, len(rbs))
	for i, rb := range rbs {
		rules[i] = rb.build()
	}
	return rules
}

// renderPort describes the objects of one service port.
func renderPort(f *family, sp *model.ServicePort, rc renderConfig) *portObjects {
	n := namesFor(sp.Name)
	objs := &portObjects{shared: map[string][]element{}}
	proto := protoNumber(sp.Protocol)
	protoText := protoName(sp.Protocol)
	r := func() *ruleBuilder { return newRule(f) }
	share := func(m string, key []byte, text string, v *verdict) {
		objs.shared[m] = append(objs.shared[m], element{key: key, text: text, verdict: v, comment: n.comment})
	}
	addrKey := func(addr netip.Addr) ([]byte, string) {
		return addrProtoPortKey(f, addr, proto, sp.Port), addr.String() + " . " + protoText + " . " + itoa(sp.Port)
	}

	cluster := sp.ClusterEndpoints()
	local := sp.LocalEndpoints()
	hasEndpoints := len(cluster) > 0
	external := sp.UsesExternal()
	usesCluster := hasEndpoints && (!sp.InternalPolicyLocal || external)
	usesLocal := len(local) > 0 && (sp.InternalPolicyLocal || external && sp.ExternalPolicyLocal)

	// Internal (cluster IP) traffic goes to the chain of its policy.
	internalChain, hasInternal := n.service, hasEndpoints
	if sp.InternalPolicyLocal {
		internalChain, hasInternal = n.local, len(local) > 0
	}
	if f.has(sp.ClusterIP) {
		key, text := addrKey(sp.ClusterIP)
		switch {
		case hasInternal:
			share(mapServiceIPs, key, text, gotoChain(internalChain))
		case hasEndpoints:
			// internalTrafficPolicy Local with no endpoint here.
			share(mapNoEndpointServices, key, text, verdictDrop)
		default:
			share(mapNoEndpointServices, key, text, gotoChain(chainReject))
		}
	}

	// External destinations go to the external chain, or are rejected
	// when there is no endpoint at all.
	var externalAddrs []netip.Addr
	externalAddrs = append(externalAddrs, sp.ExternalIPs...)
	externalAddrs = append(externalAddrs, sp.LoadBalancerIPs...)
	for _, addr := range externalAddrs {
		if !f.has(addr) {
			continue
		}
		key, text := addrKey(addr)
		if hasEndpoints {
			share(mapServiceIPs, key, text, gotoChain(n.external))
		} else {
			share(mapNoEndpointServices, key, text, gotoChain(chainReject))
		}
	}
	if sp.NodePort != 0 {
		key, text := protoPortKey(proto, sp.NodePort), protoText+" . "+itoa(sp.NodePort)
		if hasEndpoints {
			share(mapServiceNodePorts, key, text, gotoChain(n.external))
		} else {
			share(mapNoEndpointNodePorts, key, text, gotoChain(chainReject))
		}
	}

	// loadBalancerSourceRanges: a firewall chain, checked before DNAT,
	// that lets the allowed sources through and drops the rest.
	lbIPs := slices.DeleteFunc(slices.Clone(sp.LoadBalancerIPs), func(a netip.Addr) bool { return !f.has(a) })
	ranges := slices.DeleteFunc(slices.Clone(sp.LoadBalancerSourceRanges), func(p netip.Prefix) bool { return !f.has(p.Addr()) })
	if len(lbIPs) > 0 && len(ranges) > 0 {
		fw := &chain{name: n.firewall}
		nodeInRange := false
		for _, p := range ranges {
			fw.rules = append(fw.rules, r().addrIn("saddr", false, p).ret().build())
			nodeInRange = nodeInRange || slices.ContainsFunc(rc.nodeIPs, p.Contains)
		}
		if nodeInRange {
			// A load balancer that delivers its VIP locally makes this
			// node's own requests to the VIP arrive from the VIP.
			for _, ip := range lbIPs {
				fw.rules = append(fw.rules, r().addrIs("saddr", false, ip).ret().build())
			}
		}
		fw.rules = append(fw.rules, r().drop().build())
		objs.chains = append(objs.chains, fw)
		for _, ip := range lbIPs {
			key, text := addrKey(ip)
			share(mapFirewallIPs, key, text, gotoChain(n.firewall))
		}
	}

	if hasEndpoints && external {
		objs.chains = append(objs.chains, externalChain(f, sp, n, rc, len(local) > 0))
	}

	// The endpoint-choosing chains, with their maps, and the endpoints.
	var endpoints []model.Endpoint
	if usesCluster {
		objs.addPolicyChain(f, sp, n, n.service, n.serviceMap, cluster, internalChain == n.service, rc)
		endpoints = append(endpoints, cluster...)
	}
	if usesLocal {
		objs.addPolicyChain(f, sp, n, n.local, n.localMap, local, internalChain == n.local, rc)
		endpoints = append(endpoints, local...)
	}
	seen := map[string]bool{}
	for _, ep := range endpoints {
		chainName, affinity := endpointNames(n.base, ep)
		if seen[chainName] {
			continue
		}
		seen[chainName] = true
		c := &chain{name: chainName, rules: []rule{
			// Hairpin: an endpoint reaching its own service must see the
			// reply come from the node, not from itself.
			r().addrIs("saddr", false, ep.IP).jump(chainMarkMasq).build(),
		}}
		if sp.AffinityTimeout > 0 {
			c.rules = append(c.rules, r().updateSaddr(affinity).build())
			objs.sets = append(objs.sets, &set{name: affinity, keyType: f.addrType, keyText: f.addrType.Name, timeout: sp.AffinityTimeout})
		}
		c.rules = append(c.rules, r().dnat(sp.Protocol, ep.IP, ep.Port).build())
		objs.chains = append(objs.chains, c)
		objs.endpoints++
	}
	slices.SortFunc(objs.chains, func(a, b *chain) int { return cmp.Compare(a.name, b.name) })
	slices.SortFunc(objs.sets, func(a, b *set) int { return cmp.Compare(a.name, b.name) })
	return objs
}

// externalChain is where traffic to the node port, external IPs and
// load-balancer IPs goes before choosing an endpoint.
func externalChain(f *family, sp *model.ServicePort, n servicePortNames, rc renderConfig, hasLocal bool) *chain {
	r := func() *ruleBuilder { return newRule(f) }
	c := &chain{name: n.external}
	if !sp.ExternalPolicyLocal {
		// The endpoint may be on another node: masquerade so that the
		// reply comes back through this one.
		c.rules = append(c.rules, r().jump(chainMarkMasq).build(), r().goTo(n.service).build())
		return c
	}
	// externalTrafficPolicy Local keeps the client's address and uses this
	// node's endpoints only. Pods and the node itself are not "external":
	// they go to any endpoint, as if they had gone out to the load
	// balancer and come back in.
	if len(rc.clusterCIDRs) > 0 {
		c.rules = append(c.rules, r().addrInSet("saddr", false, setClusterCIDRs).goTo(n.service).build())
	}
	c.rules = append(c.rules,
		// The node's own address is a local one: the reply must come back
		// to the node, so masquerade.
		r().fibLocal("saddr").jump(chainMarkMasq).build(),
		r().fibLocal("saddr").goTo(n.service).build())
	if hasLocal {
		c.rules = append(c.rules, r().goTo(n.local).build())
	} else {
		// No endpoint here: drop, so that the load balancer's health check
		// (which fails too) moves traffic to nodes that have one.
		c.rules = append(c.rules, r().drop().build())
	}
	return c
}

// addPolicyChain adds a chain choosing one of eps at random (after
// ClientIP affinity, if any), and its numgen map.
func (objs *portObjects) addPolicyChain(f *family, sp *model.ServicePort, n servicePortNames, name, mapName string,
	eps []model.Endpoint, internal bool, rc renderConfig) {
	r := func() *ruleBuilder { return newRule(f) }
	c := &chain{name: name}
	if internal && f.has(sp.ClusterIP) {
		switch {
		case rc.masqueradeAll:
			c.rules = append(c.rules, r().addrIs("daddr", false, sp.ClusterIP).jump(chainMarkMasq).build())
		case len(rc.clusterCIDRs) > 0:
			// A client outside the pod networks (routed to the service
			// range through this node) must get its replies through
			// this node too.
			c.rules = append(c.rules, r().addrIs("daddr", false, sp.ClusterIP).
				addrInSet("saddr", true, setClusterCIDRs).jump(chainMarkMasq).build())
		}
	}
	m := &set{name: mapName, keyType: nftables.TypeInteger, keyText: "integer", verdictMap: true, hostOrderKey: true}
	for i, ep := range eps {
		epChain, affinity := endpointNames(n.base, ep)
		if sp.AffinityTimeout > 0 {
			c.rules = append(c.rules, r().addrInSet("saddr", false, affinity).goTo(epChain).build())
		}
		m.elems = append(m.elems, element{key: binaryutil.NativeEndian.PutUint32(uint32(i)), text: itoa(int32(i)), verdict: gotoChain(epChain)})
	}
	c.rules = append(c.rules, r().numgenVmap(len(eps), mapName).build())
	objs.chains = append(objs.chains, c)
	objs.sets = append(objs.sets, m)
}
